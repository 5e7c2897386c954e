"""Checkpointed runs: finished batches kept as part files in a work directory, with a manifest.

A run writes into ``<output folder>/.<output name>.pcd-work/``::

    manifest.json               fingerprint of the job, parts committed, counts, and the
                                SHA-256 of the raw input bytes of the rows committed
    part-000000.parquet         labelled rows of the first committed batch (output columns)
    part-000000.errors.jsonl    its failed rows (only when there are some)
    part-000000.trace.jsonl     its traces (only with --trace)
    lock                        flock-ed by the process running the job

A part is written under a temporary name, flushed to disk and renamed; then the manifest
is replaced atomically (write, fsync, rename). A process killed at any moment (SIGKILL
included) therefore leaves a manifest that counts only complete parts; files beyond it are
deleted on resume and their batch is decoded again. A resumed run reads past the committed
rows and checks their raw bytes against the manifest's hash (``pcd_cli.io.readers.RecordReader``):
an input edited in place (same size, mtime kept) discards the work instead of splicing old
labels into the new output. The final outputs are assembled from the parts, flushed to
disk, and renamed into place only when every input row is done; then the work directory is
removed.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import InputError
from ..io.files import AtomicFile, atomic_writer, clear_stale, machine_errors, write_atomic, write_target
from ..io.output import ParquetSink
from ..io.publishing import publish_staged

try:  # POSIX; elsewhere runs are not protected against a second process on the same output
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None

#: 2: ``progress.input_sha256`` added (format 1 folders are discarded with a note).
MANIFEST_FORMAT = 2
#: Rows per row group of the final Parquet file (parts are small; the output is not).
FINAL_ROW_GROUP_ROWS = 65_536


@dataclass
class Progress:
    """What the committed parts hold. ``rows`` = input rows done = ``records + failures``;
    ``input_sha256``: the running hash of those rows' raw bytes (``RecordReader.digest``);
    ``reused``, ``deduplicated``: records copied rather than decoded (``pcd_cli.engines.reuse``);
    ``partly_reused``: records whose unchanged fields were copied, the others decoded;
    ``redo``: the last rows done that a resumed run labels again and drops, so that the group of
    records decoded together across the commit is decoded whole (``ReusingLabeler.redo_for``);
    ``model_rows``, ``forward_passes``, ``seconds``: what labelling cost so far, summed over every
    run of this work folder up to its last commit (rows decoded by the model, forward passes,
    wall seconds), so a resumed run's summary can show the whole run's cost."""

    parts: int = 0
    rows: int = 0
    records: int = 0
    failures: int = 0
    truncated: int = 0
    input_sha256: str = ""
    reused: int = 0
    deduplicated: int = 0
    redo: int = 0
    partly_reused: int = 0
    model_rows: int = 0
    forward_passes: int = 0
    seconds: float = 0.0


def work_dir_for(output: str | Path) -> Path:
    """The work directory of the run writing ``output``: a hidden folder next to it."""
    output = Path(output)
    return output.with_name(f".{output.name}.pcd-work")


def _jsonl(rows: list[dict]) -> bytes:
    return b"".join(orjson.dumps(row, default=str) + b"\n" for row in rows)


def _held_by_another(output: str | Path, work: Path) -> InputError:
    return InputError(f"another pcd run is writing {str(output)!r} (its work folder {str(work)!r} is locked); "
                      "wait for it to finish")


def check_unlocked(output: str | Path) -> None:
    """Refuse at once, before a model loads, to start while another run holds ``output``'s work
    folder. ``WorkDir.open`` checks again when it takes the lock (the race between the two is
    harmless: the later check refuses). A lock left by a killed run is not held: the kernel
    releases ``flock`` locks when their process dies.

    Raises:
        InputError: another process holds the lock.
    """
    lock = work_dir_for(output) / "lock"
    if fcntl is None or not lock.is_file():
        return
    try:
        fh = lock.open("a+")
    except OSError:
        return
    with fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise _held_by_another(output, lock.parent) from None
        fcntl.flock(fh, fcntl.LOCK_UN)


class WorkDir:
    """The work directory of one job (see the module docstring).

    Use ``WorkDir.open``; call ``close()`` (or use it as a context manager) to release the lock.

    Attributes:
        path: the folder. progress: counts of the committed parts.
        discarded: why an earlier unfinished run's parts were thrown away (``None`` if not).
    """

    def __init__(self, path: Path, fingerprint: dict, arrow_schema: pa.Schema, lock_fh):
        self.path = path
        self.fingerprint = fingerprint
        self.arrow_schema = arrow_schema
        self.progress = Progress()
        self.discarded: str | None = None
        self._lock_fh = lock_fh

    # -- opening ----------------------------------------------------------------------------
    @classmethod
    def open(cls, output: str | Path, fingerprint: dict, arrow_schema: pa.Schema, *, resume: bool) -> "WorkDir":
        """Take the work directory of ``output``: continue it (``resume`` and same fingerprint) or start afresh.

        Args:
            fingerprint: JSON-able description of everything that decides the output (input
                file, schema, model, options); a resumed run must match it exactly.
            arrow_schema: the output's columns (without file metadata).

        Raises:
            InputError: the folder cannot be created, or another process holds its lock.
        """
        path = work_dir_for(output)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(f"-o {str(output)!r}: cannot create the work folder {str(path)!r} "
                             f"({exc.strerror})") from exc
        try:
            lock_fh = (path / "lock").open("a+")
        except FileNotFoundError:  # a run finishing this instant removed the folder
            raise InputError(f"another pcd run was writing {str(output)!r} just now; run again") from None
        if fcntl is not None:
            try:
                fcntl.flock(lock_fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                lock_fh.close()
                raise _held_by_another(output, path) from None
        try:
            same = os.fstat(lock_fh.fileno()).st_ino == (path / "lock").stat().st_ino
        except FileNotFoundError:
            same = False
        if not same:  # the run that held it finished and removed the folder meanwhile
            lock_fh.close()
            raise InputError(f"another pcd run was writing {str(output)!r} just now; run again")
        work = cls(path, fingerprint, arrow_schema, lock_fh)
        try:  # the lock is released (its file closed) if taking the folder fails after this
            work._take(output, resume)
        except BaseException:
            work.close()
            raise
        return work

    def _take(self, output: str | Path, resume: bool) -> None:
        """``open``'s second half, under the lock: clear a killed run's temporary output, then
        continue, or reset, the folder's committed parts (``discarded`` says why)."""
        final = write_target(output)
        for stray in final.parent.glob(f".{final.name}.*.tmp"):
            stray.unlink(missing_ok=True)  # the final Parquet of a run killed while writing it
        manifest = self._read_manifest()
        if manifest is None:
            self._reset()
        elif manifest.get("format") != MANIFEST_FORMAT:
            self.discarded = ("the unfinished run was made by another version of pcd; its work was discarded "
                              "and the run starts over")
            self._reset()
        elif not resume:
            self.discarded = (f"an unfinished run's {manifest['progress']['rows']} rows were discarded "
                              "(pass --resume to continue one)")
            self._reset()
        elif manifest.get("fingerprint") != self.fingerprint:
            old = manifest.get("fingerprint") or {}
            changed = sorted(k for k in set(old) | set(self.fingerprint) if old.get(k) != self.fingerprint.get(k))
            self.discarded = (f"the unfinished run was for a different {', '.join(changed)}; "
                              f"its {manifest['progress']['rows']} rows were discarded and the run starts over")
            self._reset()
        else:
            self.progress = Progress(**manifest["progress"])
            self._remove_uncommitted()

    def _read_manifest(self) -> dict | None:
        try:
            manifest = orjson.loads((self.path / "manifest.json").read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return None
        if not isinstance(manifest, dict) or not isinstance(manifest.get("progress"), dict):
            return None
        return manifest

    def restart(self, reason: str) -> None:
        """Discard the committed parts (the input they came from has changed): ``reason`` says why."""
        self.discarded = (f"{reason}; the unfinished run's {self.progress.rows} rows were discarded and the run "
                          "starts over")
        self._reset()

    def _part_files(self) -> list[Path]:
        return [p for p in self.path.iterdir() if p.name.startswith("part-") or p.name.endswith(".tmp")]

    def _reset(self) -> None:
        for p in self._part_files():
            p.unlink()
        self.progress = Progress()
        self._write_manifest()

    def _remove_uncommitted(self) -> None:
        done = {self._part(i, ext).name for i in range(self.progress.parts)
                for ext in (".parquet", ".errors.jsonl", ".trace.jsonl")}
        for p in self._part_files():
            if p.name not in done:
                p.unlink()

    def _part(self, index: int, ext: str) -> Path:
        return self.path / f"part-{index:06d}{ext}"

    def _write_manifest(self) -> None:
        data = {"format": MANIFEST_FORMAT, "fingerprint": self.fingerprint, "progress": asdict(self.progress)}
        write_atomic(self.path / "manifest.json", orjson.dumps(data, option=orjson.OPT_INDENT_2))

    # -- committing and reading back ---------------------------------------------------------
    def commit(self, table: pa.Table, errors: list[dict], traces: list[dict], *, truncated: int,
               input_sha256: str = "", reused: int = 0, deduplicated: int = 0, redo: int = 0,
               partly_reused: int = 0, cost: tuple[int, int, float] | None = None) -> None:
        """Make one batch durable: its labelled rows, failed rows and traces, then the manifest.

        ``table`` has the output columns; ``rows`` done grow by ``table.num_rows + len(errors)``;
        ``input_sha256`` is the hash of the raw bytes of every row done, this batch's included;
        ``cost``: ``(model_rows, forward_passes, seconds)`` of every run so far, summed
        (``Progress``; ``None`` keeps the last).
        """
        index = self.progress.parts
        part = AtomicFile(self._part(index, ".parquet"))
        try:
            with machine_errors(part.path):
                pq.write_table(table, part.tmp)
        except BaseException:
            part.abort()
            raise
        part.commit()
        if errors:
            write_atomic(self._part(index, ".errors.jsonl"), _jsonl(errors))
        if traces:
            write_atomic(self._part(index, ".trace.jsonl"), _jsonl(traces))
        p = self.progress
        self.progress = Progress(parts=index + 1, rows=p.rows + table.num_rows + len(errors),
                                 records=p.records + table.num_rows, failures=p.failures + len(errors),
                                 truncated=p.truncated + truncated, input_sha256=input_sha256,
                                 reused=p.reused + reused, deduplicated=p.deduplicated + deduplicated, redo=redo,
                                 partly_reused=p.partly_reused + partly_reused,
                                 **dict(zip(("model_rows", "forward_passes", "seconds"),
                                            cost or (p.model_rows, p.forward_passes, p.seconds))))
        self._write_manifest()

    def tables(self) -> Iterator[pa.Table]:
        """The committed parts' tables, in input order."""
        for i in range(self.progress.parts):
            yield pq.read_table(self._part(i, ".parquet"), schema=self.arrow_schema)

    def failed_rows(self) -> list[int]:
        """Input rows (from 0) of the committed failed rows, in order."""
        rows = []
        for i in range(self.progress.parts):
            errors = self._part(i, ".errors.jsonl")
            if errors.is_file():
                rows += [orjson.loads(line).get("row") for line in errors.read_bytes().splitlines()]
        return rows

    def committed_ids(self) -> Iterator[object]:
        """Ids of the committed rows, labelled and failed (``None`` where unreadable), part by part."""
        for i in range(self.progress.parts):
            yield from pq.read_table(self._part(i, ".parquet"), schema=self.arrow_schema).column(0).to_pylist()
            errors = self._part(i, ".errors.jsonl")
            if errors.is_file():
                for line in errors.read_bytes().splitlines():
                    yield orjson.loads(line).get("record")

    def _concat(self, ext: str, target: Path) -> bool:
        """Concatenate the parts' ``ext`` files into ``target``, flushed to disk, renamed into
        place; False if there are none."""
        sources = [p for p in (self._part(i, ext) for i in range(self.progress.parts)) if p.is_file()]
        if not sources:
            return False
        with atomic_writer(target) as out:  # flushed to disk before the folder holding the parts goes
            for src in sources:
                with src.open("rb") as fh:
                    shutil.copyfileobj(fh, out)
        return True

    def write_errors(self, target: Path) -> bool:
        """Write the committed parts' failed rows to ``target``; False (nothing written) if none."""
        return self._concat(".errors.jsonl", target)

    def finish(self, output: Path, *, errors_path: Path, trace_path: Path | None, metadata: dict[str, str]) -> None:
        """Assemble the final outputs from the parts, rename them into place, remove the folder.

        Each file is written whole or not at all, through a symlink to its target
        (``pcd_cli.io.files``); an errors or trace file of an earlier run is cleared when this run
        has none (``clear_stale``). A staged output (``-o`` in object storage:
        ``pcd_cli.io.publishing.StagedOutput``) is then uploaded, errors first, before the parts go.

        Raises:
            MachineError: a file cannot be written, or the store failed the upload (the parts
                stay, for ``--resume``).
        """
        schema = self.arrow_schema.with_metadata({k.encode(): v.encode() for k, v in metadata.items()})
        sink = ParquetSink(output, schema)
        try:
            pending: list[pa.Table] = []
            rows = 0
            for table in self.tables():
                pending.append(table)
                rows += table.num_rows
                if rows >= FINAL_ROW_GROUP_ROWS:
                    sink.write_table(pa.concat_tables(pending))
                    pending, rows = [], 0
            if pending:
                sink.write_table(pa.concat_tables(pending))
            if not self.write_errors(errors_path):
                clear_stale(errors_path)  # an earlier run's errors would mislead
            if trace_path is not None and not self._concat(".trace.jsonl", trace_path):
                clear_stale(trace_path)
        except BaseException:
            sink.abort()
            raise
        sink.close()  # the Parquet output last: its presence means the run is complete
        publish_staged(output, errors=errors_path)  # object storage: uploaded whole, the parts kept until then
        shutil.rmtree(self.path, ignore_errors=True)
        self.close()

    def discard(self) -> None:
        """Remove the folder and release the lock: there is nothing worth resuming."""
        self.progress = Progress()
        self.close()

    def close(self) -> None:
        """Release the lock. The folder stays for a later ``--resume`` if it holds a part."""
        if self._lock_fh is None:
            return
        if self.progress.parts == 0:
            shutil.rmtree(self.path, ignore_errors=True)  # nothing to resume
        self._lock_fh.close()
        self._lock_fh = None

    def __enter__(self) -> "WorkDir":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
