"""The Ray engine: the same ``Labeler`` in a pool of Ray Data actors (``pcd label --engine ray``).

A run is four Ray Data steps; the driver (the ``pcd`` process) only plans and collects:

1. **read**: one Ray task per input file runs pcd's own reader (``io.read_records``), so rows,
   failures, their messages and line numbers are exactly the local engine's. Ray's
   ``read_json``/``read_csv`` are not used: pyarrow's JSON and CSV readers fail a whole block
   on one bad row and do not say which line it was. The parsed rows (id, text, or the
   reason the row is unusable) are materialized in Ray's object store.
2. **number**: with several input files, rows are numbered across them in file order (per-file
   counts -> offsets), as if the files were one.
3. **label**: ``map_batches`` with a callable class (an actor pool of ``workers`` actors).
   Each actor builds one ``Labeler`` (loads the model from its own disk, compiles the schema,
   prefills the head) and then labels batches of ``batch_size`` rows; only rows and small
   options travel. Rows are cut in order into blocks (several per worker; a block is what an
   actor takes at a time). An actor that dies is restarted and its block redone, up to
   ``max_retries`` times (Ray's ``max_restarts`` and ``max_task_retries``); a batch's output
   exists only once its task succeeded, so every row is in the output exactly once. Past the
   retries the run fails (``EngineError``) and writes nothing.
4. **write**: labelled rows -> a folder of Parquet files with the local engine's columns,
   types and key-value metadata (``output.output_schema``/``output.results_table``); failed rows ->
   the errors JSONL (driver). Both are written under temporary names and renamed when
   complete; a failed run leaves an earlier output as it was. An ``-o`` in object storage
   (``s3://bucket/key.parquet``) is written as the local engine writes one: the driver streams
   the labelled rows, row group by row group, into one Parquet file in the local staging
   folder (``io.publishing.StagedOutput``; ``write_one_file``: the driver, since a cluster's nodes
   do not see its disk), and ``publish_staged`` uploads the errors file, then the output,
   whole or never.

Not the same as the local engine: no checkpoints (``--resume`` is local-only; a failed Ray run
is rerun whole), no ``--trace``, ``--max-errors`` is checked after reading and after
labelling rather than as rows go, and the output is a folder of Parquet files (one Parquet
object in object storage).

``--reuse`` and repeated texts decoded once give the local engine's rows and counts: each
actor labels through a ``reuse.ReusingLabeler`` over the ``--reuse`` files (its own
``job_parts``: one fingerprint), and the driver's ``_copies`` finds the repeats across actors
from the read step's content keys; their values are filled in after the label step
(``_fill_copies``).
"""

from __future__ import annotations

import datetime as _dt
import glob as _glob
import json
import logging
import os
import shutil
import sys
import time
import uuid
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..errors import EngineError, InputError, MissingExtra, NothingLabelled, PcdError, TooManyErrors
from ..io.files import check_writable, clear_stale, write_atomic, write_target
from ..io.output import ParquetSink, base_metadata, output_schema
from ..api import planned_output_schema
from ..job import LabelJob, warnings_from_json
from ..io.readers import InputSpec, check_input, input_files, read_records, row_to_record
from ..io.publishing import publish_staged
from ..io.storage import RERUN_HINT, is_remote, local_path, run_started
from ..results import Record, RecordFailure
from ..schema.model import Schema
from .reuse import (DEDUPLICATED, DEFAULT_DEDUP_KEYS, INPUT_KEY_COLUMN, PARTLY_REUSED, REUSED, Labelled, ReuseIndex,
                    ReusingLabeler, JOB_PARTS_KEY, input_key, keyed_metadata, keyed_schema,
                    read_sources, unmatched_reuse)
from .summary import RunStats

INSTALL_HINT = "pip install 'pcd-cli[ray]'"
#: Times a dead actor is restarted, and times its batch is tried again on the new one.
DEFAULT_MAX_RETRIES = 3
#: Rows handed to an actor at once (the most a dead actor makes Ray redo).
DEFAULT_BATCH_ROWS = 64
#: Blocks of rows per worker at least (when there are rows enough), and batches per block at
#: most: a block is the unit of work an actor takes, and what a dead actor's replacement redoes.
BLOCKS_PER_WORKER = 4
BATCHES_PER_BLOCK = 16
#: Rows per Parquet output file (at least; one file per block when a run is smaller).
ROWS_PER_FILE = 65_536
#: Test-only hook: a path; the first actor batch to find no file there creates it and kills
#: its process (``os._exit``), as a crashed or preempted worker would.
EXIT_ONCE_ENV = "PCD_RAY_TEST_EXIT_ONCE"

#: Columns of the read step (one row per input row).
PARSED_SCHEMA = pa.schema([
    pa.field("file", pa.int32()),    # index of the input file
    pa.field("row", pa.int64()),     # row in its file, from 0
    pa.field("line", pa.int64()),    # 1-based line (JSONL/CSV), null for Parquet
    pa.field("id", pa.string()),     # the record id as text (null when it could not be read)
    pa.field("text", pa.string()),   # the record's text; null for a failed row
    pa.field("error", pa.string()),  # why the row is unusable; null for a record
    pa.field("key", pa.string()),    # the record's content key (reuse.input_key); null for a failed row
])
#: Columns the label step adds to the output columns (dropped before writing).
EXTRA_COLUMNS = (("__pcd_error", pa.string()), ("__pcd_row", pa.int64()), ("__pcd_line", pa.int64()),
                 ("__pcd_file", pa.int32()), ("__pcd_record", pa.string()), ("__pcd_meta", pa.string()),
                 ("__pcd_passes", pa.int64()), ("__pcd_warnings", pa.string()), ("__pcd_notes", pa.string()),
                 ("__pcd_kind", pa.string()), ("__pcd_copy_of", pa.int64()), ("__pcd_reuse", pa.string()))


def require_ray():
    """Import Ray Data, or say how to install it.

    Raises:
        MissingExtra: Ray is not installed (message: ``pip install 'pcd-cli[ray]'``).
    """
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError as exc:
        raise MissingExtra(f"--engine ray needs Ray Data, which is not installed ({exc}); install it with: "
                           f"{INSTALL_HINT}") from None
    return ray


