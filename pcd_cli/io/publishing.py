"""Outputs in object storage: made in a local staging folder, then published whole or never.

The engines write an ``-o`` URI (and its ``--errors``) as they write a local output, in a staging
folder (``StagedOutput``: ``<pcd cache>/outputs/<16 hex of the URI's SHA-256>/``), checkpoints
included; ``publish_staged`` uploads the errors file, then the output last, each with
``upload_atomic``: a temporary key beside the target, one server-side copy, the temporary key
removed, so a run killed at any moment, SIGKILL included, leaves no partial object at the URI.
``check_output_uri`` refuses, before any model loads, an output the store will not take.
Opening, listing and the store's failures as one line are ``pcd_cli.io.storage``'s; only the
engines use this module.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs

from ..errors import InputError, MachineError
from .storage import (STORE_ERRORS, Location, check_bucket, message_head, open_location, sibling, store_error,
                      uri_name)

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
        raise InputError(f"{message_head(option, uri)}: name an object in a bucket, e.g. s3://bucket/out/labels.parquet")
    folder, _, name = location.path.rpartition("/")
    fs = location.filesystem
    try:
        info = fs.get_file_info(location.path)
    except STORE_ERRORS as exc:
        raise store_error(exc, uri, option=option, what="cannot write") from None
    if info.type == pafs.FileType.Directory:
        raise InputError(f"{message_head(option, uri)} is a prefix holding objects; give an object name, e.g. "
                         f"{uri.rstrip('/') + '/labels.parquet'!r}")
    check_bucket(location, option)  # before writing: some stores create a missing bucket on write
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
