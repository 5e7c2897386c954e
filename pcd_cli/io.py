"""Streaming input (JSONL, CSV, Parquet) and output (Parquet, errors JSONL, trace JSONL).

Inputs are read in batches with pyarrow / orjson, so memory does not grow with file size.
Every input row ends up either as a ``Record`` or as a ``RecordFailure`` naming the row and
the problem. The Parquet output is written row group by row group into a temporary file in
the target folder and renamed over the target at the end (atomic on POSIX).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from string import Formatter
from typing import Iterator

import orjson
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from .decode import Record, RecordFailure, RecordResult
from .errors import InputError
from .schema import Schema

FORMATS = ("jsonl", "csv", "parquet")
EXTENSIONS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv", ".parquet": "parquet",
              ".pq": "parquet"}


@dataclass(frozen=True)
class InputSpec:
    """How rows become records.

    Attributes:
        text_field: column holding the text (ignored when ``template`` is set).
        template: ``str.format`` template over columns, e.g. ``'Subject: {subject}\\n\\n{body}'``;
            the escapes ``\\n`` and ``\\t`` typed literally on a command line are honoured.
        id_field: column holding the record id; ``None`` numbers rows from 0.
        limit: stop after this many rows (``None``: all).
    """

    text_field: str = "text"
    template: str | None = None
    id_field: str | None = None
    limit: int | None = None

    def __post_init__(self) -> None:
        if self.template is None:
            return
        try:
            names = [name for _, name, _, _ in Formatter().parse(self.template) if name is not None]
        except ValueError as exc:
            raise InputError(f"--template {self.template!r}: {exc}") from exc
        bad = [n for n in names if not n or n.isdigit()]
        if bad or not names:
            raise InputError(f"--template {self.template!r}: name the columns in braces, e.g. "
                             "'Subject: {subject}\\n\\n{body}'")

    def columns_needed(self) -> list[str]:
        if self.template is not None:
            cols = [name for _, name, _, _ in Formatter().parse(self.template) if name]
        else:
            cols = [self.text_field]
        return cols + ([self.id_field] if self.id_field else [])


def detect_format(path: Path, fmt: str | None) -> str:
    """The input format: ``fmt`` if given, else from the extension.

    Raises:
        InputError: unknown format or extension.
    """
    if fmt:
        if fmt not in FORMATS:
            raise InputError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
        return fmt
    found = EXTENSIONS.get(path.suffix.lower())
    if found is None:
        raise InputError(f"{str(path)!r}: cannot tell the format from the extension {path.suffix!r}; "
                         f"pass --format ({'|'.join(FORMATS)})")
    return found


def _unescape(template: str) -> str:
    return template.replace("\\n", "\n").replace("\\t", "\t")


def _row_to_record(row: dict, index: int, spec: InputSpec) -> Record | RecordFailure:
    rid: object = index
    if spec.id_field:
        rid = row.get(spec.id_field)
        if rid is None or rid == "":
            return RecordFailure(index, f"row {index}: id column {spec.id_field!r} is missing or empty")
        rid = str(rid)
    try:
        if spec.template is not None:
            missing = [c for c in spec.columns_needed() if c != spec.id_field and row.get(c) is None]
            if missing:
                return RecordFailure(rid, f"record {rid!r}: template column {missing[0]!r} is missing or null")
            text = _unescape(spec.template).format_map(row)
        else:
            value = row.get(spec.text_field)
            if value is None:
                return RecordFailure(rid, f"record {rid!r}: text field {spec.text_field!r} is missing or null")
            text = value if isinstance(value, str) else str(value)
    except (KeyError, IndexError, ValueError) as exc:
        return RecordFailure(rid, f"record {rid!r}: template cannot be filled ({exc})")
    text = text.strip()
    if not text:
        return RecordFailure(rid, f"record {rid!r}: the text is empty")
    return Record(rid, text)


def read_records(path: str | Path, spec: InputSpec, *, fmt: str | None = None,
                 batch_size: int = 256) -> Iterator[list[Record | RecordFailure]]:
    """Stream ``path`` as batches of records (or failures for unusable rows).

    Raises:
        InputError: missing file, unknown format, unreadable file, or (CSV/Parquet) a needed
            column absent from the file.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{str(path)!r}: no such input file")
    kind = detect_format(path, fmt)
    rows = {"jsonl": _jsonl_rows, "csv": _csv_rows, "parquet": _parquet_rows}[kind](path, spec, batch_size)
    batch: list[Record | RecordFailure] = []
    for index, row in enumerate(rows):
        if spec.limit is not None and index >= spec.limit:
            break
        batch.append(row if isinstance(row, RecordFailure) else _row_to_record(row, index, spec))
        if len(batch) >= batch_size:
            yield batch
            batch = []
    if batch:
        yield batch


def _jsonl_rows(path: Path, spec: InputSpec, batch_size: int) -> Iterator[dict | RecordFailure]:
    with path.open("rb") as fh:
        index = 0
        for number, line in enumerate(fh):
            if number == 0 and line.startswith(b"\xef\xbb\xbf"):
                line = line[3:]  # a UTF-8 byte order mark, as Windows tools write
            if not line.strip():
                continue
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                yield RecordFailure(index, f"row {index}: not valid JSON ({exc})")
            else:
                if isinstance(row, dict):
                    yield row
                else:
                    yield RecordFailure(index, f"row {index}: expected a JSON object, got {type(row).__name__}")
            index += 1


