"""Where inputs and outputs live: a local path, or an object-storage URI, through ``pyarrow.fs``.

One place turns what a user typed (``data/export.jsonl``, ``exports/``, ``'exports/*.parquet'``,
``file:///srv/exports``, ``s3://bucket/exports/date=2026-12-05/``, ``gs://bucket/x.parquet``,
anything ``pyarrow.fs.FileSystem.from_uri`` resolves) into a ``pyarrow.fs.FileSystem`` and the
paths on it, for every reader and engine:

- ``open_location``: one path or URI as a ``Location`` (file system + path on it). Credentials
  and settings are each cloud's standard ones, read by pyarrow itself: for S3 the ``AWS_*``
  variables (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``,
  ``AWS_PROFILE`` and the shared config files, ``AWS_REGION``, ``AWS_ENDPOINT_URL`` or
  ``AWS_ENDPOINT_URL_S3`` for an S3-compatible store: pyarrow 25 honours both, checked against
  SeaweedFS); for GCS Google's application default credentials (``GOOGLE_APPLICATION_CREDENTIALS``,
  gcloud's file, the metadata server) or ``gs://anonymous@...``, and google-cloud-cpp's
  ``CLOUD_STORAGE_EMULATOR_ENDPOINT`` for an emulator (checked against fake-gcs-server). A URI's
  query of settings (``?endpoint_override=host:port&scheme=http``) reaches pyarrow as typed
  (``split_query``); a GCS request is retried for ``GCS_RETRY_SECONDS`` unless the URI says.
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
- ``upload_atomic``: a finished local file put at an object-storage URI whole or never (a
  temporary key beside it, then one server-side copy, then the temporary key removed): a run
  killed at any moment, SIGKILL included, leaves no partial object at the URI.

Local paths and ``file://`` URIs stay ``pathlib`` paths for writing (``pcd_cli.io.files``: atomic
rename, symlinks); ``local_path`` says which is which.
"""

from __future__ import annotations

import os
import re
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Iterable, Iterator
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.fs as pafs

from ..errors import InputError, MachineError, PcdError, StoreError

#: ``scheme://`` at the start of a URI (two letters at least: ``C:/`` stays a path).
_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+)://")
#: Characters that make a path a glob.
_MAGIC = re.compile(r"[*?\[]")
#: The value Hive writes for a null partition value.
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


#: The schemes ``pyarrow.fs.FileSystem.from_uri`` opens (pyarrow 25: each checked with a URI of it;
#: ``hdfs``/``viewfs`` need a JVM, ``abfs``/``abfss`` an account, but pyarrow knows them).
KNOWN_SCHEMES = ("s3", "gs", "gcs", "file", "local", "mock", "hdfs", "viewfs", "abfs", "abfss", "hf")
#: A known scheme followed by one slash (``s3:/bucket/key``): a typo of ``s3://bucket/key``, which
#: would otherwise be read as a local relative path (a folder named ``s3:``).
_ONE_SLASH = re.compile(r"^(" + "|".join(KNOWN_SCHEMES) + r"):/(?!/)", re.IGNORECASE)


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
    if typo:
        scheme = typo.group(1)
        rest = text[len(scheme) + 1:]  # from the one slash on
        meant = f"{scheme}://{rest if scheme.lower() in ('file', 'local') else rest[1:]}"
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
    if uri_scheme(uri) in (None, "file"):
        return uri, ""
    found = _QUERY.search(uri)
    return (uri[:found.start()], uri[found.start():]) if found else (uri, "")


def uri_name(uri: str | Path) -> str:
    """The last name of a path or URI, its query aside (``gs://b/out/x.parquet?scheme=http`` ->
    ``x.parquet``)."""
    return PurePosixPath(split_query(str(uri))[0]).name


def is_remote(path: str | Path) -> bool:
    """Whether ``path`` is a URI of another store than the local disk (``file://`` is local)."""
    scheme = uri_scheme(path)
    return scheme is not None and scheme != "file"