# -- inputs ----------------------------------------------------------------------------------------
def resolve_inputs(input_path: str | Path, fmt: str | None) -> tuple[list[str], str]:
    """INPUT as its files, in the local engine's order, and their one format
    (``pcd_cli.io.readers.input_files``: a file, a folder, a glob, or a URI of any of them); each
    file named as the reader opens it alone (a path as typed, or a URI), its hive partition
    values read from its own path.

    Raises:
        InputError: nothing matches, a store problem, or the files are of several formats.
    """
    files, kinds = input_files(input_path, fmt)
    return [files.name(i) for i in range(len(files.files))], kinds[0][0]


def _read_files(batch: dict, *, spec: InputSpec, fmt: str, chunk: int) -> Iterator[pa.Table]:
    """Read step (a Ray task): the files of ``batch`` as parsed rows, by pcd's own reader."""
    for file_index, path in zip(batch["file"], batch["path"]):
        for items in read_records(str(path), spec, fmt=fmt, batch_size=chunk):
            yield pa.Table.from_pydict({
                "file": [int(file_index)] * len(items),
                "row": [i.row for i in items],
                "line": [i.line for i in items],
                "id": [None if i.id is None else str(i.id) for i in items],  # without --id-field: the row
                "text": [i.text if isinstance(i, Record) else None for i in items],
                "error": [i.error if isinstance(i, RecordFailure) else None for i in items],
                "key": [input_key(i.text) if isinstance(i, Record) else None for i in items],
            }, schema=PARSED_SCHEMA)


def _rows_to_parsed(batch: pa.Table, *, spec: InputSpec) -> pa.Table:
    """A user's dataset rows as parsed rows (``label_dataset``), by the local engine's rules."""
    items = [row_to_record(row, None, None, spec) for row in batch.to_pylist()]
    return pa.Table.from_pydict({
        "file": [0] * len(items), "row": [None] * len(items), "line": [None] * len(items),
        "id": [None if i.id is None else str(i.id) for i in items],
        "text": [i.text if isinstance(i, Record) else None for i in items],
        # row_to_record names the row by position, which a distributed dataset has not: name the id
        "error": [i.error.replace("row None:", "record" + (f" {i.id!r}:" if i.id is not None else ":"), 1)
                  if isinstance(i, RecordFailure) else None for i in items],
        "key": [input_key(i.text) if isinstance(i, Record) else None for i in items],
    }, schema=PARSED_SCHEMA)