def _check_columns(path: Path, names: list[str], spec: InputSpec) -> None:
    missing = [c for c in spec.columns_needed() if c not in names]
    if missing:
        raise InputError(f"{str(path)!r}: no column {missing[0]!r} (columns: {', '.join(names)}); "
                         "see --text-field, --template and --id-field")


def _csv_rows(path: Path, spec: InputSpec, batch_size: int) -> Iterator[dict]:
    read = pacsv.ReadOptions(block_size=1 << 20)
    parse = pacsv.ParseOptions(newlines_in_values=True)
    try:
        names = pacsv.open_csv(path, read_options=read, parse_options=parse).schema.names
    except pa.ArrowInvalid as exc:
        raise InputError(f"{str(path)!r}: not a readable CSV file ({exc})") from exc
    _check_columns(path, names, spec)
    # Only the needed columns, all read as strings: ids like "007" and texts like "1.50" stay
    # exact, and no column's type can be guessed from one block and contradicted by a later one.
    columns = list(dict.fromkeys(spec.columns_needed()))
    convert = pacsv.ConvertOptions(include_columns=columns, column_types={c: pa.string() for c in columns},
                                   strings_can_be_null=False)
    try:
        for batch in pacsv.open_csv(path, read_options=read, parse_options=parse, convert_options=convert):
            yield from batch.to_pylist()
    except pa.ArrowInvalid as exc:
        raise InputError(f"{str(path)!r}: not a readable CSV file ({exc})") from exc


def _parquet_rows(path: Path, spec: InputSpec, batch_size: int) -> Iterator[dict]:
    try:
        pfile = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(f"{str(path)!r}: not a readable Parquet file ({exc})") from exc
    _check_columns(path, pfile.schema_arrow.names, spec)
    columns = list(dict.fromkeys(spec.columns_needed()))
    for batch in pfile.iter_batches(batch_size=batch_size, columns=columns):
        yield from batch.to_pylist()


def output_schema(schema: Schema, id_column: str, id_type: pa.DataType, *, all_probs: bool,
                  metadata: dict[str, str]) -> pa.Schema:
    """Arrow schema of the output: id, then per field ``<f>``, ``<f>__prob``, ``<f>__mass`` (and ``<f>__probs``)."""
    cols = [pa.field(id_column, id_type)]
    for f in schema.fields:
        cols.append(pa.field(f.name, pa.bool_() if f.is_boolean else pa.string()))
        cols.append(pa.field(f"{f.name}__prob", pa.float32()))
        cols.append(pa.field(f"{f.name}__mass", pa.float32()))
        if all_probs:
            cols.append(pa.field(f"{f.name}__probs", pa.map_(pa.string(), pa.float32())))
    return pa.schema(cols, metadata={k.encode(): v.encode() for k, v in metadata.items()})


class ParquetSink:
    """Writes results row group by row group; ``close()`` renames the finished file into place.

    Args:
        path: final output path. id_column / id_type: the id column's name and arrow type.
        all_probs: add ``<field>__probs`` map columns. metadata: key-value metadata.
    """

    def __init__(self, path: str | Path, schema: Schema, *, id_column: str, id_type: pa.DataType,
                 all_probs: bool, metadata: dict[str, str]):
        self.path = Path(path)
        self.schema = schema
        self.all_probs = all_probs
        self.arrow_schema = output_schema(schema, id_column, id_type, all_probs=all_probs, metadata=metadata)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(f"-o {str(self.path)!r}: cannot create its folder ({exc.strerror})") from exc
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        os.close(fd)
        self._tmp = Path(tmp)
        self._writer = pq.ParquetWriter(self._tmp, self.arrow_schema)
        self.rows = 0

    def write(self, results: list[RecordResult]) -> None:
        if not results:
            return
        data: dict[str, list] = {self.arrow_schema.names[0]: [r.id for r in results]}
        for i, f in enumerate(self.schema.fields):
            data[f.name] = [r.fields[i].value for r in results]
            data[f"{f.name}__prob"] = [r.fields[i].prob for r in results]
            data[f"{f.name}__mass"] = [r.fields[i].mass for r in results]
            if self.all_probs:
                data[f"{f.name}__probs"] = [list(zip(f.labels, r.fields[i].probs)) for r in results]
        self._writer.write_table(pa.Table.from_pydict(data, schema=self.arrow_schema))
        self.rows += len(results)

    def close(self) -> None:
        self._writer.close()
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(self._tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the output a normal file's mode
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        try:
            self._writer.close()
        finally:
            self._tmp.unlink(missing_ok=True)


class JsonlSink:
    """Appends one JSON object per line (orjson; strict JSON, no NaN/Infinity); opened lazily."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._fh = None
        self.rows = 0

    def write(self, obj: dict) -> None:
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = self.path.open("wb")
        self._fh.write(orjson.dumps(obj, default=str) + b"\n")
        self.rows += 1

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