def local_path(path: str | Path) -> Path | None:
    """``path`` as a local ``Path``: itself, or the path of a ``file://`` URI (percent-decoded);
    ``None`` for an object-storage URI."""
    scheme = uri_scheme(path)
    if scheme is None:
        return Path(path)
    if scheme == "file":
        parsed = urlparse(str(path))
        return Path(unquote(parsed.path))
    return None


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
    if scheme is None or scheme == "file":
        path = local_path(text)
        return Location(text, pafs.LocalFileSystem(), str(path) if scheme else text, None)
    base, query = split_query(text)
    if scheme in ("gs", "gcs") and "retry_limit_seconds=" not in query:
        query += f"{'&' if query else '?'}retry_limit_seconds={GCS_RETRY_SECONDS}"
    # a glob's wildcards are no URI syntax ('?' starts a query, '[' is refused): pyarrow opens
    # the folder above the first one, and the rest is appended as it is
    magic = _MAGIC.search(base)
    cut = base.rfind("/", 0, magic.start()) + 1 if magic else len(base)
    if magic and cut <= len(f"{scheme}://"):
        raise InputError(f"{_head(option, text)}: a glob's wildcards belong after the bucket "
                         f"(e.g. {scheme}://bucket/exports/*.parquet)")
    try:
        filesystem, path = pafs.FileSystem.from_uri(base[:cut] + query)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as exc:
        raise InputError(f"{_head(option, text)}: cannot open this URI ({exc}); pcd reads local paths and the "
                         "URIs pyarrow.fs knows (s3://, gs://, hdfs://, file://)") from None
    except STORE_ERRORS as exc:
        raise store_error(exc, text, option=option) from None
    if magic:
        path = f"{path.rstrip('/')}/{unquote(base[cut:])}"
    return Location(text, filesystem, path.rstrip("/"), scheme)


#: What a store's failure raises through pyarrow: ``OSError`` mostly; a GCS failure Arrow cannot
#: map (a credentials file that cannot be read) is a bare ``ArrowException``.
STORE_ERRORS = (OSError, pa.ArrowException)
#: Seconds pyarrow's GCS client retries a failing request when the URI does not say
#: (``?retry_limit_seconds=N``). The client's own default is 15 minutes: an unreachable endpoint
#: or missing credentials would hang a run that long before its one-line error.
GCS_RETRY_SECONDS = 60


def _head(option: str, target: str) -> str:
    """How a message starts: ``'path'`` for the input, ``-o 'path'`` for an option."""
    return repr(target) if option == "INPUT" else f"{option} {target!r}"


#: Where a store's failure message says what went wrong (pyarrow's AWS and GCS messages).
_DENIED = ("ACCESS_DENIED", "AccessDenied", "Forbidden", "403", "INVALID_ACCESS_KEY_ID", "SIGNATURE_DOES_NOT_MATCH",
           "InvalidAccessKeyId", "SignatureDoesNotMatch", "PERMISSION_DENIED", "Unauthorized", "401")
_UNREACHABLE = ("NETWORK_CONNECTION", "Could not connect", "curlCode", "Couldn't resolve host", "Connection refused",
                "Timeout was reached", "UNAVAILABLE", "Failed to connect")
_NO_BUCKET = ("NO_SUCH_BUCKET", "NoSuchBucket", "bucket does not exist")
#: GCS: no credentials gave an access token (none found, an unreadable key file, no metadata server).
_NO_TOKEN = "Could not create a OAuth2 access token"