# -- the label step ---------------------------------------------------------------------------------
class LabelWorker:
    """One actor of the pool: a ``Labeler`` built once, then called on batches of parsed rows.

    Args:
        schema: the parsed ``Schema`` (small; travels instead of the schema file).
        job: the ``LabelJob`` (``pcd_cli.job``), its examples already drawn; the actor builds its
            ``Labeler`` with ``build_labeler``; ``job.id_field``: the id column's source
            (``None``: row numbers). all_probs: add ``__probs``.
        offsets: first global row number of each input file. limit: keep rows below it.
        exit_once: test-only path (see ``EXIT_ONCE_ENV``).
        reuse: the ``--reuse`` files (``reuse.read_sources``, read once on the driver): the actor
            builds the ``reuse.ReuseIndex`` against its own ``job_parts`` (the one fingerprint)
            and labels each batch through a ``reuse.ReusingLabeler``: a row of the same job's
            earlier output is copied, bit for bit. copies: global row -> the global row of the
            first row with the same text (the driver's dedup, ``_copies``): such a row is not
            decoded; its values are filled in from that row's after the label step.

    Returns (per call): a table with the output columns (``output.output_schema``) and
    ``EXTRA_COLUMNS``: per row its error (null when labelled), global row, line, file and
    record id (JSON), how it was labelled (``reuse.DECODED``/``REUSED``/``DEDUPLICATED``) and
    the row it copies (a deduplicated row, values still null); on the first row the actor's
    metadata (JSON), the forward passes the batch took, the job's warnings
    (``pcd_cli.job.warnings_json``), its notes (a JSON list: ``pcd_cli.engines.local.run_notes``,
    computed on the worker's machine) and what it reused (JSON: the index's ``reuse`` events,
    rows copied per earlier output in this batch).
    """

    def __init__(self, schema: Schema, job: LabelJob, all_probs: bool, offsets: list[int] | None = None,
                 limit: int | None = None, exit_once: str | None = None, reuse: list | None = None,
                 copies: dict[int, int] | None = None):
        from ..api import build_labeler
        from ..job import warnings_json

        self.labeler = build_labeler(schema, job)
        self.id_field, self.offsets, self.limit, self.exit_once = job.id_field, offsets, limit, exit_once
        self.value_schema = self.labeler.output_schema(job.id_field or "row",
                                                       pa.string() if job.id_field else pa.int64(),
                                                       all_probs=all_probs)
        self.arrow_schema = keyed_schema(self.value_schema)  # the content key last (pcd_cli.engines.reuse)
        meta = self.labeler.metadata() | keyed_metadata(self.labeler.job_parts())
        meta.pop("pcd.created_utc", None)  # the driver stamps the run's own time
        self.meta = json.dumps(meta, sort_keys=True)
        self.warnings = warnings_json(self.labeler.warnings)
        from .local import run_notes

        self.notes = json.dumps(run_notes(self.labeler, job))
        self.reuse_events: list = []
        self.index = ReuseIndex(reuse, self.labeler.job_parts(), self.arrow_schema,
                                on_event=lambda *event: self.reuse_events.append(event),
                                fields=self.labeler.per_field_names(), schema=self.labeler.schema) if reuse else None
        self.copies = copies or {}

    def _maybe_exit(self) -> None:
        if not self.exit_once:
            return
        try:
            fd = os.open(self.exit_once, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        os.close(fd)
        os._exit(1)  # the test hook: die as a killed worker would, mid-run

    def __call__(self, batch: pa.Table) -> pa.Table:
        self._maybe_exit()
        items: list[Record | RecordFailure] = []
        files: list[int] = []
        for r in batch.to_pylist():
            row = r["row"] if r["row"] is None or self.offsets is None else self.offsets[r["file"]] + r["row"]
            if self.limit is not None and row is not None and row >= self.limit:
                continue
            rid = r["id"] if self.id_field else (None if r["id"] is None else row)  # a failure may have no id
            items.append(Record(rid, r["text"], row, r["line"]) if r["error"] is None else
                         RecordFailure(rid, r["error"], row, r["line"]))
            files.append(r["file"])
        before = self.labeler.forward_passes
        if self.index is not None:
            self.index.copied = {}
        # a copy of an earlier row whose text no earlier output holds waits for that row's values;
        # every other row goes through the ReusingLabeler (reused, or decoded in groups)
        waits = {k for k, i in enumerate(items) if isinstance(i, Record) and i.row in self.copies
                 and (self.index is None or (found := self.index.find(input_key(i.text))) is None or found[0].decode)}
        rows_labeller = ReusingLabeler(self.labeler, self.arrow_schema, self.index, dedup_keys=0)
        fed = [i for k, i in enumerate(items) if k not in waits]
        labelled_rows = iter(rows_labeller.feed(fed) + rows_labeller.flush())
        entries = [Labelled(i, kind=DEDUPLICATED) if k in waits else next(labelled_rows) for k, i in enumerate(items)]
        passes = self.labeler.forward_passes - before
        done = [(e, f) for e, f in zip(entries, files) if e.kind == DEDUPLICATED and e.result is None
                or isinstance(e.result, dict)]
        failed = [(e, f) for e, f in zip(entries, files) if isinstance(e.result, RecordFailure)]
        labelled = pa.Table.from_pylist([e.result if isinstance(e.result, dict) else
                                         {self.arrow_schema.names[0]: e.item.id, INPUT_KEY_COLUMN: input_key(e.item.text)}
                                         for e, _ in done], schema=self.arrow_schema)
        # failed rows keep their id (when it could be read) in the id column (the first); all else null
        nulls = pa.table({f.name: pa.array([e.result.id for e, _ in failed], f.type) if k == 0 else
                          pa.nulls(len(failed), f.type) for k, f in enumerate(self.arrow_schema)},
                         schema=self.arrow_schema)
        rows = [(e.item, f, e.result) for e, f in done + failed]
        kinds = [e.kind for e, _ in done + failed]
        reuse_said = json.dumps({"events": self.reuse_events, "reused": self.index.reused_metadata()}) \
            if self.index is not None else None
        extras = {
            "__pcd_kind": kinds,
            "__pcd_copy_of": [self.copies[e.item.row] if e.kind == DEDUPLICATED and e.result is None else None
                              for e, _ in done + failed],
            "__pcd_reuse": [reuse_said] + [None] * (len(rows) - 1) if rows else [],
            "__pcd_error": [None] * len(done) + [e.result.error for e, _ in failed],
            "__pcd_row": [i.row for i, _, _ in rows], "__pcd_line": [i.line for i, _, _ in rows],
            "__pcd_file": [f for _, f, _ in rows],
            "__pcd_record": [orjson.dumps(res.id if isinstance(res, RecordFailure) else i.id, default=str).decode()
                             for i, _, res in rows],
            "__pcd_meta": [self.meta] + [None] * (len(rows) - 1) if rows else [],
            "__pcd_passes": [passes] + [None] * (len(rows) - 1) if rows else [],
            "__pcd_warnings": [self.warnings] + [None] * (len(rows) - 1) if rows else [],
            "__pcd_notes": [self.notes] + [None] * (len(rows) - 1) if rows else [],
        }
        table = pa.concat_tables([labelled, nulls])
        for name, kind in EXTRA_COLUMNS:
            table = table.append_column(pa.field(name, kind), pa.array(extras[name], kind))
        return table


def _label_step(parsed, schema: Schema, job: LabelJob, *, all_probs: bool, workers: int, worker_cpus: float,
                worker_gpus: float, batch_size: int, max_retries: int, offsets: list[int] | None = None,
                limit: int | None = None, reuse: list | None = None, copies: dict[int, int] | None = None):
    import ray.data

    with warnings.catch_warnings():  # Ray 2.60 names no parameter for the retries yet; remote args still work
        warnings.filterwarnings("ignore", message=".*ray_remote_args.*deprecated")
        return parsed.map_batches(
            LabelWorker, batch_format="pyarrow", batch_size=batch_size,
            compute=ray.data.ActorPoolStrategy(size=workers), num_cpus=worker_cpus, num_gpus=worker_gpus or None,
            fn_constructor_kwargs={"schema": schema, "job": job, "all_probs": all_probs, "offsets": offsets,
                                   "limit": limit, "exit_once": os.environ.get(EXIT_ONCE_ENV), "reuse": reuse,
                                   "copies": copies},
            max_restarts=max_retries, max_task_retries=max_retries)


def _public_columns(batch: pa.Table) -> pa.Table:
    """The output columns and ``__error`` (``label_dataset``'s result)."""
    keep = [n for n in batch.column_names if not n.startswith("__pcd_")]
    return batch.select(keep).append_column("__error", batch.column("__pcd_error"))


def label_dataset(ds, schema: Schema | str | Path, *, job: LabelJob | None = None, all_probs: bool = False,
                  workers: int = 1, worker_cpus: float = 1.0, worker_gpus: float = 0.0,
                  batch_size: int = DEFAULT_BATCH_ROWS, max_retries: int = DEFAULT_MAX_RETRIES, **options):
    """Label the rows of a Ray Dataset with a pool of ``workers`` actors; lazy, like any Ray Dataset.

    Rows become records by ``pcd label``'s rules (``text_field`` or ``template`` over columns;
    ids from ``id_field``). The labelling options are a ``pcd_cli.job.LabelJob`` (``job``), or its
    fields as keywords (``model``, ``dtype``, ``scoring``, ``text_field``, ``id_field``,
    ``calibration``, ...); each actor builds its own ``Labeler`` from it with ``build_labeler``,
    so a model path must exist on every node; the calibration file is read here and its content
    travels with the job (``LabelJob.for_workers``).

    Returns:
        A ``ray.data.Dataset`` with ``pcd label``'s output columns plus ``__error``: null for
        a labelled row, else why the row failed (then only its id is set). One output row per
        input row.

    Raises:
        MissingExtra: Ray is not installed. InputError: ``id_field`` not given, bad ``template``,
        an unknown option. SchemaError: the schema file is invalid.
    """
    require_ray()
    from ..schema.load import load_schema

    unknown = sorted(set(options) - set(LabelJob.options()))
    if unknown:
        raise InputError(f"label_dataset: unknown option {unknown[0]!r} (the options of pcd_cli.job.LabelJob: "
                         f"{', '.join(LabelJob.options())})")
    job = replace(job, **options) if job is not None else LabelJob(**options)
    if not job.id_field:
        raise InputError("label_dataset needs id_field=<column with the record ids>: a Ray Dataset has no "
                         "row numbers to name rows by")
    schema = schema if isinstance(schema, Schema) else load_schema(schema)
    job = job.for_workers(schema)
    parsed = ds.map_batches(_rows_to_parsed, batch_format="pyarrow", fn_kwargs={"spec": job.input_spec()})
    labelled = _label_step(parsed, schema, job, all_probs=all_probs, workers=workers, worker_cpus=worker_cpus,
                           worker_gpus=worker_gpus, batch_size=batch_size, max_retries=max_retries)
    return labelled.map_batches(_public_columns, batch_format="pyarrow")


# -- the whole job ------------------------------------------------------------------------------------
@dataclass
class RayRun:
    """What a Ray run did. ``stats.seconds`` is the label step alone; ``startup_seconds`` the
    time to start (or join) Ray; ``address`` where it ran (``local`` for a Ray started for the run)."""

    stats: RunStats
    startup_seconds: float
    address: str
    workers: int
    #: the job's warnings (``pcd_cli.job.JobWarning``), as the workers' labelers gave them, each once
    warnings: list = field(default_factory=list)
    #: the workers' notes (``pcd_cli.engines.local.run_notes``), each once
    notes: list = field(default_factory=list)


def connect(address: str | None) -> tuple[bool, float]:
    """Join the Ray cluster at ``address``, or start a local Ray for this run (no dashboard).

    Returns ``(started_here, seconds)``; a Ray already initialised in this process is reused.

    Raises:
        MissingExtra: Ray is not installed. EngineError: the cluster cannot be reached.
    """
    ray = require_ray()
    if ray.is_initialized():
        return False, 0.0
    started = time.perf_counter()
    if not address:
        _become_subreaper()
    try:
        ray.init(address=address or "local", include_dashboard=False, logging_level=logging.WARNING,
                 log_to_driver=False, configure_logging=True)
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
        raise EngineError(f"--ray-address {address!r}: cannot join the Ray cluster ({str(exc).splitlines()[0]})"
                          if address else f"cannot start a local Ray ({str(exc).splitlines()[0]})") from exc
    return True, time.perf_counter() - started


def _become_subreaper() -> None:
    """Make this process the Linux "child subreaper" of what it starts (``prctl(2)``,
    ``PR_SET_CHILD_SUBREAPER``): a Ray worker orphaned when its raylet exits is reparented here,
    not to init, so ``stop_local_ray`` can wait for it, kill it and reap it. Elsewhere a no-op."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # 36: PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def stop_local_ray(ray, grace_s: float = 10.0) -> list[int]:
    """Shut down the local Ray this process started, and everything it started with it.

    ``ray.shutdown()`` stops the head's processes, but a worker busy at that moment (loading
    a model) outlived it here, orphaned, holding its memory: a nightly cron job would pile them
    up. So the processes below this one are listed first; after the shutdown, each still alive
    gets ``grace_s`` seconds, then SIGTERM, then SIGKILL, and is reaped (this process is their
    subreaper: ``_become_subreaper``).

    Returns:
        The ids of the processes that had to be terminated or killed (empty when Ray stopped
        them all itself).
    """
    import psutil

    try:
        below = psutil.Process().children(recursive=True)
    except psutil.Error:
        below = []
    ray.shutdown()
    _gone, alive = psutil.wait_procs(below, timeout=grace_s)
    forced = [p.pid for p in alive]
    for signal_them in (psutil.Process.terminate, psutil.Process.kill):
        for p in alive:
            try:
                signal_them(p)
            except psutil.Error:
                pass
        _gone, alive = psutil.wait_procs(alive, timeout=3.0)
    return forced


def _pcd_cause(exc: BaseException) -> PcdError | None:
    """A pcd error raised inside a Ray task or actor, found in the exceptions Ray wraps it in."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, PcdError) and type(e).__module__.startswith("pcd_cli"):
            return e
        todo += [getattr(e, "cause", None), e.__cause__, e.__context__]
    return None


