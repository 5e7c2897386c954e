"""Where inputs and outputs live: a local path, or an object-storage URI, through ``pyarrow.fs``.

One place turns what a user typed (``data/export.jsonl``, ``exports/``, ``'exports/*.parquet'``,
``file:///srv/exports``, ``s3://bucket/exports/date=2026-12-05/``, ``gs://bucket/x.parquet``,
anything ``pyarrow.fs.FileSystem.from_uri`` resolves) into a ``pyarrow.fs.FileSystem`` and the
paths on it, for every reader and engine:

- ``open_location``: one path or URI as a ``Location`` (file system + path on it). Credentials
  and settings are each cloud's standard ones, read by pyarrow itself (``pcd_cli.io.schemes``
  names them per scheme: ``AWS_*``, Google's application default credentials, an emulator's
  endpoint). A URI's query of settings (``?endpoint_override=host:port&scheme=http``) reaches
  pyarrow as typed (``split_query``); a GCS request is retried for ``schemes.GCS_RETRY_SECONDS``
  unless the URI says. What pcd knows of each scheme (endpoint variables, the credential probes,
  the fix texts) is one row of ``schemes.SCHEMES``; the code here reads the row
  (``scheme_row``), never a scheme's name.
- ``list_files``: a file, a folder (every file below it with a known extension, at any depth),
  or a glob (``*``, ``?``, ``[...]`` within a name, ``**`` for any depth) as a ``FileList``: the
  files in **one deterministic order** (by path, folder by folder: the order of
  ``sorted(pathlib.Path)``), and for each its hive partition values (``key=value`` folder
  names, those of the path given included: ``s3://b/exports/date=2026-12-05/`` gives every row
  ``date = '2026-12-05'``). Names starting with ``.`` or ``_`` (``_SUCCESS``, ``.crc`` files,
  pcd's own work folders) are skipped. Both engines read this list: the local engine in this
  order, the Ray engine numbering rows across files in this order.
- ``open_dataset``: the same list as a ``pyarrow.dataset.Dataset`` with the partition columns
  (strings), for readers of whole tables (``--reuse``).
- ``store_error``: a failure of the store (missing credentials, access denied, unreachable
  endpoint, no such bucket, no such key) as one line naming the URI and the fix: a
  ``StoreError`` (an ``InputError``, exit 2) when met before any work. ``run_started`` marks
  the rest of a run: any store failure raised inside it, wherever it surfaced (reading a later
  part, listing, reading a Parquet footer, the upload at the end), ends as a ``MachineError``
  (exit 5) with "then rerun with --resume" (``RESUME_HINT``), or, on an engine that keeps no
  checkpoints, "then run the command again" (``RERUN_HINT``).

Outputs in object storage (staged locally, uploaded whole or never) are
``pcd_cli.io.publishing``'s.

Local paths and ``file://`` URIs stay ``pathlib`` paths for writing (``pcd_cli.io.files``: atomic
rename, symlinks); ``local_path`` says which is which.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Iterable, Iterator
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.fs as pafs

from ..errors import InputError, MachineError, PcdError, StoreError
from .schemes import BY_NAME, Scheme, scheme_row

#: ``scheme://`` at the start of a URI (two letters at least: ``C:/`` stays a path).
_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+)://")
#: Characters that make a path a glob.
_MAGIC = re.compile(r"[*?\[]")
#: The value Hive writes for a null partition value.
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


#: A name followed by one slash (``s3:/bucket/key``): when the name is a known scheme
#: (``schemes.BY_NAME``), a typo of ``s3://bucket/key``, which would otherwise be read as a local
#: relative path (a folder named ``s3:``).
_ONE_SLASH = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):/(?!/)")


def uri_scheme(path: str | Path) -> str | None:
    """The scheme of a URI (``s3``, ``gs``, ``file`` ...), lower-cased; ``None`` for a plain path.

    Every input, ``--reuse`` and ``-o`` value is classified here (``is_remote``, ``local_path``,
    ``open_location``, ``canonical`` all ask), so a typo'd URI is refused here for all of them.

    Raises:
        InputError: a known scheme with one slash (``s3:/bucket/x``, ``file:/tmp/x``), naming the
            value and the URI meant (``s3://bucket/x``, ``file:///tmp/x``). A local folder really
            named ``s3:`` is reached as ``./s3:/...``.
    """
    text = str(path)
    found = _URI.match(text)
    if found:
        return found.group(1).lower()
    typo = _ONE_SLASH.match(text)
    if typo and typo.group(1).lower() in BY_NAME:
        scheme = typo.group(1)
        rest = text[len(scheme) + 1:]  # from the one slash on
        meant = f"{scheme}://{rest if scheme_row(scheme.lower()).path_uri else rest[1:]}"
        raise InputError(f"{text!r} looks like a URI with one slash after {scheme + ':'!r}: did you mean {meant!r}?")
    return None


def is_glob(path: str | Path) -> bool:
    """Whether ``path`` holds a glob's wildcards (``*``, ``?``, ``[``; a URI's query aside)."""
    return _MAGIC.search(split_query(str(path))[0]) is not None


#: A URI's query of store settings at its end: ``?key=value&key=value`` (``gs://b/x?scheme=http&
#: endpoint_override=127.0.0.1:4443``); a ``?`` not followed by such pairs is a glob's wildcard.
_QUERY = re.compile(r"\?([a-z][a-z0-9_]*=[^&]*(?:&[a-z][a-z0-9_]*=[^&]*)*)\Z")


def split_query(uri: str) -> tuple[str, str]:
    """``uri`` as the URI without its query and the query with its ``?`` (``''`` if none).

    The query holds the store's settings that ``pyarrow.fs.FileSystem.from_uri`` reads
    (``endpoint_override``, ``scheme``, ``retry_limit_seconds``, ``region`` ...); it is told from
    a glob's ``?`` by its ``key=value`` pairs (``part-?.parquet`` is a glob, not a query). A
    local path has none."""
    if scheme_row(uri_scheme(uri)).on_disk:
        return uri, ""
    found = _QUERY.search(uri)
    return (uri[:found.start()], uri[found.start():]) if found else (uri, "")


def uri_name(uri: str | Path) -> str:
    """The last name of a path or URI, its query aside (``gs://b/out/x.parquet?scheme=http`` ->
    ``x.parquet``)."""
    return PurePosixPath(split_query(str(uri))[0]).name


def is_remote(path: str | Path) -> bool:
    """Whether ``path`` is a URI of another store than the local disk (``file://`` is local)."""
    return not scheme_row(uri_scheme(path)).on_disk


def local_path(path: str | Path) -> Path | None:
    """``path`` as a local ``Path``: itself, or the path of a ``file://`` URI (percent-decoded);
    ``None`` for an object-storage URI."""
    scheme = uri_scheme(path)
    if scheme is None:
        return Path(path)
    if scheme_row(scheme).on_disk:
        return Path(unquote(urlparse(str(path)).path))
    return None


def canonical(target: str | Path) -> str:
    """One name per input or output, for fingerprints: a URI as given (no trailing ``/``), a local
    path or ``file://`` URI as its absolute path."""
    path = local_path(target)
    return str(path.resolve()) if path is not None else str(target).rstrip("/")


def sibling(target: str, name: str) -> str:
    """The URI of ``name`` in the folder (prefix) of the URI ``target``, with ``target``'s query
    of store settings (``gs://b/out/x.parquet?scheme=http`` -> ``gs://b/out/<name>?scheme=http``)."""
    base, query = split_query(str(target))
    head, _, _ = base.rstrip("/").rpartition("/")
    return f"{head}/{name}{query}"


@dataclass(frozen=True)
class Location:
    """One path or URI resolved to a file system.

    Attributes:
        given: what the user typed (messages name it).
        filesystem: the ``pyarrow.fs.FileSystem`` it lives on (``LocalFileSystem`` for a path).
        path: the path on ``filesystem`` (``bucket/key`` for S3 and GCS; the path as typed for
            a local path, relative paths included).
        scheme: ``s3``, ``gs``, ... ; ``None`` for a local path or a ``file://`` URI.
    """

    given: str
    filesystem: pafs.FileSystem
    path: str
    scheme: str | None = None

    @property
    def local(self) -> Path | None:
        """The local ``Path``; ``None`` in object storage."""
        return Path(self.path) if self.scheme is None else None

    def name(self, path: str) -> str:
        """How messages and outputs name ``path`` of this file system: a local path as typed,
        else ``scheme://bucket/key``."""
        return path if self.scheme is None else f"{self.scheme}://{path}"


def open_location(target: str | Path, *, option: str = "INPUT") -> Location:
    """Resolve a local path or a URI (``s3://``, ``gs://``, ``file://``, ... : whatever
    ``pyarrow.fs.FileSystem.from_uri`` knows) to a ``Location``. Nothing is read yet.

    Raises:
        InputError: a URI of a scheme pyarrow cannot open, or a malformed one (names ``option``).
        MissingExtra: never; pyarrow ships S3 and GCS support in its wheels.
    """
    text = str(target)
    scheme = uri_scheme(text)
    row = scheme_row(scheme)
    if row.on_disk:
        path = local_path(text)
        return Location(text, pafs.LocalFileSystem(), str(path) if scheme else text, None)
    base, query = split_query(text)
    if row.retry_setting and f"{row.retry_setting}=" not in query:
        query += f"{'&' if query else '?'}{row.retry_setting}={row.retry_seconds()}"
    # a glob's wildcards are no URI syntax ('?' starts a query, '[' is refused): pyarrow opens
    # the folder above the first one, and the rest is appended as it is
    magic = _MAGIC.search(base)
    cut = base.rfind("/", 0, magic.start()) + 1 if magic else len(base)
    if magic and cut <= len(f"{scheme}://"):
        raise InputError(f"{message_head(option, text)}: a glob's wildcards belong after the bucket "
                         f"(e.g. {scheme}://bucket/exports/*.parquet)")
    try:
        filesystem, path = pafs.FileSystem.from_uri(base[:cut] + query)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as exc:
        raise InputError(f"{message_head(option, text)}: cannot open this URI ({exc}); pcd reads local paths and the "
                         "URIs pyarrow.fs knows (s3://, gs://, hdfs://, file://)") from None
    except STORE_ERRORS as exc:
        raise store_error(exc, text, option=option) from None
    if magic:
        path = f"{path.rstrip('/')}/{unquote(base[cut:])}"
    return Location(text, filesystem, path.rstrip("/"), scheme)


#: What a store's failure raises through pyarrow: ``OSError`` mostly; a GCS failure Arrow cannot
#: map (a credentials file that cannot be read) is a bare ``ArrowException``.
STORE_ERRORS = (OSError, pa.ArrowException)


def message_head(option: str, target: str) -> str:
    """How a message starts: ``'path'`` for the input, ``-o 'path'`` for an option."""
    return repr(target) if option == "INPUT" else f"{option} {target!r}"


#: Where a store's failure message says what went wrong (pyarrow's AWS and GCS messages).
_DENIED = ("ACCESS_DENIED", "AccessDenied", "Forbidden", "403", "INVALID_ACCESS_KEY_ID", "SIGNATURE_DOES_NOT_MATCH",
           "InvalidAccessKeyId", "SignatureDoesNotMatch", "PERMISSION_DENIED", "Unauthorized", "401")
_UNREACHABLE = ("NETWORK_CONNECTION", "Could not connect", "curlCode", "Couldn't resolve host", "Connection refused",
                "Timeout was reached", "UNAVAILABLE", "Failed to connect")
_NO_BUCKET = ("NO_SUCH_BUCKET", "NoSuchBucket", "bucket does not exist")


def _endpoint(row: Scheme, uri: str = "") -> str:
    """`` at <endpoint>`` for messages: the URI's ``endpoint_override``, else the variable the
    store's client reads (``Scheme.endpoint``: ``AWS_ENDPOINT_URL[_S3]``, ``CLOUD_STORAGE_EMULATOR_ENDPOINT``)."""
    from urllib.parse import parse_qs

    found = (parse_qs(split_query(uri)[1][1:]).get("endpoint_override") or [row.endpoint()])[0]
    return f" at {found}" if found else ""


def store_error(exc: OSError, uri: str, *, option: str = "INPUT", mid_run: bool = False,
                what: str = "cannot read") -> StoreError | MachineError:
    """One line for a failure of the store holding ``uri``: what went wrong and the fix.

    Args:
        exc: pyarrow's error (an ``OSError``; its message carries the AWS/GCS error name).
        option: the option that named ``uri`` (``INPUT``, ``-o``, ``--reuse``).
        mid_run: the caller knows the run has started: ``MachineError`` (exit 5) that says the
            finished work is kept for ``--resume``; else ``StoreError`` (exit 2 before the run;
            ``run_started`` turns it into the same ``MachineError`` when raised inside a run).
        what: ``cannot read`` / ``cannot write`` / ``cannot list``.

    Returns:
        ``StoreError`` or ``MachineError`` (the caller raises it).
    """
    text = str(exc)
    row = scheme_row(uri_scheme(uri))  # its endpoint, credential probe and fix texts
    detail = ""  # the store's own words, where the reason is pcd's summary of them
    if isinstance(exc, FileNotFoundError) and not any(m in text for m in _NO_BUCKET):
        reason = "no such file, folder or prefix"
        fix = "check the path"
    elif any(m in text for m in _NO_BUCKET):
        bucket = urlparse(uri).netloc.rpartition("@")[2]
        reason, fix = f"no such bucket {bucket!r}{_endpoint(row, uri)}", row.no_bucket_fix
    elif row.no_token and row.no_token in text:
        reason, fix = row.no_token_reason(text), row.no_token_fix
    elif any(m in text for m in _UNREACHABLE):
        reason, detail = f"the store{_endpoint(row, uri)} cannot be reached", _short(text)
        fix = row.unreachable_fix
    elif any(m in text for m in _DENIED):
        missing = row.missing_credentials() if row.missing_credentials else None
        reason = f"access denied and {missing}" if missing else "access denied with the credentials given"
        fix = row.no_credentials_fix if missing else row.denied_fix
    else:
        reason = _short(text) or type(exc).__name__
        fix = "check the store and the credentials"
    said = f" ({detail})" if detail else ""
    failure = StoreError(f"{message_head(option, uri)}: {what}: {reason}{said}; {fix}",
                         f"{message_head(option, uri)}: {what}: {reason}; {fix}", detail)
    return mid_run_error(failure) if mid_run else failure


#: How a store failure mid-run ends (``store_error``), and how it ends on an engine that keeps
#: no checkpoints (``--engine ray``: ``rerun_whole``).
RESUME_HINT = "then rerun with --resume (the rows finished so far are kept)"
RERUN_HINT = "then run the command again (a Ray run keeps no checkpoints; an earlier output at -o is left as it was)"


def mid_run_error(exc: StoreError, hint: str = RESUME_HINT) -> MachineError:
    """A store failure met after the run started: exit 5, the URI, what failed and the fix, then
    ``hint``, then the store's own words (so a log line cut at 200 characters still says what to do)."""
    return MachineError(f"{exc.brief}, {hint}" + (f" ({exc.detail})" if exc.detail else ""))


def rerun_whole(exc: MachineError) -> MachineError:
    """``store_error``'s mid-run failure as an engine without checkpoints says it (``--engine ray``,
    which refuses ``--resume``): ``RERUN_HINT`` in place of ``RESUME_HINT``; any other error as it is."""
    text = str(exc)
    return MachineError(text.replace(RESUME_HINT, RERUN_HINT)) if RESUME_HINT in text else exc


@contextmanager
def run_started(hint: str = RESUME_HINT) -> Iterator[None]:
    """The part of a run after its checks (model loaded, work started): every store failure
    raised inside, wherever it surfaced (a later part read, a listing, a Parquet footer, a Ray
    worker's read, the upload at the end), leaves as a ``MachineError`` (exit 5) naming the URI
    and ending with ``hint``: ``RESUME_HINT`` for the local engine, ``RERUN_HINT`` for an engine
    that keeps no checkpoints. Before the run, the same failure is a ``StoreError`` (exit 2).

    Raises:
        MachineError: for a ``StoreError`` raised inside, or a ``MachineError`` that carries
            ``RESUME_HINT`` when ``hint`` is another (``rerun_whole``).
    """
    try:
        yield
    except StoreError as exc:
        raise mid_run_error(exc, hint) from None
    except MachineError as exc:
        if hint == RESUME_HINT or RESUME_HINT not in str(exc):
            raise
        raise rerun_whole(exc) from None


def _short(text: str) -> str:
    """pyarrow's message without its request id and repeated detail."""
    text = re.sub(r"\s*\(Request ID: [^)]*\)", "", text).strip()
    text = re.sub(r"\s*error_info=\{.*", "", text)  # GCS: the status's metadata, after its message
    return text.split("; Details:")[0][:300]


# -- listing ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FileList:
    """The files one INPUT (or ``--reuse``) names, in the order every engine reads them.

    Attributes:
        location: the path or URI given, resolved.
        files: paths on ``location.filesystem``, in order (``list_files``).
        partitions: per file, its hive partition values (``{'date': '2026-12-05'}``; ``None``
            for ``__HIVE_DEFAULT_PARTITION__``), from the ``key=value`` folder names of its path.
        single: the input named one file (not a folder or a glob).
    """

    location: Location
    files: tuple[str, ...]
    partitions: tuple[dict[str, str | None], ...] = field(default=())
    single: bool = False

    @property
    def filesystem(self) -> pafs.FileSystem:
        return self.location.filesystem

    def name(self, index: int) -> str:
        """File ``index`` as messages and the errors file name it (a path as typed, or a URI)."""
        return self.location.name(self.files[index])

    def source(self, index: int) -> "Path | StoreFile":
        """File ``index`` as the readers open it: a local ``Path`` (as typed), else a ``StoreFile``."""
        if self.location.scheme is None:
            return Path(self.files[index])
        return StoreFile(self.location, self.files[index])

    def partition_columns(self) -> list[str]:
        """The partition keys of any file, in the order first met."""
        return list(dict.fromkeys(k for p in self.partitions for k in p))


@dataclass(frozen=True)
class StoreFile:
    """One file in object storage, as the readers take it in place of a local ``Path``:
    ``str()`` is its URI (messages name it), ``suffix``/``name`` as a path's."""

    location: Location
    path: str

    def __str__(self) -> str:
        return self.location.name(self.path)

    def __fspath__(self) -> str:  # never opened as a local file: messages only
        raise TypeError(f"{self} is in object storage, not a local file")

    @property
    def name(self) -> str:
        return PurePosixPath(self.path).name

    @property
    def suffix(self) -> str:
        return PurePosixPath(self.path).suffix

    @property
    def suffixes(self) -> list[str]:
        return PurePosixPath(self.path).suffixes

    def with_suffix(self, suffix: str) -> "StoreFile":
        return StoreFile(self.location, str(PurePosixPath(self.path).with_suffix(suffix)))

    def open_stream(self):
        """A buffered binary stream of the object (``InputError`` naming the URI when the store refuses)."""
        import io

        return io.BufferedReader(open_input_stream(self.location, self.path), buffer_size=1 << 20)

    def open_file(self):
        """A random-access file of the object (Parquet)."""
        return open_input_file(self.location, self.path)


def partition_values(path: str) -> dict[str, str | None]:
    """Hive partition values of a file's folders: every ``key=value`` folder name of ``path``
    (percent-decoded, as Hive escapes them; a key given twice keeps the deepest)."""
    values: dict[str, str | None] = {}
    for part in PurePosixPath(path).parts[:-1]:
        key, sep, value = part.partition("=")
        if sep and key and not key.startswith((".", "_")):
            value = unquote(value)
            values[unquote(key)] = None if value == HIVE_NULL else value
    return values


def _hidden(relative: str) -> bool:
    return any(p.startswith((".", "_")) for p in PurePosixPath(relative).parts)


def _glob_regex(pattern: str) -> re.Pattern:
    """A glob as a regular expression over ``/``-separated paths: ``*``, ``?`` and ``[...]`` stay
    within one name, ``**`` (a whole name) spans any number of folders (``glob.glob(recursive=True)``)."""
    out = []
    parts = pattern.split("/")
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if part == "**":
            out.append(".*" if last else "(?:[^/]+/)*")
            continue
        j, piece = 0, ""
        while j < len(part):
            c = part[j]
            if c == "*":
                piece += "[^/]*"
            elif c == "?":
                piece += "[^/]"
            elif c == "[":
                end = part.find("]", j + 2)
                if end < 0:
                    piece += re.escape(c)
                else:
                    body = part[j + 1:end]
                    piece += "[" + ("^" + body[1:] if body.startswith("!") else body).replace("\\", "\\\\") + "]"
                    j = end
            else:
                piece += re.escape(c)
            j += 1
        out.append(piece + ("" if last else "/"))
    return re.compile("".join(out) + r"\Z")


def _sort_key(path: str) -> tuple[str, ...]:
    return PurePosixPath(path).parts


def _info(location: Location, path: str, option: str) -> pafs.FileInfo:
    try:
        return location.filesystem.get_file_info(path)
    except STORE_ERRORS as exc:
        raise store_error(exc, location.given, option=option) from None


def _below(location: Location, base: str, option: str) -> list[pafs.FileInfo]:
    try:
        # nothing there is [] (said by the caller, naming what was given): GCS says a missing
        # prefix with a bare OSError, not FileNotFoundError, unless allowed
        return location.filesystem.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
    except FileNotFoundError:
        return []
    except STORE_ERRORS as exc:
        raise store_error(exc, location.given, option=option, what="cannot list") from None


def list_files(target: str | Path, *, extensions: Iterable[str] | None = None, option: str = "INPUT",
               what: str = ".jsonl, .csv or .parquet") -> FileList:
    """The files ``target`` names, in one deterministic order (module docstring).

    Args:
        target: a file, a folder, or a glob; a local path or a URI.
        extensions: in a folder or glob, keep only files whose names end so (``.parquet``,
            ``.jsonl.gz``; case aside; ``None``: every file). A file named directly is always kept.
        option: how messages name ``target``: ``INPUT`` (the input: 'no such input file', an empty
            folder's fix names ``--format``), or the option (``--reuse``: no ``--format`` advice).
        what: the kinds of file expected, for messages.

    Returns:
        ``FileList`` (at least one file).

    Raises:
        InputError: nothing there (no such file, folder, bucket or prefix), an empty folder, a
            glob that matches nothing, or the store refused or could not be reached
            (``store_error``: the URI and the fix).
    """
    location = open_location(target, option=option)
    keep = None if extensions is None else tuple(e.lower() for e in extensions)

    def wanted(path: str) -> bool:
        return keep is None or PurePosixPath(path).name.lower().endswith(keep)

    given = location.given
    magic = _MAGIC.search(location.path)
    if not magic:
        info = _info(location, location.path, option)
        if info.type == pafs.FileType.File:
            return FileList(location, (location.path,), (partition_values(location.path),), single=True)
        entries = _below(location, location.path, option) if info.type == pafs.FileType.Directory \
            or location.scheme is not None else []
        if info.type == pafs.FileType.NotFound and not entries:
            if location.scheme is not None:
                check_bucket(location, option)
                raise InputError(f"{message_head(option, given)}: no such object or prefix; check the path (list it with "
                                 "your store's client, e.g. aws s3 ls)")
            raise InputError(f"{message_head(option, given)}: no such {'input ' if option == 'INPUT' else ''}file, "
                             "folder or glob")
        base = location.path.rstrip("/")
        files = [e.path for e in entries if e.type == pafs.FileType.File
                 and not _hidden(e.path[len(base) + 1:]) and wanted(e.path)]
        if not files:
            found = sum(1 for e in entries if e.type == pafs.FileType.File)
            held = f" (it holds {found} other file{'s' * (found != 1)})" if found else " (it is empty)"
            fix = ("give a folder of them, or pass --format" if option == "INPUT"  # --format: the input's
                   else f"give a {what} file, or a folder or glob of them")
            raise InputError(f"{message_head(option, given)}: the folder holds no {what} file{held}; {fix}")
    else:
        head = location.path[:magic.start()]
        base = head[:head.rfind("/")] if "/" in head else ("" if location.scheme is None else head)
        if location.scheme is None and not base:
            base = "."
        pattern = _glob_regex(location.path if base != "." or location.path.startswith("./")
                              else "./" + location.path)
        literal = {p for p in PurePosixPath(location.path).parts if not _MAGIC.search(p)}
        entries = _below(location, base, option)
        files = [e.path for e in entries if e.type == pafs.FileType.File and pattern.match(e.path)
                 and not any(p.startswith((".", "_")) and p not in literal
                             for p in PurePosixPath(e.path[len(base) + 1:]).parts)]
        if base == "." and location.scheme is None and not location.path.startswith("./"):
            files = [f[2:] if f.startswith("./") else f for f in files]
        if not files:
            raise InputError(f"{message_head(option, given)}: no file matches")
    files.sort(key=_sort_key)
    return FileList(location, tuple(files), tuple(partition_values(f) for f in files))


def check_bucket(location: Location, option: str) -> None:
    """Refuse a ``location`` whose bucket does not exist or cannot be read (one request: the
    bucket's own head, not a listing).

    Raises:
        InputError: names the URI and the fix (``store_error``).
    """
    bucket = location.path.split("/", 1)[0]
    try:
        info = location.filesystem.get_file_info(bucket)
    except STORE_ERRORS as exc:
        raise store_error(exc, location.given, option=option, what="cannot list") from None
    if info.type == pafs.FileType.NotFound:
        raise store_error(FileNotFoundError(f"NoSuchBucket: {bucket}"), location.given, option=option,
                          what="cannot list")


def open_dataset(target: str | Path | FileList, *, option: str = "--reuse"):
    """A folder, glob or file of Parquet files (local or a URI) as a ``pyarrow.dataset.Dataset``,
    the files in ``list_files`` order, with the hive partition columns (strings) added to the
    files' own columns.

    Raises:
        InputError: as ``list_files``; a file that is not Parquet (names it).
    """
    import pyarrow.dataset as ds

    listed = target if isinstance(target, FileList) else list_files(target, extensions=(".parquet", ".pq"),
                                                                      option=option, what=".parquet")
    keys = listed.partition_columns()
    fmt = ds.ParquetFileFormat()
    fragments = []
    for i, path in enumerate(listed.files):
        expr = None
        for k in keys:
            v = listed.partitions[i].get(k)
            term = ds.field(k) == v if v is not None else ds.field(k).is_null()
            expr = term if expr is None else expr & term
        try:
            fragment = fmt.make_fragment(path, listed.filesystem, partition_expression=expr)
            physical = fragment.physical_schema
        except STORE_ERRORS as exc:
            if not isinstance(exc, pa.ArrowInvalid):
                raise store_error(exc, listed.name(i), option=option) from None
            raise InputError(f"{message_head(option, listed.name(i))}: not a readable Parquet file ({exc})") from None
        fragments.append(fragment)
        if i == 0:
            schema = physical
    for k in keys:
        if k not in schema.names:
            schema = schema.append(pa.field(k, pa.string()))
    return ds.FileSystemDataset(fragments, schema, fmt, listed.filesystem)


def open_input_stream(location: Location, path: str, *, option: str = "INPUT"):
    """A sequential binary stream of ``path`` (no decompression: pcd sniffs and decompresses itself).

    Raises:
        InputError: the store refused or could not be reached (``store_error``).
    """
    try:
        return location.filesystem.open_input_stream(path, compression=None)
    except STORE_ERRORS as exc:
        raise store_error(exc, location.name(path), option=option) from None


def open_input_file(location: Location, path: str, *, option: str = "INPUT"):
    """A random-access file of ``path`` (Parquet reads its footer first).

    Raises:
        InputError: as ``open_input_stream``.
    """
    try:
        return location.filesystem.open_input_file(path)
    except STORE_ERRORS as exc:
        raise store_error(exc, location.name(path), option=option) from None
