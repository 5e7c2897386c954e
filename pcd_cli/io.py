"""Streaming input (JSONL, CSV, Parquet) and output (Parquet, JSONL).

Inputs are read row by row (orjson for JSONL, the standard ``csv`` module, pyarrow for
Parquet), so memory does not grow with file size. Every input row ends up either as a
``Record`` or as a ``RecordFailure`` naming its line or row and the problem. The Parquet
output is written row group by row group into a temporary file in the target folder and
renamed over the target at the end (atomic on POSIX).
"""

from __future__ import annotations

import csv
import itertools
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from string import Formatter
from typing import Iterator

import orjson
import pyarrow as pa
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


def _utf8(value: object) -> str:
    """A cell as text; bytes (and strings carrying undecodable bytes) must be valid UTF-8."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8")
    text = value if isinstance(value, str) else str(value)
    text.encode("utf-8")  # raises on the lone surrogates that stand for undecodable bytes
    return text


def _row_to_record(row: dict, index: int, line: int | None, spec: InputSpec) -> Record | RecordFailure:
    where = f"row {index}" if line is None else f"line {line}"
    rid: object = index
    if spec.id_field:
        rid = row.get(spec.id_field)
        if rid is None or rid == "":
            return RecordFailure(None, f"{where}: id column {spec.id_field!r} is missing or empty", index, line)
        try:
            rid = _utf8(rid)
        except UnicodeError:
            return RecordFailure(None, f"{where}: the id is not valid UTF-8", index, line)
    try:
        if spec.template is not None:
            missing = [c for c in spec.columns_needed() if c != spec.id_field and row.get(c) is None]
            if missing:
                return RecordFailure(rid, f"{where}: template column {missing[0]!r} is missing or null", index, line)
            values = {k: _utf8(v) for k, v in row.items() if k in spec.columns_needed()}
            if not any(v.strip() for k, v in values.items() if k != spec.id_field):
                return RecordFailure(rid, f"{where}: the template's columns are all empty", index, line)
            text = _unescape(spec.template).format_map(values)
        else:
            value = row.get(spec.text_field)
            if value is None:
                return RecordFailure(rid, f"{where}: text field {spec.text_field!r} is missing or null", index, line)
            text = _utf8(value)
    except UnicodeError:
        return RecordFailure(rid, f"{where}: the text has bytes that are not valid UTF-8", index, line)
    except (KeyError, IndexError, ValueError) as exc:
        return RecordFailure(rid, f"{where}: template cannot be filled ({exc})", index, line)
    text = text.strip()
    if not text:
        return RecordFailure(rid, f"{where}: the text is empty", index, line)
    return Record(rid, text, index, line)


def read_records(path: str | Path, spec: InputSpec, *, fmt: str | None = None, batch_size: int = 256,
                 skip: int = 0) -> Iterator[list[Record | RecordFailure]]:
    """Stream ``path`` as batches of records, or failures for unusable rows, in input order.

    Every row becomes exactly one item, numbered from 0 (``Record.row``); blank lines are not
    rows. A row that cannot be used (malformed JSON, a CSV row with the wrong number of
    fields, a missing or empty text, bytes that are not UTF-8) becomes a ``RecordFailure``
    naming its line (JSONL, CSV) or row (Parquet) and the problem; reading goes on.

    Args:
        skip: rows already done (resuming): they are read past, not returned.

    Raises:
        InputError: the file as a whole cannot be used: missing, unknown format, not
            Parquet, or (CSV/Parquet) a needed column absent from the header.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{str(path)!r}: no such input file")
    kind = detect_format(path, fmt)
    rows = {"jsonl": _jsonl_rows, "csv": _csv_rows, "parquet": _parquet_rows}[kind](path, spec)
    batch: list[Record | RecordFailure] = []
    for index, (line, row) in enumerate(rows):
        if spec.limit is not None and index >= spec.limit:
            break
        if index < skip:
            continue
        if isinstance(row, str):
            where = f"row {index}" if line is None else f"line {line}"
            batch.append(RecordFailure(None, f"{where}: {row}", index, line))
        else:
            batch.append(_row_to_record(row, index, line, spec))
        if len(batch) >= batch_size:
            yield batch
            batch = []
    if batch:
        yield batch


