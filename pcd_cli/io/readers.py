"""Streaming input (JSONL, CSV, Parquet; plain, gzip or zstd; a file or standard input) and
output (Parquet).

Inputs are read row by row (orjson for JSONL, the standard ``csv`` module, pyarrow for
Parquet), so memory does not grow with file size; compressed inputs are decompressed as
they stream, never unpacked to disk. Every input row ends up either as a ``Record`` or as a
``RecordFailure`` naming its line or row and the problem. ``RecordReader`` keeps a running
SHA-256 of the raw bytes of the rows it has read, so that a resumed run can check that the
rows it reads past are those an earlier run labelled. The Parquet output is written row
group by row group into a temporary file in the target folder and renamed over the target
at the end (atomic on POSIX).
"""

from __future__ import annotations

import bisect
import csv
import hashlib
import io
import itertools
import sys
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from string import Formatter
from typing import BinaryIO, Iterator

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import InputError
from ..results import Record, RecordFailure
from ..schema.model import unescape_template
from .storage import FileList, StoreFile, is_remote, list_files
from .values import CellError, cell_text

FORMATS = ("jsonl", "csv", "parquet")
#: Compressions read as streams: name -> the magic bytes a stream of it starts with.
COMPRESSIONS = {"gz": b"\x1f\x8b", "zst": b"\x28\xb5\x2f\xfd"}
#: Everything ``--format`` accepts: a format, or a text format with its compression.
FORMAT_CHOICES = FORMATS + tuple(f"{f}.{c}" for f in ("jsonl", "csv") for c in COMPRESSIONS)
EXTENSIONS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv", ".parquet": "parquet",
              ".pq": "parquet"}
#: The input path that means standard input.
STDIN = "-"


#: ``--encoding-errors``: what a JSONL or CSV row's bytes that are not UTF-8 do (``InputSpec``).
ENCODING_ERRORS = ("strict", "replace")


class ReplacedRow(dict):
    """A row read with ``--encoding-errors replace`` whose bytes that are not UTF-8 were read as
    U+FFFD (the replacement character): a ``dict`` of its columns, marked by its type."""


@dataclass(frozen=True)
class InputSpec:
    """How rows become records.

    Attributes:
        text_field: column holding the text (ignored when ``template`` is set).
        template: ``str.format`` template over columns, e.g. ``'Subject: {subject}\\n\\n{body}'``;
            the escapes ``\\n`` and ``\\t`` typed literally on a command line are honoured.
        id_field: column holding the record id; ``None`` numbers rows from 0.
        limit: stop after this many rows (``None``: all).
        csv_delimiter: the CSV field separator, one character (``\\t`` typed literally means tab).
        partition: columns whose values come from the file's hive partition folders (``key=value``
            in its path: ``pcd_cli.io.storage.partition_values``), not from the file itself; set
            per file by ``RecordReader``.
        encoding_errors: ``strict`` (a JSONL or CSV row with bytes that are not UTF-8 fails
            alone, naming its line) or ``replace`` (each such byte is read as U+FFFD and the row
            is marked: ``ReplacedRow``, counted by ``RecordReader.replaced``).
    """

    text_field: str = "text"
    template: str | None = None
    id_field: str | None = None
    limit: int | None = None
    csv_delimiter: str = ","
    partition: tuple[str, ...] = ()
    encoding_errors: str = "strict"

    def __post_init__(self) -> None:
        if self.encoding_errors not in ENCODING_ERRORS:
            raise InputError(f"--encoding-errors {self.encoding_errors!r}: expected one of {', '.join(ENCODING_ERRORS)}")
        delimiter = unescape_template(self.csv_delimiter)
        if len(delimiter) != 1 or delimiter in "\"\r\n":
            raise InputError(f"--csv-delimiter {self.csv_delimiter!r}: give one character other than a quote "
                             "or a line break, e.g. ';' or '\\t'")
        object.__setattr__(self, "csv_delimiter", delimiter)
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


def is_stdin(path: str | Path) -> bool:
    """Whether ``path`` is ``-`` (standard input)."""
    return str(path) == STDIN


def input_kind(path: str | Path, fmt: str | None) -> tuple[str, str | None]:
    """``(format, compression)`` of an input: from ``fmt`` if given (``csv``, ``jsonl.gz`` ...),
    else from the file name (``x.csv.zst`` -> ``('csv', 'zst')``). Standard input needs ``fmt``.

    Raises:
        InputError: unknown format or extension; standard input without ``--format``.
    """
    if fmt:
        if fmt not in FORMAT_CHOICES:
            raise InputError(f"--format {fmt!r}: expected one of {', '.join(FORMAT_CHOICES)}")
        base, _, compression = fmt.partition(".")
        return base, compression or None
    if is_stdin(path):
        raise InputError(f"reading standard input needs --format ({'|'.join(FORMAT_CHOICES)})")
    shown = str(path)  # a local path or a URI (``StoreFile``), as messages name it
    path = Path(shown)
    compression = path.suffix.lower().lstrip(".")
    stem = path
    if compression in COMPRESSIONS:
        stem = path.with_suffix("")
    else:
        compression = None
    found = EXTENSIONS.get(stem.suffix.lower())
    if found is None or (compression and found == "parquet"):
        what = "".join(path.suffixes[-2:]) if compression else path.suffix
        raise InputError(f"{shown!r}: cannot tell the format from the extension {what!r}; "
                         f"pass --format ({'|'.join(FORMAT_CHOICES)})")
    return found, compression