def _aws_credentials_found() -> bool:
    """Whether any of the AWS SDK's usual credential sources is set up (variables, profile, the
    shared files, a web identity, a container's credentials); the instance metadata is not asked."""
    if os.environ.get("AWS_ACCESS_KEY_ID") or os.environ.get("AWS_PROFILE") \
            or os.environ.get("AWS_WEB_IDENTITY_TOKEN_FILE") or os.environ.get("AWS_CONTAINER_CREDENTIALS_FULL_URI") \
            or os.environ.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"):
        return True
    home = os.path.expanduser("~")
    files = (os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or os.path.join(home, ".aws", "credentials"),
             os.environ.get("AWS_CONFIG_FILE") or os.path.join(home, ".aws", "config"))
    return any(os.path.isfile(f) for f in files)


def _endpoint(scheme: str | None, uri: str = "") -> str:
    """`` at <endpoint>`` for messages: the URI's ``endpoint_override``, else the variable the
    store's client reads (``AWS_ENDPOINT_URL[_S3]``; GCS: ``CLOUD_STORAGE_EMULATOR_ENDPOINT``)."""
    from urllib.parse import parse_qs

    given = parse_qs(split_query(uri)[1][1:]).get("endpoint_override")
    if given:
        return f" at {given[0]}"
    if scheme == "s3":
        found = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        return f" at {found}" if found else ""
    if scheme in ("gs", "gcs"):
        found = os.environ.get("CLOUD_STORAGE_EMULATOR_ENDPOINT")
        return f" at {found}" if found else ""
    return ""


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
    scheme = uri_scheme(uri)
    detail = ""  # the store's own words, where the reason is pcd's summary of them
    if isinstance(exc, FileNotFoundError) and not any(m in text for m in _NO_BUCKET):
        reason = "no such file, folder or prefix"
        fix = "check the path"
    elif any(m in text for m in _NO_BUCKET):
        bucket = urlparse(uri).netloc.rpartition("@")[2]
        reason = f"no such bucket {bucket!r}{_endpoint(scheme, uri)}"
        fix = ("check the bucket name (and AWS_ENDPOINT_URL / AWS_REGION for the store meant)" if scheme == "s3"
               else "check the bucket name (and the endpoint: CLOUD_STORAGE_EMULATOR_ENDPOINT or ?endpoint_override=)"
               if scheme in ("gs", "gcs") else "check the bucket name")
    elif _NO_TOKEN in text:
        cause = re.search(r"The underlying error message was: (.*?)(?: error_info=|\)?$)", text)
        key = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
        reason = (f"the credentials of GOOGLE_APPLICATION_CREDENTIALS={key} gave no access token"
                  + (f" ({cause.group(1)[:200]})" if cause else "") if key
                  else "no Google credentials were found (no GOOGLE_APPLICATION_CREDENTIALS, no gcloud "
                  "application-default file, no metadata server answered)")
        fix = ("set GOOGLE_APPLICATION_CREDENTIALS to a service account key file (or run `gcloud auth "
               "application-default login`, or run where the metadata server gives credentials); a public "
               "bucket or an emulator needs none: gs://anonymous@bucket/...")
    elif any(m in text for m in _UNREACHABLE):
        reason, detail = f"the store{_endpoint(scheme, uri)} cannot be reached", _short(text)
        fix = ("check AWS_ENDPOINT_URL (or AWS_ENDPOINT_URL_S3) and the network" if scheme == "s3"
               else "check CLOUD_STORAGE_EMULATOR_ENDPOINT (or the URI's ?endpoint_override=) and the network"
               if scheme in ("gs", "gcs") else "check the endpoint and the network")
    elif any(m in text for m in _DENIED):
        if scheme == "s3" and not _aws_credentials_found():
            reason = "access denied and no AWS credentials were found"
            fix = "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE (~/.aws/credentials)"
        elif scheme == "gs" and not os.environ.get("GOOGLE_APPLICATION_CREDENTIALS"):
            reason = "access denied and GOOGLE_APPLICATION_CREDENTIALS is not set"
            fix = "set GOOGLE_APPLICATION_CREDENTIALS to a service account key file, or run where the metadata server gives one"
        else:
            reason = "access denied with the credentials given"
            fix = ("check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE and the bucket's policy"
                   if scheme == "s3" else "check the credentials and the bucket's permissions")
    else:
        reason = _short(text) or type(exc).__name__
        fix = "check the store and the credentials"
    said = f" ({detail})" if detail else ""
    failure = StoreError(f"{_head(option, uri)}: {what}: {reason}{said}; {fix}",
                         f"{_head(option, uri)}: {what}: {reason}; {fix}", detail)
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
                _check_bucket(location, option)
                raise InputError(f"{_head(option, given)}: no such object or prefix; check the path (list it with "
                                 "your store's client, e.g. aws s3 ls)")
            raise InputError(f"{_head(option, given)}: no such {'input ' if option == 'INPUT' else ''}file, "
                             "folder or glob")
        base = location.path.rstrip("/")
        files = [e.path for e in entries if e.type == pafs.FileType.File
                 and not _hidden(e.path[len(base) + 1:]) and wanted(e.path)]
        if not files:
            found = sum(1 for e in entries if e.type == pafs.FileType.File)
            held = f" (it holds {found} other file{'s' * (found != 1)})" if found else " (it is empty)"
            fix = ("give a folder of them, or pass --format" if option == "INPUT"  # --format: the input's
                   else f"give a {what} file, or a folder or glob of them")
            raise InputError(f"{_head(option, given)}: the folder holds no {what} file{held}; {fix}")
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
            raise InputError(f"{_head(option, given)}: no file matches")
    files.sort(key=_sort_key)
    return FileList(location, tuple(files), tuple(partition_values(f) for f in files))


