"""The main job: stream a file through a ``Labeler`` into Parquet, errors and trace files."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
from tqdm import tqdm

from .api import Labeler
from .decode import RecordFailure
from .io import InputSpec, JsonlSink, ParquetSink, read_records
from .summary import RunStats


def default_output(input_path: str | Path) -> Path:
    """``<input folder>/<input stem>.labels.parquet``."""
    path = Path(input_path)
    return path.with_name(f"{path.stem}.labels.parquet")


def default_errors(output: str | Path) -> Path:
    """``<output folder>/<output stem>.errors.jsonl`` (``x.labels.parquet`` -> ``x.errors.jsonl``)."""
    path = Path(output)
    stem = path.stem[: -len(".labels")] if path.stem.endswith(".labels") else path.stem
    return path.with_name(f"{stem}.errors.jsonl")


def id_column(spec: InputSpec) -> str:
    """Name of the output's id column: the ``--id-field`` column, else ``row`` (row numbers from 0)."""
    return spec.id_field or "row"


def label_file(labeler: Labeler, input_path: str | Path, spec: InputSpec, *, output: str | Path,
               errors_path: str | Path, fmt: str | None = None, trace_path: str | Path | None = None,
               all_probs: bool = False, min_mass: float = 0.5, progress: bool | None = None,
               batch_records: int = 256) -> RunStats:
    """Label every row of ``input_path``; each row ends up in ``output`` or in ``errors_path``.

    Args:
        progress: show a tqdm bar (records/s) on stderr; ``None``: only on a terminal.

    Returns:
        The run's statistics (records, failures, forward passes, seconds, per-field stats).

    Raises:
        InputError: the input cannot be read as a whole. The partial output is removed.
    """
    column = id_column(spec)
    labeler.schema.check_output_columns(column)
    stats = RunStats(labeler.schema, min_mass=min_mass)
    errors_path = Path(errors_path)
    errors_path.unlink(missing_ok=True)  # a stale errors file from an earlier run would mislead
    if trace_path:
        Path(trace_path).unlink(missing_ok=True)  # likewise a stale trace (the sink opens lazily)
    errors = JsonlSink(errors_path)
    trace = JsonlSink(trace_path) if trace_path else None
    sink = ParquetSink(output, labeler.schema, id_column=column,
                       id_type=pa.string() if spec.id_field else pa.int64(),
                       all_probs=all_probs, metadata=labeler.metadata())
    passes_before = labeler.forward_passes
    started = time.perf_counter()
    bar = tqdm(unit="rec", desc="labelling", disable=None if progress is None else not progress, dynamic_ncols=True)
    try:
        for batch in read_records(input_path, spec, fmt=fmt, batch_size=batch_records):
            results = labeler.label_batch(batch)
            good = []
            for res in results:
                if isinstance(res, RecordFailure):
                    errors.write({"record": res.id, "error": res.error})
                    stats.failures += 1
                    continue
                good.append(res)
                stats.add(res)
                if trace is not None:
                    for row in res.traces:
                        trace.write(row)
            sink.write(good)
            bar.update(len(results))
    except BaseException:
        sink.abort()
        raise
    finally:
        bar.close()
        errors.close()
        if trace is not None:
            trace.close()
    sink.close()
    stats.seconds = time.perf_counter() - started
    stats.forward_passes = labeler.forward_passes - passes_before
    return stats