def _run_step(what: str, fn: Callable[[], Any], max_retries: int) -> Any:
    """Run one Ray Data step; a pcd error from a worker is re-raised as itself, anything else
    (a worker dead past its retries, a lost node) as ``EngineError`` with Ray's reason."""
    try:
        return fn()
    except PcdError:
        raise
    except Exception as exc:  # noqa: BLE001 - Ray wraps worker failures in many types; none is swallowed
        cause = _pcd_cause(exc)
        if cause is not None:
            raise cause from None
        reason = _reason(exc)
        raise EngineError(f"the {what} step failed on Ray (a worker that dies is restarted and its batch redone "
                          f"up to {max_retries} times; past that the run stops): {reason}. Nothing was "
                          "written; an earlier output is left as it was") from exc


def _reason(exc: BaseException) -> str:
    """The innermost informative cause of a Ray failure, in one line (``ActorDiedError: ...``)."""
    chain = [exc]
    while len(chain) < 20:
        inner = getattr(chain[-1], "cause", None) or chain[-1].__cause__
        if not isinstance(inner, BaseException) or inner in chain:
            break
        chain.append(inner)
    for e in reversed(chain):
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        if lines:
            return f"{type(e).__name__}: {lines[0]}"[:500]
    return type(exc).__name__


def check_outputs(files: list[str], input_path: str | Path, output: Path, errors_path: Path, *,
                  one_file: bool = False) -> None:
    """Refuse outputs that would overwrite an input, land inside an input folder, or cannot be written.

    Args:
        one_file: the output is one Parquet file (the staged file of an object-storage output,
            ``run_label_job``), not a folder.

    Raises:
        InputError: names the option and the problem; an object-storage path (``run_label_job``
            stages those locally first: only local paths come here).
    """
    for option, path in (("-o", output), ("--errors", errors_path)):
        if is_remote(path):
            raise InputError(f"{option} {str(path)!r}: label_files writes local paths; pcd label --engine ray "
                             "(run_label_job) stages an object-storage output and uploads it whole")
    output, errors_path = Path(output), Path(errors_path)
    out, err = output.resolve(), errors_path.resolve()
    sources = {local_path(f).resolve() for f in files if not is_remote(f)}
    folder = None if is_remote(input_path) else local_path(input_path)
    if _glob.has_magic(str(output)) or _glob.has_magic(str(errors_path)):
        raise InputError(f"-o {str(output)!r}: with a glob INPUT, name the output folder (and --errors) yourself")
    if output.is_file() and not one_file:
        raise InputError(f"-o {str(output)!r} is a file; --engine ray writes a folder of Parquet files")
    if out in sources or err in sources:
        raise InputError(f"{'-o' if out in sources else '--errors'} is an input file; choose another path")
    if folder is not None and folder.is_dir() and (folder.resolve() in out.parents or out == folder.resolve()):
        raise InputError(f"-o {str(output)!r} is inside the input folder {str(input_path)!r}: a later run would "
                         "read it as input; choose a path outside it")
    if out == err or out in err.parents:
        raise InputError(f"--errors {str(errors_path)!r} is inside the output folder; choose another path")
    for option, path in (("-o", output), ("--errors", errors_path)):
        check_writable(option, path, folder_ok=option == "-o" and not one_file)


