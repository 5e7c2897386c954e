"""Writing files as a cron job expects: whole or not at all, through symlinks, and the
machine's own failures named as such.

Every file pcd writes (the Parquet output, the errors and trace files, calibration files,
``pcd eval --json``, plots, the work folder's parts) goes through here:

- **Atomic.** The bytes go to a temporary file in the destination's folder, are flushed to
  disk, and the file is renamed over the destination (POSIX ``rename`` is atomic within one
  file system). A failure removes the temporary file: nothing half-written is left, and the
  earlier file stays as it was.
- **Through symlinks.** When the destination is a symlink, the file replaced is the link's
  final target (the temporary file is made in the target's folder, so the rename stays
  atomic) and the link stays: a dashboard reading the target sees today's file. Renaming over
  the link itself would leave the target with yesterday's data, the defect of
  nesquena/hermes-webui#5797.
- **The machine, not a bug.** An ``OSError`` while writing (no space left, read-only or
  vanished folder, permission denied, I/O error, file too large) becomes ``MachineError``
  naming the path and the system's reason; the CLI maps it to exit 5, apart from 4 (a bug).
"""

from __future__ import annotations

import os
import re
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator

from ..errors import InputError, MachineError


def cache_dir() -> Path:
    """pcd's cache folder: ``$XDG_CACHE_HOME/pcd``, else ``~/.cache/pcd`` (converted models, the
    staging of outputs in object storage, ``pcd bench``'s dtype speeds)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pcd"


def write_target(path: str | Path) -> Path:
    """The file that writing ``path`` replaces: ``path`` itself, or the end of its symlink chain.

    A dangling link gives the path it points to (its folder is created by the writer).
    """
    path = Path(path)
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def os_reason(exc: OSError) -> str:
    """The system's reason for ``exc`` in its own words: ``No space left on device``.

    pyarrow puts the errno inside its message (``... Detail: [errno 28] No space left on
    device``); that reason is taken from there.
    """
    found = re.search(r"\[errno (\d+)\]", str(exc), re.IGNORECASE)
    if found:
        return os.strerror(int(found.group(1)))
    if exc.errno and exc.strerror and not exc.strerror.startswith("Failed"):
        return exc.strerror
    if exc.errno:
        return os.strerror(exc.errno)
    return str(exc) or type(exc).__name__


def machine_error(exc: OSError, path: str | Path | None, what: str = "cannot write") -> MachineError:
    """``MachineError`` for ``exc`` met while doing ``what`` to ``path``: ``'out.parquet': cannot
    write (No space left on device)``."""
    where = path if path is not None else exc.filename
    head = f"{str(where)!r}: " if where is not None else ""
    return MachineError(f"{head}{what} ({os_reason(exc)})")


@contextmanager
def machine_errors(path: str | Path | None, what: str = "cannot write") -> Iterator[None]:
    """Turn an ``OSError`` raised inside into ``MachineError`` naming ``path`` (see ``machine_error``)."""
    try:
        yield
    except MachineError:
        raise
    except OSError as exc:
        raise machine_error(exc, path, what) from exc


def _normal_mode(path: str | Path) -> None:
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)  # mkstemp makes 0600; give the file a normal file's mode


def _fsync_dir(path: Path) -> None:
    """Make a rename in ``path`` durable (POSIX; a no-op where folders cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class AtomicFile:
    """A temporary file that becomes ``path`` on ``commit()`` (see the module docstring).

    Attributes:
        path: the destination as given. target: the file replaced (``write_target(path)``).
        tmp: the temporary file, in ``target``'s folder, named ``.<name>.<random>.tmp``.

    Raises:
        MachineError: the folder cannot be created or written (on creation), or the data
            cannot be flushed or renamed (on ``commit``).
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.target = write_target(self.path)
        with machine_errors(self.path):
            self.target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{self.target.name}.", suffix=".tmp", dir=self.target.parent)
            os.close(fd)
        self.tmp = Path(tmp)

    def commit(self) -> None:
        """Flush the temporary file to disk and rename it over the target (then the folder)."""
        try:
            with machine_errors(self.path):
                with self.tmp.open("rb+") as fh:
                    os.fsync(fh.fileno())
                _normal_mode(self.tmp)
                os.replace(self.tmp, self.target)
        except BaseException:
            self.abort()
            raise
        _fsync_dir(self.target.parent)

    def abort(self) -> None:
        """Remove the temporary file; the destination stays as it was."""
        self.tmp.unlink(missing_ok=True)


@contextmanager
def atomic_writer(path: str | Path) -> Iterator[BinaryIO]:
    """``with atomic_writer(p) as fh: fh.write(...)``: ``p`` appears whole when the block ends,
    or not at all if it raises. Raises ``MachineError`` as ``AtomicFile`` does."""
    dest = AtomicFile(path)
    try:
        with machine_errors(path), dest.tmp.open("wb") as fh:
            yield fh
    except BaseException:
        dest.abort()
        raise
    dest.commit()


def write_atomic(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all (see ``atomic_writer``)."""
    with atomic_writer(path) as fh:
        fh.write(data)


def clear_stale(path: str | Path) -> None:
    """Make an earlier run's file at ``path`` (its errors or trace) stop misleading: a regular
    file is removed; a symlink stays and its target is emptied (atomically), since something
    reads it there."""
    path = Path(path)
    if path.is_symlink():
        write_atomic(path, b"")
    else:
        with machine_errors(path, "cannot remove"):
            path.unlink(missing_ok=True)


def check_writable(option: str, path: str | Path, *, folder_ok: bool = False) -> Path | None:
    """Refuse, before any work, a path ``option`` cannot write; create its missing folder.

    Tried for real (a temporary file in the folder of ``write_target(path)``): permission
    bits say nothing to root, and a read-only mount or ``/proc`` refuse anyway.

    Args:
        folder_ok: ``path`` may be an existing folder (an output that is a folder of files).

    Returns:
        The folder created for it (the highest missing one), or ``None`` if it existed.

    Raises:
        InputError: ``path`` is a folder, or its folder cannot be created or written; names
            ``option``, the path and the system's reason (exit 2: a bad option).
    """
    path = Path(path)
    if path.is_dir() and not folder_ok:
        raise InputError(f"{option} {str(path)!r} is a folder; give a file name")
    folder = write_target(path).parent
    missing = next((p for p in reversed([folder, *folder.parents]) if not p.exists()), None)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{option} {str(path)!r}: cannot create its folder ({os_reason(exc)})") from None
    try:
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as exc:
        raise InputError(f"{option} {str(path)!r}: cannot write in its folder ({os_reason(exc)})") from None
    return missing