def _check_bucket(location: Location, option: str) -> None:
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
            raise InputError(f"{_head(option, listed.name(i))}: not a readable Parquet file ({exc})") from None
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


# -- writing to object storage ----------------------------------------------------------------------
#: The temporary keys an upload goes through: ``.<name>.pcd-upload-<random>`` beside the target.
UPLOAD_MARK = ".pcd-upload-"


def upload_atomic(source: Path, uri: str, *, option: str = "-o", mid_run: bool = True) -> None:
    """Put the finished local file ``source`` at ``uri`` whole or never.

    The bytes go to a temporary key beside the target (``.<name>.pcd-upload-<random>``), then
    one server-side copy makes the target (a copy creates its object whole: S3 CopyObject, GCS
    rewrite), then the temporary key is removed. A failure or a kill at any moment leaves the
    earlier object at ``uri`` as it was (a killed upload may leave its temporary key, which the
    next upload to the same URI removes). Local paths and ``file://`` are not for this
    (``pcd_cli.io.files`` renames atomically).

    Raises:
        MachineError (``mid_run``) or InputError: the store refused or failed (``store_error``).
    """
    location = open_location(uri, option=option)
    if location.scheme is None:
        raise ValueError(f"{uri!r} is a local path: write it with pcd_cli.io.files")
    folder, _, name = location.path.rpartition("/")
    tmp = f"{folder}/.{name}{UPLOAD_MARK}{uuid.uuid4().hex[:12]}"
    fs = location.filesystem
    try:
        _remove_stale_uploads(location)
        with source.open("rb") as fh, fs.open_output_stream(tmp) as out:
            while chunk := fh.read(1 << 22):
                out.write(chunk)
        fs.copy_file(tmp, location.path)
    except STORE_ERRORS as exc:
        raise store_error(exc, uri, option=option, mid_run=mid_run, what="cannot write") from None
    finally:
        try:
            fs.delete_file(tmp)
        except STORE_ERRORS:
            pass


def _remove_stale_uploads(location: Location) -> None:
    """Remove the temporary keys of earlier uploads to ``location`` that were killed."""
    folder, _, name = location.path.rpartition("/")
    try:
        entries = location.filesystem.get_file_info(pafs.FileSelector(folder, recursive=False, allow_not_found=True))
    except STORE_ERRORS:
        return
    for entry in entries:
        if entry.type == pafs.FileType.File and entry.base_name.startswith(f".{name}{UPLOAD_MARK}"):
            try:
                location.filesystem.delete_file(entry.path)
            except STORE_ERRORS:
                pass