def check_remote_output(uri: str) -> None:
    """Refuse an object-storage ``-o`` that does not name a Parquet object: ``--engine ray``
    writes one there (its parts combined), never a prefix of part files, so a URI ending in
    ``/`` or without ``.parquet``/``.pq`` would not be what its user reads back.

    Raises:
        InputError: names the URI and a ``.parquet`` key to give instead.
    """
    rest = uri.split("://", 1)[-1]
    if "/" in rest and rest.rsplit("/", 1)[1].lower().endswith((".parquet", ".pq")):
        return
    fix = f"{uri}labels.parquet" if uri.endswith("/") else f"{uri}/labels.parquet" if "/" not in rest \
        else f"{uri}.parquet"
    raise InputError(f"-o {uri!r}: --engine ray writes an output in object storage as one Parquet object (not "
                     f"a prefix of part files); name a .parquet key, e.g. {fix!r}")


def _publish(tmp: Path, target: Path) -> None:
    """Put the finished ``tmp`` (file or folder) at ``target``, replacing an earlier one."""
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
        os.replace(target, old)
    os.replace(tmp, target)
    if old is not None:
        shutil.rmtree(old) if old.is_dir() and not old.is_symlink() else old.unlink()


class _PartNames:
    """Output file names that sort in input order: ``part-<write task>-<n>.parquet``."""

    def get_filename_for_task(self, write_uuid: str, task_index: int) -> str:
        return f"part-{task_index:06d}"


def _only_labelled(batch: pa.Table, *, names: list[str]) -> pa.Table:
    return batch.filter(pc.is_null(batch.column("__pcd_error"))).select(names)


def label_files(input_path: str | Path, schema: Schema, spec: InputSpec, job: LabelJob, *,
                output: str | Path, errors_path: str | Path, fmt: str | None = None, all_probs: bool = False,
                min_mass: float = 0.5, address: str | None = None, workers: int = 1, worker_cpus: float = 1.0,
                worker_gpus: float = 0.0, batch_size: int = DEFAULT_BATCH_ROWS,
                max_retries: int = DEFAULT_MAX_RETRIES, max_errors: int | None = None, progress: bool = False,
                on_event: Callable[[str, dict], None] | None = None, reuse: list | None = None,
                dedup_keys: int = DEFAULT_DEDUP_KEYS, one_file: bool = False,
                errors_name: str | None = None) -> RayRun:
    """``pcd label --engine ray``: label every row of INPUT on Ray; each row ends up in the Parquet
    folder ``output`` (or, with ``one_file``, the one Parquet file ``output``) or in
    ``errors_path`` (module docstring: the steps).

    Args:
        input_path: a file, a folder or a glob of JSONL/CSV/Parquet files (one format).
        spec: how rows are read (``job.input_spec(limit=..., csv_delimiter=...)``).
        job: the ``LabelJob``, passed whole to every actor (paths made absolute, examples drawn).
        address: Ray cluster to join (``None``: start a local Ray for the run).
        workers, worker_cpus, worker_gpus: actors in the pool and the resources each reserves.
        batch_size: rows per actor call. max_retries: restarts of a dead actor and retries of its batch.
        max_errors: fail (exit 1) when more rows than this failed; checked after reading and
            after labelling.
        reuse: the ``--reuse`` files (``reuse.read_sources``), sent to every actor (``LabelWorker``);
            dedup_keys: distinct texts the driver remembers to label a repeated text once
            (``_copies``; 0: none). Counted in ``RunStats.reused``/``deduplicated`` as the local
            engine counts them.
        one_file: the labelled rows go to the one Parquet file ``output``, written by the
            driver (``write_one_file``) as the local engine writes it: how ``run_label_job``
            stages an object-storage output. errors_name: how messages name the errors file
            (its URI when staged; default ``errors_path``).

    Returns:
        ``RayRun``; ``stats.read == stats.records + stats.failures`` covers every input row.

    Raises:
        InputError: INPUT or the outputs unusable. MissingExtra: no Ray. EngineError: Ray failed
        (cluster unreachable, workers dead past their retries). ModelError, CompileError,
        CalibrationError: raised by the workers' ``Labeler``. TooManyErrors, NothingLabelled:
        the errors file is written, the output is not.
    """
    emit = on_event or (lambda *_event: None)
    files, kind = resolve_inputs(input_path, fmt)
    check_outputs(files, input_path, output, errors_path, one_file=one_file)
    output, errors_path = Path(output), Path(errors_path)
    for f in files:  # the whole-file checks (columns, header, Parquet footer, JSONL keys) here, before Ray starts
        check_input(f, spec, fmt)
        next(iter(read_records(f, spec, fmt=kind, batch_size=1)), None)
    ray = require_ray()
    started_here, startup = connect(address)
    where = "started a local Ray" if started_here and not address else f"joined {address or 'the running Ray'}"
    emit("ray_started", {"message": f"Ray: {where} in {startup:.1f} s; {workers} worker{'s' * (workers != 1)}, "
                         f"{len(files)} input file{'s' * (len(files) != 1)}", "seconds": round(startup, 3)})
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True  # output files in input order, like the local file
    ctx.enable_progress_bars = progress
    ctx.max_consecutive_actor_init_deaths = max_retries  # a model that cannot load fails the run, not a loop
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    final = write_target(output)  # a symlinked output folder is replaced at its target; the link stays
    tmp_dir = final.with_name(f".{final.name}.pcd-ray-{uuid.uuid4().hex[:8]}")
    try:  # the run has started: a store failing from here on (a worker's read) is exit 5 saying to run again
        with run_started(RERUN_HINT):
            return _job(ray, files, kind, input_path, schema, spec, job.for_workers(schema),
                        output=output, errors_path=errors_path, tmp_dir=tmp_dir, all_probs=all_probs, min_mass=min_mass,
                        workers=workers, worker_cpus=worker_cpus, worker_gpus=worker_gpus, batch_size=batch_size,
                        max_retries=max_retries, max_errors=max_errors, startup=startup,
                        address=(address or "local") if started_here else (address or "running"), reuse=reuse or [],
                        dedup_keys=dedup_keys, emit=emit, one_file=one_file, errors_name=errors_name or str(errors_path))
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        if started_here:
            stop_local_ray(ray)