def input_files(path: str | Path, fmt: str | None, *, option: str = "INPUT") -> tuple[FileList, list[tuple[str, str | None]]]:
    """The files of an input that is not standard input: a file, a folder, a glob, or a URI of
    any of them (``pcd_cli.io.storage.list_files``: one order for every engine; in a folder or a
    glob, files with a known extension, or every file with ``fmt``), and each file's
    ``(format, compression)`` (``input_kind``).

    Raises:
        InputError: nothing there, an empty folder, a store problem (one line with the fix), an
            unknown extension, or files of several formats.
    """
    files = list_files(path, extensions=None if fmt else tuple(EXTENSIONS) + tuple(
        f"{e}.{c}" for e in EXTENSIONS for c in COMPRESSIONS), option=option)
    kinds = [input_kind(files.name(i), fmt) for i in range(len(files.files))]
    differ = next((i for i, k in enumerate(kinds) if k[0] != kinds[0][0]), None)
    if differ is not None:
        raise InputError(f"{str(path)!r} mixes formats: {files.name(0)!r} is {kinds[0][0]}, {files.name(differ)!r} "
                         f"is {kinds[differ][0]}; label them separately")
    return files, kinds


def file_spec(spec: InputSpec, files: FileList, index: int) -> InputSpec:
    """``spec`` for file ``index`` of ``files``: its partition columns marked (``InputSpec.partition``)."""
    partition = files.partitions[index] if files.partitions else {}
    return replace(spec, partition=tuple(partition)) if partition else spec


def detect_format(path: str | Path, fmt: str | None) -> str:
    """The input format (``jsonl``, ``csv`` or ``parquet``; see ``input_kind``).

    Raises:
        InputError: unknown format or extension.
    """
    return input_kind(path, fmt)[0]


def _row_to_record(row: dict, index: int, line: int | None, spec: InputSpec) -> Record | RecordFailure:
    where = f"row {index}" if line is None else f"line {line}"
    rid: object = index
    if spec.id_field:
        rid = row.get(spec.id_field)
        if rid is None or rid == "":
            return RecordFailure(None, f"{where}: id column {spec.id_field!r} is missing or empty", index, line)
        try:
            rid = cell_text(rid, f"id column {spec.id_field!r}")
        except CellError as exc:
            return RecordFailure(None, f"{where}: {exc}", index, line)
    try:
        if spec.template is not None:
            needed = spec.columns_needed()
            missing = [c for c in needed if c != spec.id_field and row.get(c) is None]
            if missing:
                return RecordFailure(rid, f"{where}: template column {missing[0]!r} is missing or null", index, line)
            values = {k: cell_text(v, f"template column {k!r}") for k, v in row.items() if k in needed}
            if not any(v.strip() for k, v in values.items() if k != spec.id_field):
                return RecordFailure(rid, f"{where}: the template's columns are all empty", index, line)
            text = unescape_template(spec.template).format_map(values)
        else:
            value = row.get(spec.text_field)
            if value is None:
                return RecordFailure(rid, f"{where}: text field {spec.text_field!r} is missing or null", index, line)
            text = cell_text(value, f"text field {spec.text_field!r}")
    except CellError as exc:
        message = str(exc)
        if message.endswith("not valid UTF-8"):
            message = "the text has bytes that are not valid UTF-8"
        return RecordFailure(rid, f"{where}: {message}", index, line)
    except (KeyError, IndexError, ValueError) as exc:
        return RecordFailure(rid, f"{where}: template cannot be filled ({exc})", index, line)
    text = text.strip()
    if not text:
        return RecordFailure(rid, f"{where}: the text is empty", index, line)
    return Record(rid, text, index, line)


#: A raw row: (1-based start line or None, the row's columns or the reason it is unusable,
#: the raw bytes read for it since the previous row: blank lines and a CSV header included).
RawRow = tuple[int | None, "dict | str", bytes]