def remove_object(uri: str, *, option: str = "--errors") -> None:
    """Remove the object at ``uri`` if there is one (an earlier run's errors file, which would mislead).

    Raises:
        MachineError: the store refused or failed.
    """
    location = open_location(uri, option=option)
    try:
        if location.filesystem.get_file_info(location.path).type == pafs.FileType.File:
            location.filesystem.delete_file(location.path)
    except STORE_ERRORS as exc:
        raise store_error(exc, uri, option=option, mid_run=True, what="cannot remove") from None


def check_output_uri(uri: str, *, option: str = "-o") -> None:
    """Refuse, before any work, an object-storage output the store will not take: a missing
    bucket, missing credentials, an unreachable endpoint, no right to write (a small temporary
    object is written there and removed), or a URI that names a folder.

    Raises:
        InputError: one line naming the URI and the fix (``store_error``).
    """
    location = open_location(uri, option=option)
    if not location.path or "/" not in location.path.strip("/"):
        raise InputError(f"{_head(option, uri)}: name an object in a bucket, e.g. s3://bucket/out/labels.parquet")
    folder, _, name = location.path.rpartition("/")
    fs = location.filesystem
    try:
        info = fs.get_file_info(location.path)
    except STORE_ERRORS as exc:
        raise store_error(exc, uri, option=option, what="cannot write") from None
    if info.type == pafs.FileType.Directory:
        raise InputError(f"{_head(option, uri)} is a prefix holding objects; give an object name, e.g. "
                         f"{uri.rstrip('/') + '/labels.parquet'!r}")
    _check_bucket(location, option)  # before writing: some stores create a missing bucket on write
    probe = f"{folder}/.{name}{UPLOAD_MARK}probe-{uuid.uuid4().hex[:8]}"
    try:
        with fs.open_output_stream(probe) as out:
            out.write(b"")
        fs.delete_file(probe)
    except STORE_ERRORS as exc:
        raise store_error(exc, uri, option=option, what="cannot write") from None


# -- outputs in object storage: staged locally, uploaded whole ----------------------------------------
#: The folder of the pcd cache that holds the staging folders (``StagedOutput``), and how many hex
#: digits of the URI's SHA-256 name each.
STAGING_ROOT = "outputs"
STAGED_KEY_HEX = 16
#: The file in a staging folder that says where its files go (read by ``publish_staged``).
STAGED_TARGETS = "publish.json"


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
class StagedOutput:
    """``-o`` (and ``--errors``) in object storage, made in a local folder and uploaded whole.

    A run writes its output, errors file and checkpoint work folder (``.<name>.pcd-work``) in
    ``folder`` = ``<root>/<first 16 hex of sha256(output URI)>/``, as it would beside a local
    output; ``publish_staged`` then uploads the errors file and, last, the output
    (``upload_atomic``: whole or never). So ``--resume`` on the same machine (same ``root``)
    continues a run stopped, killed or failed at the upload; the staging folder names its URIs
    in ``publish.json``. ``clean`` removes the whole folder after the upload, or after a run
    refused before labelling; it stays while a run there can be resumed.

    Attributes:
        output_uri, errors_uri: where the files go. folder: the staging folder.
    """

    output_uri: str
    errors_uri: str
    folder: Path

    @classmethod
    def plan(cls, output_uri: str, errors_uri: str, root: Path) -> "StagedOutput":
        """Stage ``output_uri``'s files under ``root`` (nothing checked or made yet)."""
        import hashlib

        key = hashlib.sha256(output_uri.encode()).hexdigest()[:STAGED_KEY_HEX]
        return cls(output_uri, errors_uri, Path(root) / key)

    @property
    def output(self) -> Path:
        return self.folder / uri_name(self.output_uri)

    @property
    def errors(self) -> Path:
        name = uri_name(self.errors_uri)
        return self.folder / (name if name != self.output.name else f"{name}.errors")

    def prepare(self) -> None:
        """Check both URIs with the store (``check_output_uri``: before any model loads), make
        the staging folder and record the URIs in it.

        Raises:
            InputError: the store refuses, cannot be reached, or the bucket is missing.
            MachineError: the staging folder cannot be made.
        """
        import json

        from .files import write_atomic

        check_output_uri(self.output_uri, option="-o")
        if sibling(self.errors_uri, "") != sibling(self.output_uri, ""):
            check_output_uri(self.errors_uri, option="--errors")
        write_atomic(self.folder / STAGED_TARGETS, json.dumps(
            {"output": self.output_uri, "errors": self.errors_uri,
             "files": {self.output.name: self.output_uri, self.errors.name: self.errors_uri}}).encode())

    def clean(self) -> None:
        """Remove the staging folder whole (``publish.json``, staged files, the folder itself)
        unless it holds a run to resume: the checkpoint work folder (``.<name>.pcd-work``, the only
        folder a run makes here; ``WorkDir`` removes it once uploaded, or when it holds no part).
        Called at the end of every run: after an upload, or a run refused before labelling,
        nothing is left (one URI per night would pile up folders); after a run stopped, killed
        or failed mid-run (the store, ``--max-errors``) the folder stays for ``--resume``."""
        import shutil

        try:
            if any(entry.is_dir() for entry in self.folder.iterdir()):
                return
        except FileNotFoundError:
            return
        shutil.rmtree(self.folder, ignore_errors=True)