def run_label_job(schema: Schema | str | Path, input_path: str | Path, job: LabelJob, *, output: Path,
                  errors_path: Path, fmt: str | None = None, limit: int | None = None, csv_delimiter: str = ",",
                  all_probs: bool = False, min_mass: float = 0.5, resume: bool = False,
                  trace_path: Path | None = None, max_errors: int | None = None, progress: bool = False,
                  address: str | None = None, workers: int = 1, worker_cpus: float = 1.0, worker_gpus: float = 0.0,
                  batch_size: int = DEFAULT_BATCH_ROWS, on_event: Callable | None = None,
                  reuse: list[str] | None = None, dedup_keys: int = DEFAULT_DEDUP_KEYS):
    """``pcd label --engine ray``'s whole job: the same job and checks as the local engine
    (``pcd_cli.engines.local.run_label_job``), run by ``label_files``; the job's warnings are told
    to ``on_event`` once, after the run (the workers build the labelers).

    An ``output`` in object storage (``s3://bucket/key.parquet``, any ``pyarrow.fs`` URI) is
    staged as the local engine stages it (``local.stage_outputs``: under
    ``<pcd cache>/outputs/<sha256 of the URI>/``, the store checked before Ray starts), the
    labelled rows streamed there by the driver into one Parquet file (``write_one_file``), then
    uploaded by the same ``publishing.publish_staged``: the errors file first, the output last,
    whole or never. The staged files and their folder are removed whether the upload worked or
    not (no ``--resume`` here); a store failing mid-run says to run again (``storage.run_started``
    with ``RERUN_HINT``).

    Returns:
        ``pcd_cli.engines.local.JobRun`` (statistics and warnings).

    Raises:
        InputError: ``--resume`` or ``--trace`` (the local engine's), standard input, an
        object-storage ``-o`` that is not a ``.parquet`` key or that the store refuses (exit
        2, before Ray); see ``label_files``. MachineError: the upload failed (exit 5).
    """
    from ..job import schema_warnings
    from ..schema.load import load_schema
    from .local import JobRun, id_column
    from ..io.output import check_columns

    emit = on_event or (lambda _name, _fields, _level="info": None)
    if resume:
        raise InputError("--resume is for the local engine only: a Ray run keeps no checkpoints (a failed "
                         "run is rerun whole); drop --resume or --engine ray")
    if trace_path is not None:
        raise InputError("--trace is for the local engine only; drop it or --engine ray")
    if str(input_path) == "-":
        raise InputError("--engine ray reads files, not standard input; write the input to a file")
    if output is None:
        raise InputError(f"{str(input_path)!r}: name the output folder with -o (a glob or an object-storage "
                         "input has no folder to put it beside)")
    from .local import stage_outputs

    if is_remote(output):
        check_remote_output(str(output))
    # local paths and file:// as they are; object storage staged and uploaded whole, as the local engine does
    output, errors_path, staged = stage_outputs(output, errors_path, None)
    spec = job.input_spec(limit=limit, csv_delimiter=csv_delimiter)
    parsed = schema if isinstance(schema, Schema) else load_schema(schema)
    run = JobRun()
    for warning in schema_warnings(parsed):
        run.warn(warning, emit)
    # the columns here; inputs (files, folders, globs) and the output folder in label_files
    check_columns(parsed, id_column(spec), all_probs=all_probs)
    try:  # refused here or failed later, nothing staged is kept (finally)
        if staged is not None:
            staged.prepare()  # the bucket, the credentials, the right to write: before Ray and the model
        sources = read_sources(reuse or [])  # before Ray and the model: a file that is not a reusable output is exit 2
        done = label_files(input_path, parsed, spec, job, output=output, errors_path=errors_path, fmt=fmt,
                           all_probs=all_probs, min_mass=min_mass, address=address, workers=workers,
                           worker_cpus=worker_cpus, worker_gpus=worker_gpus, batch_size=batch_size,
                           max_errors=max_errors, progress=progress, on_event=on_event, reuse=sources,
                           dedup_keys=dedup_keys, one_file=staged is not None,
                           errors_name=staged.errors_uri if staged is not None else None)
        if staged is not None:
            with run_started(RERUN_HINT):  # a store failing at the upload: no --resume here
                publish_staged(output, errors=errors_path)  # errors first, output last, whole or never
    except (TooManyErrors, NothingLabelled):
        if staged is not None:
            with run_started(RERUN_HINT):
                publish_staged(output, errors=errors_path, output_too=False)  # the errors say why; no output
        raise
    finally:
        if staged is not None:  # no --resume on Ray: nothing staged is kept, the folder neither
            for path in (output, errors_path):
                path.unlink(missing_ok=True)
            staged.clean()
    for warning in done.warnings:
        run.warn(warning, emit)
    run.stats = done.stats
    run.notes.extend(done.notes)
    return run