#: A raw row: (1-based start line or None, the row's columns or the reason it is unusable).
RawRow = tuple[int | None, "dict | str"]


def read_table_rows(path: str | Path, spec: InputSpec, *, fmt: str | None = None) -> Iterator[RawRow]:
    """Every row of ``path`` as ``(line, columns)`` or ``(line, reason it is unusable)``, all
    columns kept (gold files: the text columns and the label columns together).

    Raises:
        InputError: as ``read_records``.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{str(path)!r}: no such file")
    kind = detect_format(path, fmt)
    if kind == "parquet":
        try:
            table = pq.read_table(path)
        except (pa.ArrowInvalid, OSError) as exc:
            raise InputError(f"{str(path)!r}: not a readable Parquet file ({exc})") from exc
        _check_columns(path, table.schema.names, spec)
        return ((None, row) for row in table.to_pylist())
    return {"jsonl": _jsonl_rows, "csv": _csv_rows}[kind](path, spec)


def row_to_record(row: dict, index: int, line: int | None, spec: InputSpec) -> Record | RecordFailure:
    """One raw row as a ``Record`` (text from ``spec``), or a ``RecordFailure`` saying why not."""
    return _row_to_record(row, index, line, spec)


def _jsonl_rows(path: Path, spec: InputSpec) -> Iterator[RawRow]:
    with path.open("rb") as fh:
        for number, line in enumerate(fh, start=1):
            if number == 1 and line.startswith(b"\xef\xbb\xbf"):
                line = line[3:]  # a UTF-8 byte order mark, as Windows tools write
            if not line.strip():
                continue
            hint = "; NUL bytes: UTF-16 text? pcd reads UTF-8" if b"\x00" in line else ""
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield number, f"bytes that are not valid UTF-8 (at byte {exc.start}{hint})"
                continue
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                yield number, f"not valid JSON ({exc}{hint})"
                continue
            if isinstance(row, dict):
                yield number, row
            else:
                yield number, f"expected a JSON object, got {type(row).__name__}"


def _check_columns(path: Path, names: list[str], spec: InputSpec) -> None:
    missing = [c for c in spec.columns_needed() if c not in names]
    if missing:
        raise InputError(f"{str(path)!r}: no column {missing[0]!r} (columns: {', '.join(names)}); "
                         "see --text-field, --template and --id-field")


#: Largest CSV cell accepted (characters); longer texts are cut to the model's context anyway.
CSV_FIELD_LIMIT = 1 << 26


def _csv_rows(path: Path, spec: InputSpec) -> Iterator[RawRow]:
    """Rows of a CSV file (RFC 4180, via the standard ``csv`` module, which keeps line numbers).

    Undecodable bytes are kept as lone surrogates (``surrogateescape``) so that one bad row
    fails alone; ``_utf8`` rejects them in the cells that are used. Malformed quoting fails
    the row (``strict``); when a stray quote made it swallow the lines after it, reading
    starts again on the line after the row's first one, so those lines are not lost.
    """
    csv.field_size_limit(max(csv.field_size_limit(), CSV_FIELD_LIMIT))
    header: list[str] | None = None
    skip = 0  # physical lines already read
    while skip is not None:
        with path.open("r", encoding="utf-8-sig", errors="surrogateescape", newline="") as fh:
            reader = csv.reader(itertools.islice(fh, skip, None), strict=True)
            start_at, last, skip = skip, skip, None  # last: line number where the previous row ended
            while True:
                try:
                    values = next(reader)
                except StopIteration:
                    break
                except csv.Error as exc:
                    if header is None:
                        raise InputError(f"{str(path)!r}: the CSV header cannot be read ({exc})") from exc
                    unclosed = "unexpected end of data" in str(exc)  # CPython's message for EOF inside quotes
                    yield last + 1, ("a quoted field is never closed" if unclosed else f"not a valid CSV row ({exc})")
                    if start_at + reader.line_num > last + 1:  # the bad quote swallowed the lines after it
                        skip = last + 1
                        break
                    last += 1
                    continue
                start, last = last + 1, start_at + reader.line_num
                if not values:
                    continue  # a blank line
                if header is None:
                    try:
                        header = [_utf8(v).strip() for v in values]
                    except UnicodeError:
                        raise InputError(f"{str(path)!r}: the CSV header is not valid UTF-8") from None
                    _check_columns(path, header, spec)
                    continue
                if len(values) != len(header):
                    n = len(values)
                    yield start, f"the CSV row has {n} field{'s' * (n != 1)}; the header has {len(header)}"
                    continue
                yield start, dict(zip(header, values))


def _parquet_rows(path: Path, spec: InputSpec) -> Iterator[RawRow]:
    try:
        pfile = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(f"{str(path)!r}: not a readable Parquet file ({exc})") from exc
    _check_columns(path, pfile.schema_arrow.names, spec)
    columns = list(dict.fromkeys(spec.columns_needed()))
    try:
        for batch in pfile.iter_batches(batch_size=1024, columns=columns):
            for row in batch.to_pylist():
                yield None, row
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(f"{str(path)!r}: the Parquet file is damaged ({exc})") from exc


#: Output column marking records whose text was cut to fit the model's context.
TRUNCATED_COLUMN = "__truncated"


def output_schema(schema: Schema, id_column: str, id_type: pa.DataType, *, all_probs: bool,
                  calibrated: bool = False) -> pa.Schema:
    """Arrow schema of the output: id, then per field ``<f>``, ``<f>__prob``, ``<f>__mass``
    (with a calibration, ``<f>__raw_prob``; with ``all_probs``, ``<f>__probs``), then ``__truncated``."""
    cols = [pa.field(id_column, id_type)]
    for f in schema.fields:
        cols.append(pa.field(f.name, pa.bool_() if f.is_boolean else pa.string()))
        cols.append(pa.field(f"{f.name}__prob", pa.float32()))
        cols.append(pa.field(f"{f.name}__mass", pa.float32()))
        if calibrated:
            cols.append(pa.field(f"{f.name}__raw_prob", pa.float32()))
        if all_probs:
            cols.append(pa.field(f"{f.name}__probs", pa.map_(pa.string(), pa.float32())))
    cols.append(pa.field(TRUNCATED_COLUMN, pa.bool_()))
    return pa.schema(cols)


def results_table(results: list[RecordResult], schema: Schema, arrow_schema: pa.Schema) -> pa.Table:
    """Results as a table of ``arrow_schema`` (from ``output_schema``), one row per result."""
    data: dict[str, list] = {arrow_schema.names[0]: [r.id for r in results]}
    all_probs = f"{schema.fields[0].name}__probs" in arrow_schema.names[1:]  # the id column may end in __probs
    calibrated = f"{schema.fields[0].name}__raw_prob" in arrow_schema.names[1:]
    for i, f in enumerate(schema.fields):
        data[f.name] = [r.fields[i].value for r in results]
        data[f"{f.name}__prob"] = [r.fields[i].prob for r in results]
        data[f"{f.name}__mass"] = [r.fields[i].mass for r in results]
        if calibrated:
            data[f"{f.name}__raw_prob"] = [r.fields[i].raw_prob for r in results]
        if all_probs:
            data[f"{f.name}__probs"] = [list(zip(f.labels, r.fields[i].probs)) for r in results]
    data[TRUNCATED_COLUMN] = [r.truncated for r in results]
    return pa.Table.from_pydict(data, schema=arrow_schema)


class ParquetSink:
    """Writes tables row group by row group; ``close()`` renames the finished file into place.

    Args:
        path: final output path. arrow_schema: its columns and key-value metadata.

    Raises:
        InputError: the output's folder cannot be created.
    """

    def __init__(self, path: str | Path, arrow_schema: pa.Schema):
        self.path = Path(path)
        self.arrow_schema = arrow_schema
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(f"-o {str(self.path)!r}: cannot create its folder ({exc.strerror})") from exc
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        os.close(fd)
        self._tmp = Path(tmp)
        self._writer = pq.ParquetWriter(self._tmp, self.arrow_schema)
        self.rows = 0

    def write_table(self, table: pa.Table) -> None:
        if table.num_rows:
            self._writer.write_table(table.replace_schema_metadata(self.arrow_schema.metadata))
            self.rows += table.num_rows

    def close(self) -> None:
        self._writer.close()
        with self._tmp.open("rb") as fh:
            os.fsync(fh.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(self._tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the output a normal file's mode
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        try:
            self._writer.close()
        finally:
            self._tmp.unlink(missing_ok=True)
