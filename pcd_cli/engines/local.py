"""The main job: stream a file through a ``Labeler`` into Parquet, errors and trace files.

Records are decoded in chunks and committed in batches to a work directory
(``pcd_cli.engines.checkpoint``), so a run that is killed can be resumed and a run that ends early
loses at most the batch in flight. The outputs appear only when every input row is done.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from contextlib import closing, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Callable, Iterator, Sequence

import pyarrow as pa
from tqdm import tqdm

from ..api import Labeler, build_labeler, planned_output_schema
from ..job import OUTPUT_NOT_PARQUET, JobWarning, LabelJob
from ..errors import InputError, Interrupted, NothingLabelled, TooManyErrors
from ..io.files import cache_dir, check_writable, clear_stale
from ..io.output import ParquetSink, base_metadata, check_columns
from ..io.readers import InputSpec, RecordReader, check_input, is_stdin
from ..results import RecordFailure
from ..schema.model import TRUNCATED_COLUMN, Schema
from ..io.publishing import STAGING_ROOT, StagedOutput, publish_staged
from ..io.storage import canonical, is_glob, is_remote, local_path, partition_values, run_started, sibling, uri_name
from .checkpoint import WorkDir, check_unlocked, work_dir_for
from .reuse import (DEDUPLICATED, DEFAULT_DEDUP_KEYS, PARTLY_REUSED, REUSED, Labelled, ReuseIndex, ReuseSource,
                    ReusingLabeler, keyed_metadata, keyed_schema, read_sources)
from .summary import Resumed, RunStats

#: Records per checkpoint (one part file in the work directory) unless told otherwise.
DEFAULT_BATCH_RECORDS = 256
#: Records handed to the decoder at once, counted from row 0 (packing neighbours never depend on
#: --batch-size); a stop request is honoured between chunks.
CHUNK_RECORDS = 16
#: Seconds after which the rows decoded since the last checkpoint are committed at the end of a
#: chunk, however few (issue #45: a 40-row run of long records committed nothing for 16 minutes,
#: waiting for --batch-size rows). Commits change no result: chunks are not tied to them.
CHECKPOINT_SECONDS = 60.0

#: ``on_event(name, fields)``: ``discarded``, ``resumed``, ``checkpoint`` (see ``label_file``).
EventHook = Callable[[str, dict], None]


def default_output(input_path: str | Path) -> Path | None:
    """``<input folder>/<input stem>.labels.parquet`` (a folder ``exports/``: ``exports.labels.parquet``
    beside it); ``None`` for a glob or an object-storage URI (``-o`` names it)."""
    if is_remote(input_path) or is_glob(input_path):
        return None
    path = local_path(input_path)
    return path.with_name(f"{path.stem}.labels.parquet")


def default_errors(output: str | Path) -> Path:
    """``<output folder>/<output stem>.errors.jsonl`` (``x.labels.parquet`` -> ``x.errors.jsonl``)."""
    path = Path(output)
    stem = path.stem[: -len(".labels")] if path.stem.endswith(".labels") else path.stem
    return path.with_name(f"{stem}.errors.jsonl")


def default_errors_uri(output_uri: str) -> str:
    """The errors file of an object-storage output: ``default_errors``'s name beside it
    (``s3://b/out/x.parquet`` -> ``s3://b/out/x.errors.jsonl``)."""
    return sibling(output_uri, default_errors(uri_name(output_uri)).name)


def id_column(spec: InputSpec) -> str:
    """Name of the output's id column: the ``--id-field`` column, else ``row`` (row numbers from 0)."""
    return spec.id_field or "row"


def check_job(schema: Schema, input_path: str | Path, spec: InputSpec, *, output: Path, errors_path: Path,
              trace_path: Path | None, all_probs: bool, fmt: str | None) -> tuple[bool, list[Path]]:
    """Every check of a ``pcd label`` job that needs no model, in the order a user meets them: the
    output columns (``check_columns``), the input (a file, a folder, a glob, a URI, or ``-``; each
    file's header and encoding: ``check_input``), ``-o`` not a folder, the output paths (``check_paths``). The one preflight of
    the CLI and ``label_file``; the Ray engine, whose input may be a folder or glob and whose
    output is a folder, runs ``check_columns`` and then its own ``ray_engine.check_outputs``.

    Returns:
        Whether the input has a row, and the folders created for the outputs.

    Raises:
        SchemaError, InputError: names the option, column or file and the problem.
    """
    check_columns(schema, id_column(spec), all_probs=all_probs)
    has_rows = check_input(input_path, spec, fmt)  # files, header, encoding: before the model
    if output.is_dir():
        raise InputError(f"-o {str(output)!r} is a folder; give a file name, e.g. "
                         f"{str(output / default_output(input_path).name)!r}")
    return has_rows, check_paths(input_path, output, errors_path, trace_path)


def check_paths(input_path: str | Path, output: Path, errors_path: Path, trace_path: Path | None) -> list[Path]:
    """Refuse, before any record is read, output paths that cannot be written or would overwrite the input.

    A missing folder is created (``pcd_cli.io.files.check_writable``); a symlink is checked at
    its target, where the file will be written.

    Returns:
        The folders created, to be reported.

    Raises:
        InputError: names the option and the problem.
    """
    named = {"-o": output, "--errors": errors_path, "--trace": trace_path}
    folder_in = None if is_stdin(input_path) or is_remote(input_path) else local_path(input_path)
    if folder_in is not None and folder_in.is_dir():
        inside = next((o for o, p in named.items() if p is not None and folder_in.resolve() in p.resolve().parents),
                      None)
        if inside is not None:
            raise InputError(f"{inside} {str(named[inside])!r} is inside the input folder {str(input_path)!r}: a "
                             "later run would read it as input; choose a path outside it")
    source = None if is_stdin(input_path) or is_remote(input_path) else local_path(input_path).resolve()
    seen: dict[Path, str] = {}
    created: list[Path] = []
    for option, path in named.items():
        if path is None:
            continue
        resolved = path.resolve()
        if resolved == source:
            raise InputError(f"{option} {str(path)!r} is the input file; choose another path")
        if resolved in seen:
            raise InputError(f"{option} and {seen[resolved]} are the same file {str(path)!r}")
        seen[resolved] = option
        folder = check_writable(option, path)
        if folder is not None:
            created.append(folder)
    check_unlocked(output)
    return created


def write_empty_output(schema: Schema, input_path: str | Path, job: LabelJob, *, output: Path, errors_path: Path,
                       trace_path: Path | None, all_probs: bool) -> RunStats:
    """The whole run for an input without a row, written without loading a model: an empty
    Parquet output with the columns a run of ``job`` would write (``planned_output_schema``: the
    rule ``Labeler.output_schema`` follows), and an earlier errors or trace file cleared. A
    nightly export that happens to be empty answers in well under a second.

    Call it only when no work folder exists for ``output`` (else a normal run decides what to
    do with the unfinished one). Metadata says no model was loaded (``pcd.model``).

    Raises:
        MachineError: a file cannot be written. CalibrationError: ``--abstain-unless-single``
        without label sets, as a run with rows would say.
    """
    arrow_schema = keyed_schema(planned_output_schema(schema, job, all_probs=all_probs))
    stats = RunStats(schema)
    metadata = base_metadata(f"{job.model or 'default'} (not loaded: the input has no rows)", schema) \
        | stats.metadata(input_metadata(input_path))
    sink = ParquetSink(output, arrow_schema.with_metadata({k.encode(): v.encode() for k, v in metadata.items()}))
    try:
        clear_stale(errors_path)
        if trace_path is not None:
            clear_stale(trace_path)
    except BaseException:
        sink.abort()
        raise
    sink.close()
    return stats


@dataclass
class JobRun:
    """What a labelling run did: its statistics and the warnings it gave (``pcd_cli.job.JobWarning``,
    also told to ``on_event`` as they came)."""

    stats: RunStats | None = None
    warnings: list[JobWarning] = field(default_factory=list)
    #: lines worth saying once at the end that are not warnings (``dtype_speed.bfloat16_note``)
    notes: list[str] = field(default_factory=list)

    def warn(self, warning: JobWarning, emit: Callable) -> None:
        """Keep ``warning`` and tell it at once: ``emit("warning", {"code", "message"}, "warning")``."""
        self.warnings.append(warning)
        emit("warning", warning.to_dict(), "warning")


def run_label_job(schema: Schema | str | Path, input_path: str | Path, job: LabelJob, *, output: Path | None,
                  errors_path: Path | None, trace_path: Path | None = None, all_probs: bool = False,
                  min_mass: float = 0.5, fmt: str | None = None, limit: int | None = None,
                  csv_delimiter: str = ",", encoding_errors: str = "strict", progress: bool | None = None,
                  batch_records: int = DEFAULT_BATCH_RECORDS, resume: bool = False, max_errors: int | None = None,
                  should_stop: Callable[[], bool] | None = None, on_event: EventHook | None = None,
                  reuse: list[str] | None = None, dedup_keys: int = DEFAULT_DEDUP_KEYS) -> JobRun:
    """``pcd label``'s whole local job: the checks that need no model (``check_job``; the
    ``--reuse`` files read and checked: ``pcd_cli.engines.reuse.read_sources``), the output of an
    empty input (``write_empty_output``, no model loaded), else the ``Labeler`` built from ``job``
    (``build_labeler``) and every row labelled (``label_file``).

    Args:
        schema: a ``Schema`` or a schema file path (its warnings are the run's first).
        job: the labelling options; ``job.trace`` follows ``trace_path``.
        limit, csv_delimiter, encoding_errors, fmt: how the input is read (``InputSpec``,
            ``RecordReader``).
        on_event: ``(event, fields, level)``: ``warning`` (``{"code", "message"}``) for each of
            the job's warnings, ``created_folder``, and ``label_file``'s events.
        reuse: ``--reuse`` values (files, folders, globs of earlier outputs); dedup_keys: the
            dedup cache's size (``label_file``).

    Returns:
        ``JobRun``: the statistics and the warnings.

    Raises:
        InputError: standard input without ``output``; a ``--reuse`` value that is not an
        earlier pcd output recording what reuse needs; see ``check_job``. SchemaError,
        ModelError, CompileError, CalibrationError: as ``build_labeler``. TooManyErrors,
        Interrupted, NothingLabelled: as ``label_file``.
    """
    from ..schema.load import load_schema

    emit = on_event or (lambda _name, _fields, _level="info": None)
    run = JobRun()
    with _job_outputs(input_path, output, errors_path, trace_path) as (output, errors_path, staged):
        job = replace(job, trace=trace_path is not None)
        spec = replace(job.input_spec(limit=limit, csv_delimiter=csv_delimiter), encoding_errors=encoding_errors)
        parsed = schema if isinstance(schema, Schema) else load_schema(schema)
        has_rows, sources = _preflight(parsed, input_path, spec, run, emit, staged=staged, output=output,
                                       errors_path=errors_path, trace_path=trace_path, all_probs=all_probs,
                                       fmt=fmt, reuse=reuse)
        if not has_rows and not work_dir_for(output).exists():  # nothing to label: no model needed
            run.stats = write_empty_output(parsed, input_path, job, output=output, errors_path=errors_path,
                                           trace_path=trace_path, all_probs=all_probs)
            publish_staged(output, errors=errors_path)
            return run
        labeler = build_labeler(parsed, job)
        for warning in labeler.warnings:
            run.warn(warning, emit)
        run.stats = label_file(labeler, input_path, spec, output=output, errors_path=errors_path, fmt=fmt,
                               trace_path=trace_path, all_probs=all_probs, min_mass=min_mass, progress=progress,
                               batch_records=batch_records, resume=resume, max_errors=max_errors,
                               should_stop=should_stop, on_event=emit, reuse=sources, dedup_keys=dedup_keys)
        run.notes.extend(run_notes(labeler, job))
        return run


@contextmanager
def _job_outputs(input_path: str | Path, output: str | Path | None, errors_path: str | Path | None,
                 trace_path: Path | None) -> Iterator[tuple[Path, Path, StagedOutput | None]]:
    """The paths a local run writes (``stage_outputs``: the staging files of an output in
    object storage), for the time of the run. A run stopped by its failures (``TooManyErrors``,
    ``NothingLabelled``) uploads its errors file alone, the earlier output at the URI kept (a
    finished run was uploaded whole by ``WorkDir.finish``); whatever the end, the staging folder
    goes, except the work folder of a run to resume.

    Raises:
        InputError: no ``output`` (standard input, a glob or an object-storage input has no
            folder to put it beside); see ``stage_outputs``.
    """
    if output is None:
        raise InputError("reading standard input (-) needs -o: the output file" if is_stdin(input_path) else
                         f"{str(input_path)!r}: name the output with -o (a glob or an object-storage input has no "
                         "folder to put it beside)")
    output, errors_path, staged = stage_outputs(output, errors_path, trace_path)
    try:
        yield output, errors_path, staged
    except (TooManyErrors, NothingLabelled):
        with run_started():
            publish_staged(output, errors=errors_path, output_too=False)  # the errors say why; no output
        raise
    finally:  # uploaded, or refused before labelling: the staging folder goes; a run to resume keeps it
        if staged is not None:
            staged.clean()


def _preflight(schema: Schema, input_path: str | Path, spec: InputSpec, run: JobRun, emit: Callable, *,
               staged: StagedOutput | None, output: Path, errors_path: Path, trace_path: Path | None,
               all_probs: bool, fmt: str | None, reuse: list[str] | None) -> tuple[bool, list[ReuseSource]]:
    """``run_label_job``'s checks before the model, in the order a user meets them: the schema's
    warnings (``pcd_cli.job.schema_warnings``), ``check_job``, an object-storage output's store
    (``StagedOutput.prepare``: the bucket, the credentials, the right to write), the folders
    created for the outputs told (``created_folder``; a staging folder goes unsaid), and a
    warning for an output not named ``.parquet``, then the ``--reuse`` values read and checked
    (``pcd_cli.engines.reuse.read_sources``). Warnings go to ``run.warn``.

    Returns:
        Whether the input has a row, and the earlier outputs to reuse.

    Raises:
        SchemaError, InputError: as ``check_job``; a ``--reuse`` value that is not an earlier pcd
        output recording what reuse needs. MachineError: the store refuses.
    """
    from ..job import schema_warnings

    for warning in schema_warnings(schema):
        run.warn(warning, emit)
    has_rows, created = check_job(schema, input_path, spec, output=output, errors_path=errors_path,
                                  trace_path=trace_path, all_probs=all_probs, fmt=fmt)
    if staged is not None:
        staged.prepare()  # the bucket, the credentials, the right to write: before the model
    for folder in created if staged is None else ():  # writable, not locked by another run
        emit("created_folder", {"message": f"created folder {str(folder)!r} for the output files",
                                "folder": str(folder)}, "info")
    if output.suffix.lower() not in (".parquet", ".pq"):
        run.warn(JobWarning(OUTPUT_NOT_PARQUET, f"{output}: pcd writes Parquet whatever the extension"), emit)
    return has_rows, read_sources(reuse or [])  # before the model: a file that is not a reusable output is exit 2


def stage_outputs(output: str | Path, errors_path: str | Path | None,
                  trace_path: Path | None) -> tuple[Path, Path, StagedOutput | None]:
    """The local paths a run writes: ``output`` and ``errors_path`` themselves, or, for an output
    in object storage, their staging files (``pcd_cli.io.publishing.StagedOutput``: made under
    ``<pcd cache>/outputs/<sha256 of the URI>/``, the checkpoint work folder with them, uploaded
    whole at the end). The errors file defaults to ``default_errors`` beside the output (a URI
    beside a URI).

    Raises:
        InputError: ``--errors`` or ``--trace`` in object storage with a local output (the files
            of one run stay together), or ``--trace`` in object storage.
    """
    if not is_remote(output):
        if errors_path is not None and is_remote(errors_path):
            raise InputError(f"--errors {str(errors_path)!r} is in object storage but -o is not; keep them together")
        return Path(local_path(output)), Path(local_path(errors_path)) if errors_path else default_errors(
            local_path(output)), None
    if trace_path is not None and is_remote(trace_path):
        raise InputError(f"--trace {str(trace_path)!r}: the trace is written to a local file; give a local path")
    errors_uri = str(errors_path) if errors_path else default_errors_uri(str(output))
    if not is_remote(errors_uri):
        raise InputError(f"--errors {str(errors_path)!r} is local but -o is in object storage; keep them together")
    staged = StagedOutput.plan(str(output), errors_uri, cache_dir() / STAGING_ROOT)
    return staged.output, staged.errors, staged


def run_notes(labeler: Labeler, job: LabelJob) -> list[str]:
    """The lines a finished run says once that are not warnings (``JobRun.notes``), whichever the
    engine (a Ray worker computes them on its own machine): the bfloat16 note
    (``pcd_cli.backends.dtype_speed.bfloat16_note``) when the dtype was left to ``auto``, else the
    note on a half precision that is a poor choice for the device (``dtype_speed.dtype_note``),
    both through ``Labeler.dtype_note``: an engine imports no backend."""
    note = labeler.dtype_note(auto=job.dtype == "auto")
    return [note] if note is not None else []


def job_fingerprint(labeler: Labeler, input_path: str | Path, spec: InputSpec, *, fmt: str | None,
                    all_probs: bool, trace: bool, reuse: list[str] | None = None,
                    dedup_keys: int = DEFAULT_DEDUP_KEYS) -> dict:
    """Everything that decides a run's output; a resumed run must match it exactly: the job's
    value-deciding parts (``pcd_cli.job_fingerprint.job_parts``, the fingerprint ``--reuse``
    compares: model weights, dtype, device, library versions, schema, prompt, calibration, ...),
    then what names the input and the run.

    The input is named by its path (``-`` for standard input), not by size or mtime: a
    resumed run checks the content of the rows already done instead (``WorkDir`` keeps their
    hash), so an input that only grew resumes, and one edited in place starts over. The token
    budget per pass, the ``--reuse`` files and the dedup cache's size decide which records are
    packed together (bit-identical on resume); the batch sizes do not.
    """
    return {
        **labeler.job_parts(),
        "input": STDIN_NAME if is_stdin(input_path) else canonical(input_path),
        "format": fmt, "text_field": spec.text_field, "template": spec.template, "id_field": spec.id_field,
        "limit": spec.limit, "csv_delimiter": spec.csv_delimiter,
        **({"encoding_errors": spec.encoding_errors} if spec.encoding_errors != "strict" else {}),
        "max_tokens_per_pass": labeler.decoder.budget, "all_probs": all_probs, "trace": trace,
        "reuse": sorted(reuse or []), "dedup_keys": dedup_keys,
    }
#: How standard input is named in fingerprints and output metadata.
STDIN_NAME = "<stdin>"


def input_metadata(input_path: str | Path, files: Sequence[str] = ()) -> dict[str, str]:
    """How an output names what it read (both engines): ``pcd.input``, the input whole as the
    fingerprint names it (``storage.canonical``: a URI with its bucket and prefix, a local path
    made absolute; ``<stdin>``); with a folder, glob or prefix, ``pcd.input_files``, the files
    read in order (a JSON list, named so); and under hive ``key=value`` folders,
    ``pcd.input_partitions``, each partition column's distinct values (a JSON object of sorted
    lists; a null partition is ``null``).

    Args:
        files: the files read, as ``FileList.name`` names them (``()``: not listed).
    """
    if is_stdin(input_path):
        return {"pcd.input": STDIN_NAME}
    out = {"pcd.input": canonical(input_path)}
    names = [canonical(f) for f in files]
    if names and names != [out["pcd.input"]]:
        out["pcd.input_files"] = json.dumps(names)
    partitions: dict[str, set] = {}
    for name in files:
        for column, value in partition_values(str(name)).items():
            partitions.setdefault(column, set()).add(value)
    if partitions:
        out["pcd.input_partitions"] = json.dumps({c: sorted(v, key=lambda x: (x is None, x or ""))
                                                  for c, v in partitions.items()})
    return out


def label_file(labeler: Labeler, input_path: str | Path, spec: InputSpec, *, output: str | Path,
               errors_path: str | Path, fmt: str | None = None, trace_path: str | Path | None = None,
               all_probs: bool = False, min_mass: float = 0.5, progress: bool | None = None,
               batch_records: int = DEFAULT_BATCH_RECORDS, chunk_records: int = CHUNK_RECORDS,
               resume: bool = False, max_errors: int | None = None,
               should_stop: Callable[[], bool] | None = None, on_event: EventHook | None = None,
               reuse: list[ReuseSource] | None = None, dedup_keys: int = DEFAULT_DEDUP_KEYS,
               checkpoint_seconds: float = CHECKPOINT_SECONDS) -> RunStats:
    """Label every row of ``input_path``; each row ends up in ``output`` or in ``errors_path``
    (the steps: ``FileRun``).

    Args:
        progress: show a tqdm bar (records/s) on stderr; ``None``: only on a terminal.
        batch_records: rows per checkpoint at most (a part file in the work directory); it does
            not change any result (chunks are not tied to it), so a run may resume with another.
        checkpoint_seconds: also checkpoint at the end of a chunk once this long has passed since
            the last checkpoint (``CHECKPOINT_SECONDS``), so slow rows are committed too.
        chunk_records: rows handed to the decoder at once (records are packed into passes
            within a chunk), counted from row 0; ``should_stop`` and ``max_errors`` are
            checked between chunks.
        resume: continue the unfinished run of the same job (same fingerprint, and the rows
            it did unchanged: checked by hash while reading past them) if there is one;
            without it, an unfinished run's work is discarded.
        max_errors: stop once more rows than this have failed (``None``: never).
        should_stop: polled between chunks; true finishes the run early (``Interrupted``).
        on_event: told ``discarded`` (reason), ``resumed`` (rows) and ``checkpoint``
            (rows, records, failures) as they happen, and ``reuse`` once per ``--reuse`` value.
        reuse: earlier outputs read by ``pcd_cli.engines.reuse.read_sources`` (``--reuse``): a
            row whose text one of them labelled under the same job is copied from it
            (``ReuseIndex``). dedup_keys: distinct texts remembered to decode a repeated
            text once (``DedupCache``; 0: none). Both counted in ``RunStats.reused`` and
            ``RunStats.deduplicated``.

    ``input_path`` may be ``-`` (standard input; ``fmt`` required), and a ``.gz``/``.zst``
    file (see ``pcd_cli.io.readers.RecordReader``).

    Returns:
        The run's statistics; ``read == records + failures`` covers every input row.

    Raises:
        InputError: the input cannot be read as a whole, or another run holds the output.
        TooManyErrors: more than ``max_errors`` rows failed; the failures so far are in
            ``errors_path`` and the finished batches stay in the work directory.
        Interrupted: ``should_stop`` turned true; the finished batches stay in the work directory.
        NothingLabelled: every row failed; they are in ``errors_path``, and an earlier output
            at ``output`` is left as it was.
    """
    return FileRun(labeler, input_path, spec, output=output, errors_path=errors_path, fmt=fmt,
                   trace_path=trace_path, all_probs=all_probs, min_mass=min_mass, progress=progress,
                   batch_records=batch_records, chunk_records=chunk_records, resume=resume,
                   max_errors=max_errors, should_stop=should_stop, on_event=on_event, reuse=reuse,
                   dedup_keys=dedup_keys, checkpoint_seconds=checkpoint_seconds).run()


class FileRun:
    """One run of ``label_file`` (its arguments, which it documents, are this class's), in four
    steps that ``run`` takes in order:

    * ``resume``: the work folder's committed rows read back (``--resume``): the reader past
      them (their hash checked), the statistics and the ``ReusingLabeler``'s dedup cache as they
      were, so feeding goes on where the last checkpoint left it;
    * ``feed``: the rows the ``ReusingLabeler`` released, in input order, into the batch to
      commit (``_Pending``) and the statistics; ``check_stop`` between chunks;
    * ``commit``: the batch written as one part of the work folder (``WorkDir.commit``), every
      ``batch_records`` rows, every ``checkpoint_seconds`` and before stopping;
    * ``finish``: the output, errors and trace files written from the work folder, with the
      metadata (or ``NothingLabelled`` when every row failed).

    Records go to the decoder ``chunk_records`` at a time, counted among the rows to decode
    from row 0 whatever ``batch_records`` is (``ReusingLabeler``), and a commit falls between
    two such groups, so a record is packed with the same neighbours in every run (bit-identical
    on resume, even in half precision, where packing moves probabilities).
    """

    def __init__(self, labeler: Labeler, input_path: str | Path, spec: InputSpec, *, output: str | Path,
                 errors_path: str | Path, fmt: str | None, trace_path: str | Path | None, all_probs: bool,
                 min_mass: float, progress: bool | None, batch_records: int, chunk_records: int, resume: bool,
                 max_errors: int | None, should_stop: Callable[[], bool] | None, on_event: EventHook | None,
                 reuse: list[ReuseSource] | None, dedup_keys: int, checkpoint_seconds: float):
        self.labeler, self.input_path, self.spec, self.fmt, self.all_probs = labeler, input_path, spec, fmt, all_probs
        self.output, self.errors_path = Path(output), Path(errors_path)
        self.trace_path = Path(trace_path) if trace_path else None
        self.progress, self.batch_records, self.chunk_records = progress, batch_records, chunk_records
        self.checkpoint_seconds, self.resuming, self.max_errors = checkpoint_seconds, resume, max_errors
        self.should_stop, self.on_event = should_stop, on_event
        self.emit = on_event or (lambda _name, _fields: None)
        self.arrow_schema = keyed_schema(labeler.output_schema(
            id_column(spec), pa.string() if spec.id_field else pa.int64(), all_probs=all_probs))
        self.fingerprint = job_fingerprint(labeler, input_path, spec, fmt=fmt, all_probs=all_probs,
                                           trace=self.trace_path is not None, reuse=[s.path for s in reuse or ()],
                                           dedup_keys=dedup_keys)
        self.parts = labeler.job_parts()
        self.index = (ReuseIndex(reuse, self.parts, self.arrow_schema, on_event=on_event,
                                 fields=labeler.per_field_names(), schema=labeler.schema) if reuse else None)
        self.rows = ReusingLabeler(labeler, self.arrow_schema, self.index, dedup_keys, group_size=chunk_records)
        self.stats = RunStats(labeler.schema, min_mass=min_mass)
        self.id_name = self.arrow_schema.names[0]
        self.repeated = self.stats.repeated_ids if spec.id_field else None
        self.pending = _Pending()
        #: committed rows of the group decoded across the last commit, labelled again and dropped
        self.redo = 0

    def run(self) -> RunStats:
        """The whole run: the checks again and the reader opened, then ``resume``, every chunk fed
        (``_label``) and ``finish``. Returns the statistics; raises as ``label_file``."""
        # the run has started (the model is loaded): a store failing from here on, whatever it was
        # doing (listing, checking the parts, reading a later part, the upload at the end), is exit 5
        # saying --resume; the checks before the model (run_label_job) say exit 2
        with run_started():
            check_job(self.labeler.schema, self.input_path, self.spec, output=self.output,
                      errors_path=self.errors_path, trace_path=self.trace_path, all_probs=self.all_probs,
                      fmt=self.fmt)
            # the output lags the reader by the open group of rows to decode and the rest of its chunk
            self.reader = RecordReader(self.input_path, self.spec, fmt=self.fmt, batch_size=self.chunk_records,
                                       keep_digests=self.rows.max_span + 2 * self.chunk_records)
        with run_started(), WorkDir.open(self.output, self.fingerprint, self.arrow_schema,
                                         resume=self.resuming) as self.work, closing(self.reader):
            self.resume()
            self._passes_before = self.labeler.forward_passes
            self._started = time.perf_counter()
            self._last_commit = time.monotonic()
            self._label()
            self.finish()
        return self.stats

    def resume(self) -> None:
        """Pick up the work folder's committed rows, if any: the reader skips past them (a changed
        input starts the work over), the ``ReusingLabeler`` feeds on from the first row not
        committed whole (``redo``) with its dedup cache as it was there, and the statistics and
        the ids seen are the committed ones. Tells ``discarded`` and ``resumed``."""
        work, progress = self.work, self.work.progress
        if work.discarded:
            self.emit("discarded", {"reason": work.discarded, "work_dir": str(work.path)})
        self.redo = progress.redo
        if progress.rows:
            changed = self.reader.skip(progress.rows, progress.input_sha256, replay=self.redo)
            if changed:
                work.restart(changed)
                self.redo = 0
                self.emit("discarded", {"reason": work.discarded, "work_dir": str(work.path)})
        progress = work.progress
        if not progress.rows:
            return
        self.rows.next_row = progress.rows - self.redo
        failed = work.failed_rows()
        replay = self.rows.next_row - sum(1 for r in failed if r is not None and r < self.rows.next_row)
        for table in work.tables():
            self.stats.add_table(table)
            self.rows.replay(table.slice(0, max(0, replay)))  # the dedup cache as it was where feeding resumes
            replay -= table.num_rows
        stats = self.stats
        stats.failures, stats.truncated = progress.failures, progress.truncated
        stats.reused, stats.deduplicated = progress.reused, progress.deduplicated
        stats.partly_reused = progress.partly_reused
        stats.resumed = Resumed(progress.rows, progress.model_rows, progress.forward_passes, progress.seconds)
        if self.repeated is not None:
            for rid in work.committed_ids():
                self.repeated.add(rid)
        self.emit("resumed", {"rows": progress.rows, "work_dir": str(work.path)})

    def _label(self) -> None:
        """Every chunk of the reader fed to the ``ReusingLabeler`` and its rows to ``feed``, then
        the open group (``flush``) and the last commit; ``check_stop`` before the first chunk (a
        resumed run may be over the limit already; a signal may have come during loading) and
        after each."""
        self._bar = tqdm(unit="rec", desc="labelling", initial=self.work.progress.rows, dynamic_ncols=True,
                         disable=None if self.progress is None else not self.progress)
        try:
            self.check_stop()
            for chunk in self.reader:
                self.feed(self.rows.feed(chunk))
                if time.monotonic() - self._last_commit >= self.checkpoint_seconds:
                    self.commit()
                self.check_stop()
            self.feed(self.rows.flush())
            self.check_stop()
            self.commit()
        finally:
            self._bar.close()

    def feed(self, released: Sequence[Labelled]) -> None:
        """Take the rows the ``ReusingLabeler`` released (in input order) into the batch to commit
        and the statistics, committing every ``batch_records`` rows; the first ``redo`` of them
        (labelled again only to decode their group whole) are dropped."""
        dropped = min(self.redo, len(released))
        self.redo -= dropped
        stats = self.stats
        for done in released[dropped:]:
            if self.repeated is not None:
                self.repeated.add(done.item.id)
            self.pending.add(done, self.reader.file_at(done.item.row) if done.item.row is not None else None)
            if isinstance(done.result, RecordFailure):
                stats.failures += 1
            elif done.record is not None:  # decoded: counted exactly, from its RecordResult
                stats.add(done.record)
            else:  # copied (reused, deduplicated): from its output row
                stats.add_rows([done.result], self.id_name)
            stats.reused += done.kind == REUSED
            stats.deduplicated += done.kind == DEDUPLICATED
            stats.partly_reused += done.kind == PARTLY_REUSED
            stats.model_rows += done.kind == PARTLY_REUSED  # its other fields decoded
            if self.pending.rows >= self.batch_records:
                self.commit()
        self._bar.update(len(released) - dropped)

    def commit(self) -> None:
        """Write the rows taken since the last commit as one part of the work folder, with where a
        resumed run picks up (its ``redo``, the input's hash so far, the cost so far); tells
        ``checkpoint``. Nothing pending: only the checkpoint clock restarts."""
        self._last_commit = time.monotonic()
        pending, work = self.pending, self.work
        if not pending.rows:
            return
        done = work.progress.rows + pending.rows
        work.commit(pa.Table.from_pylist(pending.results, schema=self.arrow_schema), pending.errors,
                    pending.traces, truncated=pending.truncated, reused=pending.reused,
                    deduplicated=pending.deduplicated, partly_reused=pending.partly_reused,
                    redo=self.rows.redo_for(done), input_sha256=self.reader.digest_after(done),
                    cost=self.timed().whole_cost())
        self.pending = _Pending()
        self.emit("checkpoint", {"rows": work.progress.rows, "records": work.progress.records,
                                 "failures": work.progress.failures})

    def timed(self) -> RunStats:
        """The statistics with this process's time, forward passes and replaced bytes so far."""
        self.stats.replaced = self.reader.replaced if self.spec.encoding_errors != "strict" else None
        self.stats.seconds = time.perf_counter() - self._started
        self.stats.forward_passes = self.labeler.forward_passes - self._passes_before
        return self.stats

    def check_stop(self) -> None:
        """Between chunks: commit and raise ``TooManyErrors`` (the errors file written) past
        ``max_errors``, or ``Interrupted`` once ``should_stop`` says so."""
        if self.max_errors is not None and self.stats.failures > self.max_errors:
            self.commit()
            self.work.write_errors(self.errors_path)
            raise self._stopped(TooManyErrors, f"{self.stats.failures} rows failed, more than --max-errors "
                                f"{self.max_errors}; they are in {self.errors_path}")
        if self.should_stop is not None and self.should_stop():
            self.commit()
            raise self._stopped(Interrupted, f"interrupted after {self.work.progress.rows} rows")

    def _stopped(self, cls, message: str):
        return cls(message, self.timed(), self.work.path)

    def finish(self) -> None:
        """Every row is done: the output, errors and trace files from the work folder, with the
        job's, the statistics' and the reuse metadata; an unmatched ``--reuse`` told as a
        ``reuse`` warning. Every row failed: ``NothingLabelled`` (the errors file written, the
        work folder discarded, an earlier output kept rather than an empty one)."""
        stats, work = self.stats, self.work
        if stats.records == 0 and stats.failures:
            work.write_errors(self.errors_path)
            work.discard()
            raise self._stopped(NothingLabelled, f"no row could be labelled: all {stats.failures} failed; see "
                                f"{self.errors_path}")
        self.timed()
        index = self.index
        unmatched = index.unmatched(stats.decoded) if index is not None else None  # rows of this process
        if unmatched and self.on_event is not None:
            self.on_event("reuse", {"message": unmatched, "reason": "no text matched"}, "warning")
        files = self.reader.files
        listed = [files.name(i) for i in range(len(files.files))] if files is not None else []
        metadata = self.labeler.metadata() | stats.metadata(input_metadata(self.input_path, listed)) \
            | keyed_metadata(self.parts, index.reused_metadata() if index is not None else ())
        work.finish(self.output, errors_path=self.errors_path, trace_path=self.trace_path, metadata=metadata)


class _Pending:
    """Rows labelled since the last checkpoint: output rows (dicts of the output columns), failed
    rows, the decoded rows' traces."""

    def __init__(self) -> None:
        self.results: list[dict] = []
        self.errors: list[dict] = []
        self.traces: list[dict] = []
        self.truncated = self.reused = self.deduplicated = self.partly_reused = 0

    @property
    def rows(self) -> int:
        return len(self.results) + len(self.errors)

    def add(self, done: Labelled, file: str | None = None) -> None:
        """Keep one row; ``file``: the input file it came from, said in its error row when the input
        is several files (as the Ray engine says it)."""
        item, res = done.item, done.result
        if isinstance(res, RecordFailure):
            self.errors.append({"row": item.row, "line": item.line, "record": res.id, "error": res.error}
                               | ({"file": file} if file else {}))
            return
        self.results.append(res)
        self.traces.extend(done.traces)
        self.truncated += bool(res[TRUNCATED_COLUMN])
        self.reused += done.kind == REUSED
        self.deduplicated += done.kind == DEDUPLICATED
        self.partly_reused += done.kind == PARTLY_REUSED


@contextmanager
def stop_on_signals() -> Iterator[Callable[[], bool]]:
    """Within the block, SIGINT and SIGTERM ask the job to stop after the current chunk.

    Yields the ``should_stop`` poll for ``label_file``. A second signal raises
    ``KeyboardInterrupt`` at once (the committed batches are safe either way). Only
    installs handlers in the main thread; elsewhere the poll is always false.
    """
    requested = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield requested.is_set
        return

    def handler(signum, _frame):
        if requested.is_set():
            raise KeyboardInterrupt
        requested.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield requested.is_set
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