def _job(ray, files, kind, input_path, schema, spec, job, *, output, errors_path, tmp_dir, all_probs,
         min_mass, workers, worker_cpus, worker_gpus, batch_size, max_retries, max_errors, startup,
         address, reuse=(), dedup_keys=DEFAULT_DEDUP_KEYS, emit=None, one_file=False, errors_name=None) -> RayRun:
    stats = RunStats(schema, min_mass=min_mass)
    listing = ray.data.from_items([{"file": i, "path": str(f)} for i, f in enumerate(files)],
                                  override_num_blocks=len(files))
    parsed = _run_step("read", lambda: listing.map_batches(
        _read_files, batch_size=1, batch_format="numpy",
        fn_kwargs={"spec": spec, "fmt": kind, "chunk": max(batch_size, 256)}).materialize(), max_retries)
    # Cut the rows into blocks in order: a block is one task for one actor, so there must be
    # several per worker to keep them all busy; a few batches per block on large inputs.
    n_rows = parsed.count()
    blocks = max(1, min(-(-n_rows // batch_size), max(BLOCKS_PER_WORKER * workers,
                                                      -(-n_rows // (BATCHES_PER_BLOCK * batch_size)))))
    parsed = _run_step("read", lambda: parsed.repartition(blocks).materialize(), max_retries)
    offsets = None
    if len(files) > 1:  # number rows across files in file order
        counts = [0] * len(files)
        for batch in parsed.select_columns(["file"]).iter_batches(batch_format="pyarrow", batch_size=None):
            for count in pc.value_counts(batch.column("file")).to_pylist():
                counts[count["values"]] += count["counts"]
        offsets = [sum(counts[:i]) for i in range(len(counts))]
    limit = spec.limit if offsets else None
    copies = _copies(parsed, offsets, limit, dedup_keys)
    started = time.perf_counter()
    labelled = _run_step("label", lambda: _label_step(
        parsed, schema, job, all_probs=all_probs, workers=workers,
        worker_cpus=worker_cpus, worker_gpus=worker_gpus, batch_size=batch_size, max_retries=max_retries,
        offsets=offsets, limit=limit, reuse=list(reuse), copies=copies).materialize(), max_retries)
    if copies:  # the deduplicated rows get their first copy's values (or its failure)
        labelled = _run_step("label", lambda: _fill_copies(labelled, set(copies.values())), max_retries)
    stats.seconds = time.perf_counter() - started
    errors, metas, said, noted = [], set(), set(), {}
    reuse_said, reused = {}, {}  # reused: path -> its pcd.reused entry, summed over the batches
    for batch in labelled.iter_batches(batch_format="pyarrow", batch_size=None):
        kinds = pc.value_counts(batch.filter(pc.is_null(batch.column("__pcd_error"))).column("__pcd_kind")).to_pylist()
        counted = {k["values"]: k["counts"] for k in kinds}
        stats.reused += counted.get(REUSED, 0)
        stats.deduplicated += counted.get(DEDUPLICATED, 0)
        stats.partly_reused += counted.get(PARTLY_REUSED, 0)
        for text in batch.column("__pcd_reuse").to_pylist():
            if text:
                told = json.loads(text)
                reuse_said.update((json.dumps(e, sort_keys=True), e) for e in told["events"])
                for entry in told["reused"]:
                    reused.setdefault(entry["path"], entry | {"rows": 0})["rows"] += entry["rows"]
        names = [n for n in batch.column_names if not n.startswith("__pcd_")]
        ok = pc.is_null(batch.column("__pcd_error"))
        done = batch.filter(ok)
        stats.add_table(done.select(names))
        stats.truncated += int(pc.sum(done.column("__truncated")).as_py() or 0)
        stats.forward_passes += int(pc.sum(batch.column("__pcd_passes")).as_py() or 0)
        metas.update(m for m in batch.column("__pcd_meta").to_pylist() if m)
        said.update(w for w in batch.column("__pcd_warnings").to_pylist() if w)
        noted.update(dict.fromkeys(n for text in batch.column("__pcd_notes").to_pylist() if text
                                   for n in json.loads(text)))
        for r in batch.filter(pc.invert(ok)).to_pylist():
            errors.append({"row": r["__pcd_row"], "line": r["__pcd_line"], "record": orjson.loads(r["__pcd_record"]),
                           "error": r["__pcd_error"]} | ({"file": str(files[r["__pcd_file"]])} if len(files) > 1 else {}))
    errors.sort(key=lambda e: e["row"])
    stats.failures = len(errors)
    stats.decoded = stats.records
    stats.model_rows = stats.records - stats.reused - stats.deduplicated  # copies went through no model
    if len(metas) > 1:
        raise EngineError("the workers built different prompts or models (their metadata differ: "
                          f"{sorted(metas)[:2]}); install the same pcd, model files and options on every node")
    for event in reuse_said.values():
        emit(*event)
    offered = sum(event[1].get("rows", 0) for event in reuse_said.values() if event[0] == "reuse")
    unmatched = unmatched_reuse(offered, sum(e["rows"] for e in reused.values()), stats.records)
    if unmatched:
        emit("reuse", {"message": unmatched, "reason": "no text matched"}, "warning")
    run = RayRun(stats, startup, address, workers,
                 list(dict.fromkeys(w for text in sorted(said) for w in warnings_from_json(text))), list(noted))
    if max_errors is not None and stats.failures > max_errors:
        _write_errors(errors, errors_path)
        raise TooManyErrors(f"{stats.failures} rows failed, more than --max-errors {max_errors}; they are in "
                            f"{errors_name or errors_path}; the output was not written", stats, None)
    if stats.records == 0 and stats.failures:
        _write_errors(errors, errors_path)
        raise NothingLabelled(f"no row could be labelled: all {stats.failures} failed; see "
                              f"{errors_name or errors_path}", stats, None)
    if metas:
        metadata = json.loads(metas.pop())
        arrow_schema = keyed_schema(output_schema(
            schema, spec.id_field or "row", pa.string() if spec.id_field else pa.int64(), all_probs=all_probs,
            calibrated="pcd.calibration_sha256" in metadata, sets=tuple(json.loads(metadata.get("pcd.label_sets", "[]"))),
            abstain=tuple(json.loads(metadata.get("pcd.abstain_fields", "[]"))), spread="pcd.permutations" in metadata,
            steered=metadata.get("pcd.steering_check") == "true"))
    else:  # no row reached a worker (an empty input): the columns by the job's own rule, as the local engine
        metadata = base_metadata(f"{job.model or 'default'} (not loaded: the input has no rows)", schema)
        arrow_schema = keyed_schema(planned_output_schema(schema, job, all_probs=all_probs))
    from .local import input_metadata

    metadata = metadata | {"pcd.created_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")} \
        | stats.metadata(input_metadata(input_path, files))
    if JOB_PARTS_KEY in metadata:  # the workers' fingerprint, with the rows copied (as the local engine's pcd.reused)
        metadata |= keyed_metadata(json.loads(metadata[JOB_PARTS_KEY]),
                                   [e for e in reused.values() if "fields" not in e]
                                   + [e for e in reused.values() if "fields" in e])
    final = arrow_schema.with_metadata({k.encode(): v.encode() for k, v in metadata.items()})
    if one_file:  # the driver streams the rows into one file (renamed into place whole), then the errors
        _run_step("write", lambda: write_one_file(labelled, output, final), max_retries)
        if errors:
            _write_errors(errors, errors_path)
        else:
            clear_stale(errors_path)
        return run
    if stats.records:
        _run_step("write", lambda: labelled.map_batches(
            _only_labelled, batch_format="pyarrow", batch_size=None, fn_kwargs={"names": list(final.names)}
        ).write_parquet(str(tmp_dir), filename_provider=_PartNames(), min_rows_per_file=ROWS_PER_FILE,
                        mode=ray.data.SaveMode.OVERWRITE,  # a fresh temporary folder of this run's own
                        arrow_parquet_args_fn=lambda: {"schema": final}), max_retries)
    else:
        tmp_dir.mkdir(parents=True, exist_ok=True)
        pq.write_table(final.empty_table(), tmp_dir / "part-000000-000000.parquet")
    if errors:
        _write_errors(errors, errors_path)
    else:
        clear_stale(errors_path)  # an earlier run's errors would mislead
    _publish(tmp_dir, write_target(output))  # the output last: its presence means the run is complete
    return run


def write_one_file(labelled, target: Path, schema: pa.Schema) -> int:
    """The labelled rows of the label step's (materialized, ordered) dataset as the one Parquet
    file ``target`` on the driver's disk, as the local engine writes its output (``ParquetSink``:
    renamed into place whole), with ``schema``'s columns and pcd's key-value metadata, in input
    order. Streamed: row groups of at most ``ROWS_PER_FILE`` rows come from Ray one at a time (the
    memory is one row group, not the table). The driver writes it, not the workers, so it holds
    on a cluster whose nodes do not share the driver's disk (the staging folder is on it).

    Returns:
        The rows written.

    Raises:
        MachineError: the file cannot be written (``ParquetSink``); ``target`` is left as it was.
    """
    sink = ParquetSink(target, schema)
    try:
        for batch in labelled.iter_batches(batch_format="pyarrow", batch_size=ROWS_PER_FILE):
            table = _only_labelled(batch, names=list(schema.names))
            sink.write_table(table if table.schema.equals(schema, check_metadata=False) else table.cast(schema))
    except BaseException:
        sink.abort()
        raise
    sink.close()
    return sink.rows


def _copies(parsed, offsets: list[int] | None, limit: int | None, dedup_keys: int) -> dict[int, int]:
    """The driver's dedup: global row -> the global row of the first row with the same content
    key (the read step's ``key``), for every record whose text a row before it had, within the
    last ``dedup_keys`` distinct texts (oldest out, as ``reuse.DedupCache``; 0: no dedup). The
    keys come to the driver (64 bytes per row); the dict holds the copies only.

    Unlike the local engine's cache, the window counts texts an earlier output holds too (the
    driver has no model to compute the job fingerprint), so past ``dedup_keys`` distinct texts
    a copy may be decoded where the local engine shares it; below it the two count the same."""
    if dedup_keys <= 0:
        return {}
    rows, keys = [], []
    for batch in parsed.select_columns(["file", "row", "key"]).iter_batches(batch_format="pyarrow", batch_size=None):
        batch = batch.filter(pc.is_valid(batch.column("key")))
        row = batch.column("row").to_pylist()
        if offsets is not None:
            row = [offsets[f] + r for f, r in zip(batch.column("file").to_pylist(), row)]
        rows += row
        keys += batch.column("key").to_pylist()
    seen: dict[str, int] = {}  # insertion order: the oldest first
    copies = {}
    for row, key in sorted(zip(rows, keys)):
        if limit is not None and row >= limit:
            continue
        first = seen.get(key)
        if first is not None:
            copies[row] = first
            continue
        seen[key] = row
        if len(seen) > dedup_keys:
            del seen[next(iter(seen))]
    return copies


def _fill_copies(labelled, firsts: set[int]):
    """The label step's output with each deduplicated row given its first copy's values under
    its own id (``__pcd_copy_of``), or, when that row failed, its failure (the local engine
    decodes such a copy again on its own; here it fails as its first copy did)."""
    found: dict[int, dict | str] = {}
    for batch in labelled.iter_batches(batch_format="pyarrow", batch_size=None):
        hit = batch.filter(pc.is_in(batch.column("__pcd_row"), pa.array(sorted(firsts), pa.int64())))
        names = [n for n in hit.column_names if not n.startswith("__pcd_")]
        for r in hit.to_pylist():
            found[r["__pcd_row"]] = r["__pcd_error"] or {n: r[n] for n in names[1:]}

    def fill(batch: pa.Table) -> pa.Table:
        if batch.column("__pcd_copy_of").null_count == batch.num_rows:
            return batch
        rows = batch.to_pylist()
        for r in rows:
            first = found.get(r["__pcd_copy_of"]) if r["__pcd_copy_of"] is not None else None
            if isinstance(first, dict):
                r.update(first)
            elif isinstance(first, str):
                r["__pcd_error"] = first
        return pa.Table.from_pylist(rows, schema=batch.schema)

    return labelled.map_batches(fill, batch_format="pyarrow", batch_size=None).materialize()


def _write_errors(errors: list[dict], path: Path) -> None:
    """The errors JSONL, as the local engine writes it (whole or not at all: ``pcd_cli.io.files``)."""
    write_atomic(path, b"".join(orjson.dumps(row, default=str) + b"\n" for row in errors))