class RecordReader:
    """One input, read as batches of records (or failures for unusable rows), in input order.

    Every row becomes exactly one item, numbered from 0 (``Record.row``); blank lines are
    not rows. A row that cannot be used (malformed JSON, a CSV row with the wrong number of
    fields, a missing or empty text, a text that is a list or an object, bytes that are not
    UTF-8) becomes a ``RecordFailure`` naming its line (JSONL, CSV) or row (Parquet) and
    the problem; reading goes on.

    ``digest`` is the SHA-256 (hex) of the raw bytes of the rows read so far: for JSONL and
    CSV the decompressed bytes from the start of the input to the end of the last row read
    (a CSV's byte order mark excepted), for Parquet the rows' needed columns as JSON.

    A folder, a glob or a URI is read file by file in the order of ``input_files`` (the Ray
    engine's order), as one input: rows numbered across the files, each file's lines its own
    (``file_at`` names a row's file); a file's hive partition values (``key=value`` folders) are
    columns of its rows, usable in ``--template``, ``--text-field`` and ``--id-field`` (a file
    that has such a column itself is refused, naming it). With partitions, ``digest`` also
    covers each row's partition values.

    Args:
        path: a file, a folder, a glob, a URI of any of them (``s3://``, ``gs://``, ``file://``:
            ``pcd_cli.io.storage``), or ``-`` for standard input (then ``fmt`` is required).
        fmt: format (``jsonl``, ``csv``, ``parquet``, ``jsonl.gz`` ...; default: from the name).
        batch_size: items per batch.

    Raises:
        InputError: the input as a whole cannot be used: missing, unknown format, not
            Parquet, or (CSV/Parquet) a needed column absent from the header; a store that
            refuses or cannot be reached (one line naming the URI and the fix). Raised when
            the reader is made (missing file, format) or on the first read (columns).
            ``StoreError``, the store's failure, is exit 2 before the run and exit 5 ("rerun with
            --resume") once an engine has started it (``pcd_cli.io.storage.run_started``).
    """

    def __init__(self, path: str | Path, spec: InputSpec, *, fmt: str | None = None, batch_size: int = 256,
                 keep_digests: int | None = None):
        self.files: FileList | None = None
        self.file_starts: list[int] = []  # the first row of each file of ``files``
        if is_stdin(path):
            self.path = path
            self.kind, self.compression = input_kind(path, fmt)
        else:
            self.path = path if is_remote(path) else Path(path)
            self.files, self._kinds = input_files(path, fmt)
            self.kind, self.compression = self._kinds[0]
        if self.kind == "parquet" and is_stdin(path):
            raise InputError("Parquet cannot be read from standard input (it is read from its end); "
                             "write it to a file and pass the file")
        self.spec = spec
        self.batch_size = batch_size
        self.rows_read = 0
        self._hash = hashlib.sha256()
        self._rows = self._open()
        self._replay: list[RawRow] = []  # rows read past that are read again (``skip(replay=...)``)
        #: rows whose bytes that are not UTF-8 were replaced (``--encoding-errors replace``): how
        #: many, and the first few lines (row numbers for Parquet), counted when first read
        self.replaced = ReplacedRows()
        self._marks: dict[int, str] = {}  # digest after each of the last rows read
        #: how many of the last rows read ``digest_after`` can name (default: two batches)
        self.keep_digests = keep_digests if keep_digests is not None else 2 * batch_size

    @property
    def digest(self) -> str:
        """SHA-256 (hex) of the raw bytes of the rows read so far."""
        return self._hash.hexdigest()

    def _open(self) -> Iterator[RawRow]:
        if self.files is None:
            return ROW_READERS[self.kind](self.path, self.spec, self.compression)
        return self._file_rows()

    def _file_rows(self) -> Iterator[RawRow]:
        """The raw rows of every file in turn, their partition values added (``file_starts`` kept)."""
        files, count = self.files, 0
        self.file_starts = []
        needed = set(self.spec.columns_needed())
        for index, (kind, compression) in enumerate(self._kinds):
            self.file_starts.append(count)
            partition = files.partitions[index] if files.partitions else {}
            rows = ROW_READERS[kind](files.source(index), file_spec(self.spec, files, index), compression)
            tag = orjson.dumps(partition) if partition else b""
            try:
                for line, row, raw in rows:
                    if partition and isinstance(row, dict):
                        clash = next((k for k in partition if k in row and k in needed), None)
                        if clash is not None:
                            row = (f"key {clash!r} is also the partition folder {clash}={partition[clash]} of "
                                   f"{files.name(index)!r}; rename one (a name given twice is never resolved silently)")
                        else:
                            row = (ReplacedRow if isinstance(row, ReplacedRow) else dict)(row | partition)
                    count += 1
                    yield line, row, raw + tag
            finally:
                rows.close()

    def file_at(self, row: int) -> str | None:
        """The file (path or URI, as named in messages) that row ``row`` came from, when the input
        is several files; ``None`` for one file or standard input."""
        if self.files is None or len(self.files.files) < 2 or not self.file_starts:
            return None
        return self.files.name(bisect.bisect_right(self.file_starts, row) - 1)

    def digest_after(self, rows: int) -> str:
        """SHA-256 (hex) of the raw bytes of the first ``rows`` rows, for ``rows`` among the last
        ``keep_digests`` read (default two batches; a consumer that holds rows back longer, as
        ``pcd label``'s open group of rows to decode does, asks for more).

        Raises:
            ValueError: ``rows`` is not among them.
        """
        if rows not in self._marks:
            raise ValueError(f"no digest kept after row {rows} (rows read: {self.rows_read})")
        return self._marks[rows]

    def _next_raw(self) -> RawRow | None:
        if self.spec.limit is not None and self.rows_read >= self.spec.limit:
            return None
        if self._replay:  # already hashed when read past
            self.rows_read += 1
            return self._replay.pop(0)
        raw = next(self._rows, None)
        if raw is not None:
            if isinstance(raw[1], ReplacedRow):
                self.replaced.add(self.rows_read if raw[0] is None else raw[0], self.file_at(self.rows_read))
            self._hash.update(raw[2])
            self.rows_read += 1
            self._marks[self.rows_read] = self._hash.hexdigest()
            self._marks.pop(self.rows_read - self.keep_digests - 1, None)
        return raw

    def skip(self, rows: int, digest: str | None = None, *, replay: int = 0) -> str | None:
        """Read past the first ``rows`` rows (resuming); check them against ``digest`` if given.

        Args:
            replay: when they match, the last ``replay`` of them are read again (the job
                re-decodes the committed part of the chunk in flight, so that chunks keep
                their place counted from row 0).

        Returns:
            ``None`` when they match (or ``digest`` is ``None``): reading goes on after them
            (less ``replay``). Otherwise the reason they do not, and the reader is back at
            row 0 (a file is opened again; standard input replays the rows read past, held
            in memory).
        """
        kept: list[RawRow] | None = [] if is_stdin(self.path) else None
        tail: list[RawRow] = []
        reason = None
        while self.rows_read < rows:
            raw = self._next_raw()
            if raw is None:
                reason = f"the input now has {self.rows_read} rows, fewer than the {rows} rows done"
                break
            if kept is not None:
                kept.append(raw)
            if replay:
                tail = (tail + [raw])[-replay:]
        if reason is None and (digest is None or self.digest == digest):
            if replay:
                self._replay = tail
                self.rows_read -= len(tail)
            return None
        if reason is None:
            reason = f"the input's first {rows} rows are not those the unfinished run labelled (their content changed)"
        self._hash, self.rows_read, self.replaced = hashlib.sha256(), 0, ReplacedRows()
        if kept is None:
            self.close()
            self._rows = self._open()
        else:
            self._rows = itertools.chain(kept, self._rows)
        return reason

    def __iter__(self) -> Iterator[list[Record | RecordFailure]]:
        batch: list[Record | RecordFailure] = []
        while True:
            index = self.rows_read
            raw = self._next_raw()
            if raw is None:
                break
            line, row, _ = raw
            if isinstance(row, str):
                where = f"row {index}" if line is None else f"line {line}"
                batch.append(RecordFailure(None, f"{where}: {row}", index, line))
            else:
                batch.append(_row_to_record(row, index, line, self.spec))
            if len(batch) >= self.batch_size:
                yield batch
                batch = []
        if batch:
            yield batch

    def close(self) -> None:
        """Close the input (also done when it is read to its end)."""
        close = getattr(self._rows, "close", None)
        if close is not None:
            close()