def staged_targets(output: Path) -> dict[str, str] | None:
    """The URIs of a staging folder's files (``StagedOutput``) when ``output`` is a staged output,
    else ``None``."""
    import json

    found = Path(output).parent / STAGED_TARGETS
    try:
        data = json.loads(found.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("files", {}).get(Path(output).name) else None


def _in_staging_folder(output: Path) -> bool:
    """Whether ``output`` lies in a staging folder (``StagedOutput.plan``: ``<pcd cache>/
    STAGING_ROOT/<STAGED_KEY_HEX hex digits>/``), whatever its ``publish.json`` says."""
    folder = Path(output).parent
    return folder.parent.name == STAGING_ROOT and re.fullmatch(f"[0-9a-f]{{{STAGED_KEY_HEX}}}", folder.name) is not None


def publish_staged(output: Path, *, errors: Path | None = None, output_too: bool = True) -> str | None:
    """Upload a staged run's files (``StagedOutput``): the errors file (or, when there is none,
    remove an earlier run's at its URI: it would mislead), then the output last, whole or never.
    A no-op for an output that is not staged.

    Args:
        output_too: ``False``: only the errors file (a run that stopped: ``--max-errors``, no
            row labelled), the earlier output at the URI left as it was.

    Returns:
        The output's URI when uploaded, else ``None``.

    Raises:
        MachineError: the store failed (exit 5); the staged files stay for ``--resume``.
    """
    targets = staged_targets(output)
    if targets is None:
        if _in_staging_folder(output):  # staged, but its record is gone: never report an upload that did not happen
            raise MachineError(f"-o: the staging record {Path(output).parent / STAGED_TARGETS} is gone (another pcd "
                               "run for the same -o removed it?): nothing was uploaded; run the command again")
        return None
    errors = errors if errors is not None else Path(output).parent / next(
        (n for n, uri in targets["files"].items() if uri == targets["errors"]), "")
    if errors.is_file():
        upload_atomic(errors, targets["errors"], option="--errors")
    else:
        remove_object(targets["errors"])
    if not output_too:
        return None
    upload_atomic(Path(output), targets["output"], option="-o")
    for done in (errors, Path(output)):  # uploaded: the local copies are not kept
        if done.is_file():
            done.unlink()
    return targets["output"]