class ReplacedRows:
    """The rows of one input read with ``--encoding-errors replace`` whose bytes were replaced.

    Attributes:
        count: such rows.
        lines: the first ``keep`` of their lines (1-based; row numbers from 0 where the input has
            no lines), with the file's name when the input is several files.
    """

    def __init__(self, keep: int = 5):
        self.keep, self.count, self.lines = keep, 0, []

    def add(self, line: int, file: str | None = None) -> None:
        """Count one row at ``line`` (of ``file``)."""
        self.count += 1
        if len(self.lines) < self.keep:
            self.lines.append(f"{file}:{line}" if file else line)

    def message(self) -> str:
        """One line for the run's warning."""
        shown = ", ".join(map(str, self.lines)) + (", ..." if self.count > len(self.lines) else "")
        rows = "1 row has" if self.count == 1 else f"{self.count} rows have"
        return (f"{rows} bytes that are not valid UTF-8, read as U+FFFD (--encoding-errors replace): line "
                f"{shown}; fix the export to label their text as written")


def read_records(path: str | Path, spec: InputSpec, *, fmt: str | None = None, batch_size: int = 256,
                 skip: int = 0) -> Iterator[list[Record | RecordFailure]]:
    """Stream ``path`` as batches of records, or failures for unusable rows, in input order
    (a ``RecordReader`` read to its end; see there).

    Args:
        skip: rows already done (resuming): they are read past, not returned.

    Raises:
        InputError: see ``RecordReader``.
    """
    reader = RecordReader(path, spec, fmt=fmt, batch_size=batch_size)
    try:
        reader.skip(skip)
        yield from reader
    finally:
        reader.close()


@contextmanager
def _binary(path: str | Path, compression: str | None) -> Iterator[BinaryIO]:
    """The input's bytes, decompressed as they are read. Standard input is sniffed for gzip
    and zstd magic bytes when ``--format`` names no compression."""
    if is_stdin(path):
        raw, owned = sys.stdin.buffer, None
        if not hasattr(raw, "peek"):  # a stand-in for stdin (tests, embedding): make it peekable
            raw = io.BufferedReader(raw)
        if compression is None:
            head = raw.peek(4)[:4]
            compression = next((c for c, magic in COMPRESSIONS.items() if head.startswith(magic)), None)
    else:
        try:
            raw = owned = path.open_stream() if isinstance(path, StoreFile) else open(path, "rb")
        except OSError as exc:
            raise InputError(f"{str(path)!r}: cannot read it ({exc.strerror})") from exc
    try:
        if compression == "gz":
            import gzip

            yield gzip.GzipFile(fileobj=raw, mode="rb")
        elif compression == "zst":
            try:
                import zstandard
            except ImportError:
                raise InputError("reading .zst input needs the zstandard package: pip install zstandard") from None
            yield io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True),
                                    buffer_size=1 << 16)
        else:
            yield raw
    finally:
        if owned is not None:
            owned.close()


def _damaged(path: str | Path, compression: str | None, exc: Exception) -> InputError:
    if isinstance(path, StoreFile) and isinstance(exc, OSError) and type(exc).__name__ != "BadGzipFile":
        from .storage import store_error

        return store_error(exc, str(path))  # the store failed, not the file: exit 5 once the run started (run_started)
    name = "standard input" if is_stdin(path) else repr(str(path))
    what = {"gz": "gzip", "zst": "zstd"}.get(compression or "", "")
    return InputError(f"{name}: the {what + ' ' if what else ''}stream is damaged or cut short ({exc}); "
                      "the rows before it were read")


def read_table_rows(path: str | Path, spec: InputSpec, *,
                    fmt: str | None = None) -> Iterator[tuple[int | None, "dict | str"]]:
    """Every row of ``path`` as ``(line, columns)`` or ``(line, reason it is unusable)``, all
    columns kept (gold files: the text columns and the label columns together). Compressed
    files are read as by ``RecordReader``.

    Raises:
        InputError: as ``read_records``.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{str(path)!r}: no such file")
    kind, compression = input_kind(path, fmt)
    if kind == "parquet":
        try:
            table = pq.read_table(path)
        except (pa.ArrowInvalid, OSError) as exc:
            raise InputError(f"{str(path)!r}: not a readable Parquet file ({exc})") from exc
        check_frame_columns(path, table.schema.names, spec)
        return ((None, row) for row in table.to_pylist())
    rows = {"jsonl": _jsonl_rows, "csv": _csv_rows}[kind](path, spec, compression)
    return ((line, row) for line, row, _ in rows)


def row_to_record(row: dict, index: int, line: int | None, spec: InputSpec) -> Record | RecordFailure:
    """One raw row as a ``Record`` (text from ``spec``), or a ``RecordFailure`` saying why not."""
    return _row_to_record(row, index, line, spec)


def _jsonl_rows(path: str | Path, spec: InputSpec, compression: str | None = None) -> Iterator[RawRow]:
    carry = b""  # blank lines and a byte order mark, credited to the next row's raw bytes
    with _binary(path, compression) as fh:
        lines = enumerate(fh, start=1)
        while True:
            try:
                number, line = next(lines)
            except StopIteration:
                return
            except (OSError, EOFError, ValueError) as exc:  # gzip.BadGzipFile is an OSError; zstd's ZstdError a ValueError
                raise _damaged(path, compression, exc) from exc
            raw = carry + line
            if number == 1 and line.startswith(b"\xef\xbb\xbf"):
                line = line[3:]  # a UTF-8 byte order mark, as Windows tools write
            if not line.strip(BLANK_BYTES):  # NUL padding (a preallocated file, a crash) is blank too
                carry = raw
                continue
            carry = b""
            hint = "; NUL bytes: UTF-16 text? pcd reads UTF-8" if b"\x00" in line else ""
            replaced = False
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as exc:
                if spec.encoding_errors != "replace":
                    yield number, f"bytes that are not valid UTF-8 (at byte {exc.start}{hint})", raw
                    continue
                line, replaced = line.decode("utf-8", "replace").encode("utf-8"), True
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                row = _loads_non_finite(line)
                if row is None:
                    yield number, f"not valid JSON ({exc}{hint})", raw
                    continue
            if isinstance(row, dict):
                repeated = _repeated_key(line, spec) if len(row) else None
                if repeated:
                    yield number, repeated, raw
                    continue
                yield number, ReplacedRow(row) if replaced else row, raw
            else:
                yield number, f"expected a JSON object, got {type(row).__name__}", raw


def check_input(path: str | Path, spec: InputSpec, fmt: str | None = None) -> bool:
    """Check what can be checked of ``path`` before a model is loaded: its encoding and its
    first row; standard input is left unread (it can be read only once). A folder, glob or URI:
    every one of its files so (its header, a Parquet footer: a part that is not Parquet is
    refused here, naming it).

    Returns:
        Whether the input has a row (``True`` for standard input, which is not read).

    Raises:
        InputError: as ``RecordReader`` does for the whole input: a missing file, an unknown
            format (standard input without ``fmt``), a file that is not Parquet, a
            CSV/Parquet header without a needed column; and a JSONL/CSV file in UTF-16 or
            UTF-32 (``check_encoding``); a store problem (``pcd_cli.io.storage.store_error``).
    """
    if is_stdin(path):
        input_kind(path, fmt)
        return True
    files, kinds = input_files(path, fmt)
    has_rows = False
    for index, (kind, compression) in enumerate(kinds):
        source, spec_i = files.source(index), file_spec(spec, files, index)
        if kind != "parquet":
            check_encoding(source, compression)
        rows = ROW_READERS[kind](source, spec_i, compression)
        try:
            first = next(rows, None)
            if kind == "jsonl" and first is not None:
                check_jsonl_keys(str(source), [first, *itertools.islice(rows, JSONL_HEAD_ROWS - 1)], spec_i)
            has_rows = has_rows or first is not None
        finally:
            rows.close()
    return has_rows


#: JSONL rows ``check_input`` reads before the model loads to find the keys pcd needs.
JSONL_HEAD_ROWS = 100


def check_jsonl_keys(path: str | Path, head: list[RawRow], spec: InputSpec) -> None:
    """Refuse a JSONL input whose first objects (``head``: up to ``JSONL_HEAD_ROWS`` rows, at
    most ``--limit``) never hold a key ``spec`` needs (the text field, the id field, a template
    placeholder): every row would fail after the model loaded, as a CSV or Parquet header without
    the column is refused. A key present in one of them passes (null or missing on some rows is a
    row's failure, written to the errors file); rows that are not JSON objects are not counted.

    Raises:
        InputError: names the file, the missing key, how many rows were read and the keys they have.
    """
    objects = [row for _, row, _ in head[: spec.limit or None] if isinstance(row, dict)]
    if not objects:
        return
    keys = list(dict.fromkeys(k for row in objects for k in row))
    missing = [c for c in spec.columns_needed() if c not in keys and c not in spec.partition]
    if not missing:
        return
    name = missing[0]
    template = spec.template is not None and name in spec.columns_needed()[:-1 if spec.id_field else None]
    role = "template column" if template else "id field" if name == spec.id_field else "text field"
    shown = ", ".join(keys[:20]) + (f", ... ({len(keys)} keys)" if len(keys) > 20 else "")
    within = "its only JSON object" if len(objects) == 1 else f"any of its first {len(objects)} JSON objects"
    raise InputError(f"{str(path)!r}: no key {name!r} (the {role}) in {within} (keys: {shown}"
                     f"{partition_note(spec)}); see --text-field, --template and --id-field")


#: The column ``pcd label`` takes as the record id when ``--id-field`` is not given.
DEFAULT_ID_COLUMN = "id"


def has_id_column(path: str | Path, spec: InputSpec, fmt: str | None = None, *, rows: int = 16) -> bool:
    """Whether the input has a ``DEFAULT_ID_COLUMN`` column: in the CSV header or Parquet schema,
    or as a key of the first JSONL object among the first ``rows`` rows. ``False`` for standard
    input (it can be read only once) and for an input that cannot be read (its reader reports
    that later, in full).
    """
    if is_stdin(path):
        return False
    try:
        files, kinds = input_files(path, fmt)
        if DEFAULT_ID_COLUMN in (files.partitions[0] if files.partitions else {}):
            return True
        kind, compression = kinds[0]
        reader = ROW_READERS[kind](files.source(0), file_spec(spec, files, 0), compression)
        try:
            for _line, row, _raw in itertools.islice(reader, rows):
                if isinstance(row, dict):
                    return DEFAULT_ID_COLUMN in row
        finally:
            reader.close()
    except (InputError, OSError, ValueError):
        return False
    return False


#: Bytes that make a line blank (not a row): whitespace, and NUL padding.
BLANK_BYTES = b" \t\r\n\x00\x0b\x0c"

#: Byte order marks of the encodings pcd does not read, longest first (Unicode 15, section 23.8).
_BOMS = ((b"\xff\xfe\x00\x00", "UTF-32 (little-endian)", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32 (big-endian)", "UTF-32"),
         (b"\xff\xfe", "UTF-16 (little-endian)", "UTF-16"), (b"\xfe\xff", "UTF-16 (big-endian)", "UTF-16"))


def check_encoding(path: str | Path, compression: str | None = None) -> None:
    """Refuse a JSONL/CSV file written in UTF-16 or UTF-32 (Excel's "Unicode text", PowerShell's
    ``>``): every row would fail as undecodable bytes. Found by its byte order mark, or, without
    one, by NUL bytes in every other (or every fourth) byte of its first 4 KiB of text.

    Raises:
        InputError: names the encoding and gives the ``iconv`` line that converts the file.
    """
    with _binary(path, compression) as fh:
        try:
            head = fh.read(4096)
        except (OSError, EOFError, ValueError) as exc:
            raise _damaged(path, compression, exc) from exc
    found = next(((name, codec) for bom, name, codec in _BOMS if head.startswith(bom)), None)
    body = head.rstrip(b"\x00")  # NUL padding after UTF-8 text is blank lines, not an encoding
    if found is None and len(body) >= 16 and 0 in body:
        odd, even, half = body[1::2].count(0), body[0::2].count(0), len(body) // 2
        if body.count(0) >= 0.7 * len(body):
            found = ("UTF-32 without a byte order mark", "UTF-32LE" if body[0] else "UTF-32BE")
        elif odd >= 0.8 * half and even < 0.2 * half:
            found = ("UTF-16 (little-endian) without a byte order mark", "UTF-16LE")
        elif even >= 0.8 * half and odd < 0.2 * half:
            found = ("UTF-16 (big-endian) without a byte order mark", "UTF-16BE")
    if found:
        name, codec = found
        raise InputError(f"{str(path)!r} is {name}; pcd reads UTF-8: convert it first, e.g. "
                         f"iconv -f {codec} -t UTF-8 {path} > converted{Path(str(path)).suffix}")


def check_unique_columns(path: str | Path, names: list[str], where: str) -> None:
    """Refuse a header that names a column twice (csv.DictReader and pyarrow's to_pylist keep
    the last one silently: a joined export's second ``text`` would be labelled instead of the first).

    Raises:
        InputError: names the column and both 1-based positions.
    """
    seen: dict[str, int] = {}
    for i, name in enumerate(names):
        if name == "":
            continue
        if name in seen:
            where_ = "standard input" if is_stdin(path) else repr(str(path))
            raise InputError(f"{where_}: column {name!r} appears twice in the {where} (columns {seen[name] + 1} "
                             f"and {i + 1}); rename one (a name given twice is never resolved silently)")
        seen[name] = i


def _loads_non_finite(line: bytes) -> object | None:
    """A JSON line that is valid but for ``NaN``/``Infinity``/``-Infinity`` literals (Python's
    ``json.dumps`` and pandas write them), read by the standard library as floats; ``None`` if
    it holds none or is invalid anyway. Such values are harmless in columns pcd does not read;
    in the text, a template column or the id, ``cell_text`` fails the row naming them."""
    if b"NaN" not in line and b"Infinity" not in line:
        return None
    import json

    try:
        return json.loads(line)
    except ValueError:
        return None


def _repeated_key(line: bytes, spec: InputSpec) -> str | None:
    """The error of a JSONL row whose object repeats a key pcd reads (the text, template or id
    column), else ``None``. orjson keeps the last value silently, so a line that holds a read
    key's name more than once is parsed again, keeping every pair."""
    needed = spec.columns_needed()
    if not any(line.count(orjson.dumps(name)) > 1 for name in needed):
        return None
    import json

    pairs = json.loads(line, object_pairs_hook=lambda p: p)
    if not isinstance(pairs, list):
        return None
    names = [k for k, _ in pairs]
    for name in needed:
        if names.count(name) > 1:
            first = names.index(name)
            second = names.index(name, first + 1)
            return (f"key {name!r} appears twice in the JSON object (keys {first + 1} and {second + 1}); "
                    "a name given twice is never resolved silently: rename one")
    return None


def check_frame_columns(path: str | Path, names: list[str], spec: InputSpec) -> None:
    """Refuse a table read from ``path`` whose columns ``names`` lack one that ``spec`` needs.

    Raises:
        InputError: names the file, the missing column and the columns there are (with a
            ``--csv-delimiter`` hint when the header looks split on another separator).
    """
    name = "standard input" if is_stdin(path) else repr(str(path))
    both = next((c for c in spec.columns_needed() if c in names and c in spec.partition), None)
    if both is not None:
        raise InputError(f"{name}: column {both!r} is in the file and also a partition folder ({both}=...) of its "
                         "path; rename one (a name given twice is never resolved silently)")
    missing = [c for c in spec.columns_needed() if c not in names and c not in spec.partition]
    if not missing:
        return
    hint = ""
    if len(names) == 1:  # one column whose name holds the others: another delimiter
        found = next((d for d in (";", "\t", "|", ",") if d in names[0] and d != spec.csv_delimiter), None)
        if found is not None:
            shown = "\\t" if found == "\t" else found
            hint = (f"; the header is one column made of '{shown}'-separated names: pass "
                    f"--csv-delimiter '{shown}'")
    raise InputError(f"{name}: no column {missing[0]!r} (columns: {', '.join(names)}{partition_note(spec)}){hint}"
                     + ("" if hint else "; see --text-field, --template and --id-field"))


def partition_note(spec: InputSpec) -> str:
    """``; partition columns: date, region`` for a file under hive ``key=value`` folders (the
    columns its path adds, usable in --template and --id-field as its own), else ``""``: said
    wherever a missing column lists the columns found."""
    return f"; partition columns: {', '.join(spec.partition)}" if spec.partition else ""


#: Largest CSV cell accepted (characters); longer texts are cut to the model's context anyway.
CSV_FIELD_LIMIT = 1 << 26


class _Lines:
    """Physical lines of a text stream, numbered from 1, that can be pushed back to be read again.

    ``taken`` holds the lines read since the last ``take()``, for a row's raw bytes.
    """

    def __init__(self, source):
        self._source = iter(source)
        self._back: list[str] = []
        self.number = 0
        self.taken: list[str] = []

    def __iter__(self) -> "_Lines":
        return self

    def __next__(self) -> str:
        line = self._back.pop() if self._back else next(self._source)
        self.number += 1
        self.taken.append(line)
        return line

    def push_back(self, count: int) -> None:
        """Read the last ``count`` taken lines again."""
        if count > 0:
            self._back.extend(reversed(self.taken[-count:]))
            del self.taken[-count:]
            self.number -= count

    def take(self) -> bytes:
        """The raw bytes of the lines taken since the last call (undecodable bytes restored)."""
        taken = self.taken
        raw = (taken[0] if len(taken) == 1 else "".join(taken)).encode("utf-8", "surrogateescape")
        self.taken = []
        return raw


def _csv_rows(path: str | Path, spec: InputSpec, compression: str | None = None) -> Iterator[RawRow]:
    """Rows of a CSV file (RFC 4180, via the standard ``csv`` module) with their start lines.

    Undecodable bytes are kept as lone surrogates (``surrogateescape``) so that one bad row
    fails alone; ``cell_text`` rejects them in the cells that are used. Malformed quoting
    fails the row (``strict``); when a stray quote made it swallow the lines after it, those
    lines are read again from the line after the row's first one, so they are not lost
    (they are held in memory meanwhile: at most the rest of the input, or one CSV cell limit).
    """
    csv.field_size_limit(max(csv.field_size_limit(), CSV_FIELD_LIMIT))
    header: list[str] | None = None
    with _binary(path, compression) as binary:
        text = io.TextIOWrapper(binary, encoding="utf-8-sig", errors="surrogateescape", newline="")
        lines = _Lines(text)
        reader = csv.reader(lines, strict=True, delimiter=spec.csv_delimiter)
        while True:
            start = lines.number + 1
            try:
                values = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                if header is None:
                    raise InputError(f"{str(path)!r}: the CSV header cannot be read ({exc})") from exc
                unclosed = "unexpected end of data" in str(exc)  # CPython's message for EOF inside quotes
                lines.push_back(lines.number - start)  # a bad quote swallowed the lines after the row's first
                yield start, ("a quoted field is never closed" if unclosed else f"not a valid CSV row ({exc})"), \
                    lines.take()
                continue
            except (OSError, EOFError, ValueError) as exc:
                raise _damaged(path, compression, exc) from exc
            if not values or (header is not None and len(header) > 1 and len(values) == 1
                              and not values[0].strip(BLANK_BYTES.decode())):
                continue  # a blank (or NUL-padded) line: its bytes go with the next row
            if header is None:
                try:
                    header = [cell_text(v, "the CSV header").strip() for v in values]
                except CellError:
                    raise InputError(f"{str(path)!r}: the CSV header is not valid UTF-8") from None
                check_unique_columns(path, header, "CSV header")
                check_frame_columns(path, header, spec)
                continue
            if len(values) != len(header):
                n = len(values)
                yield start, f"the CSV row has {n} field{'s' * (n != 1)}; the header has {len(header)}", lines.take()
                continue
            if spec.encoding_errors == "replace" and any(_has_escaped_bytes(v) for v in values):
                yield start, ReplacedRow(zip(header, map(_replaced, values))), lines.take()
                continue
            yield start, dict(zip(header, values)), lines.take()


def _has_escaped_bytes(value: str) -> bool:
    """Whether ``value`` holds bytes that are not UTF-8 (lone surrogates U+DC80-U+DCFF of
    ``surrogateescape``)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _replaced(value: str) -> str:
    """``value`` with each byte that is not UTF-8 (``surrogateescape``) read as U+FFFD, as
    ``bytes.decode("utf-8", "replace")`` reads it."""
    return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _parquet_rows(path: Path, spec: InputSpec, compression: str | None = None) -> Iterator[RawRow]:
    try:
        pfile = pq.ParquetFile(path.open_file() if isinstance(path, StoreFile) else path)
    except (pa.ArrowInvalid, OSError) as exc:
        if isinstance(path, StoreFile) and not isinstance(exc, pa.ArrowInvalid):
            raise _damaged(path, None, exc) from exc
        raise InputError(f"{str(path)!r}: not a readable Parquet file ({exc})") from exc
    check_unique_columns(path, pfile.schema_arrow.names, "Parquet schema")
    check_frame_columns(path, pfile.schema_arrow.names, spec)
    columns = [c for c in dict.fromkeys(spec.columns_needed()) if c not in spec.partition]
    try:
        for batch in pfile.iter_batches(batch_size=1024, columns=columns):
            for row in batch.to_pylist():
                yield None, row, orjson.dumps(row, default=str, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n"
    except (pa.ArrowInvalid, OSError) as exc:
        if isinstance(path, StoreFile) and not isinstance(exc, pa.ArrowInvalid):
            raise _damaged(path, None, exc) from exc
        raise InputError(f"{str(path)!r}: the Parquet file is damaged ({exc})") from exc


#: The row reader of each input kind (``input_kind``).
ROW_READERS = {"jsonl": _jsonl_rows, "csv": _csv_rows, "parquet": _parquet_rows}
