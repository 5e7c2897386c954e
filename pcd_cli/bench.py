"""``pcd bench``: pcd against token-by-token generation on the same model, machine and records.

Three methods per record:

* ``generate``: transformers ``generate`` (greedy), the same prompt (same catalog, the
  assistant turn already opened with the JSON opener), no KV reuse — what a user does
  without pcd;
* ``generate_cached``: the same, with the prompt head's KV computed once and reused;
* ``pcd``: one record decoded alone on the cached head (two forward passes).

Per record: latency, forward passes (counted by a hook on the model, not assumed), output
tokens, whether the generated JSON parsed and matched the schema (missing keys, invalid
values, quoted booleans, extra keys), and per-field agreement with pcd's argmax. A baseline
that fails (unparseable, runaway, missing keys) is reported as a failure, never dropped.
Generation is capped at twice the token length of a complete answer object plus 32 tokens,
unless ``max_new_tokens`` says otherwise; a run that hits the cap is marked ``runaway``.
"""

from __future__ import annotations

import json
import platform
import resource
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .api import Labeler
from .decoding.decode import DEFAULT_MAX_TOKENS_PER_PASS
from .decoding.prompt import answer_object
from .errors import InputError
from .io.files import write_atomic
from .io.output import declared_values
from .io.readers import InputSpec, read_records
from .results import Record, RecordResult
from .schema.model import Schema

METHODS = ("generate", "generate_cached", "pcd")


@dataclass(frozen=True)
class BenchRow:
    """One record under one method. ``agreement``: fraction of fields equal to pcd's argmax."""

    record: str
    method: str
    latency_s: float
    forward_passes: int
    output_tokens: int
    parsed: bool
    valid: bool
    problems: tuple[str, ...]
    agreement: float
    values: dict


@dataclass
class BenchReport:
    schema: str
    model: str
    device: str
    records: int
    max_new_tokens: int
    rows: list[BenchRow] = field(default_factory=list)
    summary: dict = field(default_factory=dict)


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB.

    Linux: ``VmHWM`` from ``/proc/self/status`` (``ru_maxrss`` would include the parent's
    peak for a forked child); elsewhere ``ru_maxrss``.
    """
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def check_generated(schema: Schema, text: str, hit_cap: bool) -> tuple[bool, dict, list[str]]:
    """Parse generated text as the schema's JSON object.

    Returns:
        ``(parsed, values, problems)``: values by field name (quoted booleans read as
        booleans for agreement, but reported as a problem); problems empty when valid.
    """
    start = text.find("{")
    try:
        if start < 0:
            raise ValueError("no '{'")
        obj, _ = json.JSONDecoder().raw_decode(text[start:])
    except ValueError:
        return False, {}, ["runaway: hit the token cap" if hit_cap else "unparseable JSON"]
    if not isinstance(obj, dict):
        return False, {}, ["not a JSON object"]
    problems, values = [], {}
    names = {f.name for f in schema.declared}
    for f in schema.declared:
        if f.name not in obj:
            problems.append(f"missing key {f.name}")
            continue
        values[f.name] = _check_value(f, obj[f.name], problems)
    problems += [f"unexpected key {k}" for k in obj if k not in names]
    return True, values, problems


def _check_value(f, value, problems: list[str]):
    """A generated value of field ``f`` as pcd would write it, its problems appended
    (quoted booleans and numbers are read, and reported)."""
    if value is None and f.nullable:
        return None
    if f.is_multi:
        if not isinstance(value, dict) or set(value) - set(f.labels) \
                or not all(isinstance(v, bool) for v in value.values()):
            problems.append(f"invalid value {f.name}={value!r}")
            return value
        return [o for o in f.labels if value.get(o)]
    if f.is_boolean or f.type == "integer":
        unquoted = isinstance(value, bool) if f.is_boolean else isinstance(value, int) and not isinstance(value, bool)
        if unquoted and (f.is_boolean or str(value) in f.labels):
            return value
        if isinstance(value, str) and value.strip().lower() in f.labels:
            problems.append(f"quoted {f.type} {f.name}")
            return f.value(f.labels.index(value.strip().lower()))
        problems.append(f"invalid value {f.name}={value!r}")
        return value
    if value not in f.labels or (f.nullable and value == f.labels[-1]):
        problems.append(f"invalid value {f.name}={value!r}")
    return value


def _answer_tokens(labeler: Labeler) -> int:
    """Token length of a complete answer object (label 0 everywhere), for the generation cap."""
    compiled = labeler.compiled
    text = answer_object(compiled.schema, compiled.layout, (0,) * len(compiled.schema.fields))
    return len(labeler.backend.tokenizer.encode(text))


def run_bench(schema: Schema, input_path: str | Path, spec: InputSpec, *, model: str | None = None,
              device: str = "auto", dtype: str = "auto", max_new_tokens: int | None = None,
              max_tokens_per_pass: int = DEFAULT_MAX_TOKENS_PER_PASS, backend=None, methods: tuple[str, ...] = METHODS,
              permutations: int = 1) -> BenchReport:
    """Run the three methods on the first ``spec.limit`` records of ``input_path``.

    ``backend``: a loaded backend, or ``auto``/``torch``/``mlx`` (see ``Labeler``);
    ``permutations``: pcd's ``--permutations K`` (generation then reads the prompt of the
    first ordering, the values listed after the record).

    Raises:
        InputError: no usable record in the input. ModelError/CompileError: see ``Labeler``.
    """
    items = [r for batch in read_records(input_path, spec) for r in batch]
    records = [r for r in items if isinstance(r, Record)]
    if not records:  # said before the model loads, with the first row's reason
        why = f" (e.g. {items[0].error})" if items else " (it is empty)"
        raise InputError(f"{str(input_path)!r}: no usable record to benchmark{why}")
    labeler = Labeler(schema, model=model, device=device, dtype=dtype, backend=backend,
                      max_tokens_per_pass=max_tokens_per_pass, permutations=permutations)
    backend = labeler.backend
    cap = max_new_tokens or 2 * _answer_tokens(labeler) + 32
    report = BenchReport(schema=schema.name, model=backend.model_id, device=str(backend.device),
                         records=len(records), max_new_tokens=cap)
    prompt = labeler.compiled.prompt
    head = list(prompt.head_ids)
    eos = set(backend.eos_token_ids)
    labeler.label_batch(records[:1])  # warm-up (first-call allocations), not timed
    backend.generate(head + prompt.record_ids(records[0].id, records[0].text)[1], 2)
    for record in records:
        passes = labeler.forward_passes
        started = time.perf_counter()
        (result,) = labeler.label_batch([record])
        latency = time.perf_counter() - started
        if not isinstance(result, RecordResult):
            report.summary.setdefault("skipped", []).append(result.error)
            continue
        pcd_values = declared_values(schema, result)
        report.rows.append(BenchRow(str(record.id), "pcd", latency, labeler.forward_passes - passes, 0, True, True,
                                    (), 1.0, pcd_values))
        ids = head + prompt.record_ids(record.id, record.text)[1]
        for method in methods:
            if method == "pcd":
                continue
            started = time.perf_counter()
            new, passes_used = backend.generate(ids, cap, cache_prefix_len=len(head) if method == "generate_cached" else 0)
            latency = time.perf_counter() - started
            hit_cap = len(new) >= cap and not (eos & set(new))
            text = prompt.layout.opener + backend.tokenizer.decode([t for t in new if t not in eos])
            parsed, values, problems = check_generated(schema, text, hit_cap)
            agree = sum(values.get(k) == v for k, v in pcd_values.items()) / len(pcd_values)
            report.rows.append(BenchRow(str(record.id), method, latency, passes_used, len(new), parsed,
                                        parsed and not problems, tuple(problems), agree, values))
    passes = labeler.forward_passes
    started = time.perf_counter()
    labeler.label_batch(records)
    packed_seconds = time.perf_counter() - started
    report.summary = {**summarize(report.rows, methods), **report.summary}
    answer = _answer_tokens(labeler)
    gen = [r for r in report.rows if r.method == "generate" and r.output_tokens]
    if gen:
        per_token = statistics.median(r.latency_s / r.output_tokens for r in gen)
        report.summary["generate_median_s_per_token"] = per_token
        report.summary["answer_object_tokens"] = answer
        report.summary["speedup_vs_generate_at_answer_length"] = (
            per_token * answer / report.summary["pcd_median_latency_s"])
    report.summary.update(
        pcd_packed_records_per_s=len(records) / packed_seconds,
        pcd_packed_passes_per_record=(labeler.forward_passes - passes) / len(records),
        peak_rss_mb=peak_rss_mb(), **({"mlx_peak_mb": backend.peak_memory_mb()}
                                       if hasattr(backend, "peak_memory_mb") else {}), machine=f"{platform.machine()} {platform.system()}", device=report.device,
        max_new_tokens=cap)
    return report


def summarize(rows: list[BenchRow], methods: tuple[str, ...] = METHODS) -> dict:
    """Median latencies and passes per method, ratios against pcd, validity and agreement rates."""
    by = {m: [r for r in rows if r.method == m] for m in methods}
    med = {m: statistics.median(r.latency_s for r in by[m]) for m in methods if by[m]}
    out: dict = {"passes_per_record": statistics.median(r.forward_passes for r in by["pcd"])}
    for m in methods:
        if not by[m]:
            continue
        out[f"{m}_median_latency_s"] = med[m]
        out[f"{m}_median_forward_passes"] = statistics.median(r.forward_passes for r in by[m])
        if m != "pcd":
            out[f"{m}_valid_rate"] = sum(r.valid for r in by[m]) / len(by[m])
            out[f"{m}_parsed_rate"] = sum(r.parsed for r in by[m]) / len(by[m])
            out[f"{m}_agreement_with_pcd"] = statistics.mean(r.agreement for r in by[m])
    if "generate" in med:
        out["speedup_vs_generate"] = med["generate"] / med["pcd"]
    if "generate_cached" in med:
        out["speedup_vs_generate_cached"] = med["generate_cached"] / med["pcd"]
    return out


def render_bench(report: BenchReport, console: Console) -> None:
    """Per-record rows and the summary as rich tables."""
    table = Table(title=f"pcd bench: {escape(report.schema)} on {escape(report.model)} ({report.device}), "
                        f"generation capped at {report.max_new_tokens} tokens")
    for col in ("record", "method", "latency s", "passes", "out tokens", "valid", "agree", "problems"):
        table.add_column(col, justify="right" if col in ("latency s", "passes", "out tokens", "agree") else "left")
    for r in report.rows:
        problems = "; ".join(r.problems[:3]) + (f" (+{len(r.problems) - 3})" if len(r.problems) > 3 else "")
        table.add_row(escape(r.record), r.method, f"{r.latency_s:.3f}", str(r.forward_passes), str(r.output_tokens),
                      "yes" if r.valid else "[red]no[/]", f"{r.agreement:.2f}", escape(problems))
    console.print(table)
    s = report.summary
    console.print(
        f"median latency: generate {s.get('generate_median_latency_s', float('nan')):.3f}s, "
        f"generate+cached head {s.get('generate_cached_median_latency_s', float('nan')):.3f}s, "
        f"pcd {s['pcd_median_latency_s']:.3f}s -> speedup {s.get('speedup_vs_generate', float('nan')):.1f}x / "
        f"{s.get('speedup_vs_generate_cached', float('nan')):.1f}x; pcd passes per record {s['passes_per_record']:g} "
        f"(packed: {s['pcd_packed_passes_per_record']:.2f}, {s['pcd_packed_records_per_s']:.2f} records/s); "
        f"generated JSON valid: {s.get('generate_valid_rate', float('nan')):.0%}; "
        f"peak RSS {s['peak_rss_mb']:.0f} MiB"
        + (f", MLX peak {s['mlx_peak_mb']:.0f} MiB" if "mlx_peak_mb" in s else ""), highlight=False)


def write_bench_json(report: BenchReport, path: str | Path) -> None:
    """Write ``{"schema", "model", ..., "rows": [...], "summary": {...}}`` as JSON (atomically:
    ``pcd_cli.io.files.write_atomic``)."""
    write_atomic(path, json.dumps(asdict(report), indent=2, default=str).encode())


def gold_accuracy(report: BenchReport, gold, schema: Schema, *, id_field: str = "id") -> dict:
    """Per field and method, accuracy against human labels on the benchmarked records.

    Args:
        gold: a DataFrame with ``id_field`` and one column per field (``quality.read_gold``);
            records are matched by id as text.

    Returns:
        ``{field: {method: {"accuracy", "n", "invalid"}}}``: a generated answer that did not
        parse, lacks the field or gives a value that is not a label counts as wrong and as
        ``invalid``; ``n`` counts the benchmarked records with a gold label for the field.
    """
    from .errors import SchemaError
    from .quality.data import FieldSpec, resolve_gold_columns

    gold = resolve_gold_columns(gold, [FieldSpec.of(f) for f in schema.declared], id_field)  # Argilla's names
    gold_by_id = {str(k): row for k, row in zip(gold[id_field], gold.to_dict("records"))}
    out: dict = {}
    for f in schema.declared:
        if f.is_multi:  # its options are compared through the row's values; no single label to score
            continue
        per_method: dict = {}
        for row in report.rows:
            expected = gold_by_id.get(row.record, {}).get(f.name)
            if expected is None or expected != expected:  # no gold row, or null/NaN
                continue
            try:
                want = f.label_index(expected)
            except SchemaError:
                continue
            stats = per_method.setdefault(row.method, {"correct": 0, "n": 0, "invalid": 0})
            stats["n"] += 1
            try:
                ok = row.parsed and f.name in row.values and f.label_index(row.values[f.name]) == want
            except SchemaError:
                ok = False
                stats["invalid"] += 1
            else:
                if not row.parsed or f.name not in row.values:
                    stats["invalid"] += 1
            stats["correct"] += ok
        out[f.name] = {m: {"accuracy": s["correct"] / s["n"], "n": s["n"], "invalid": s["invalid"]}
                       for m, s in per_method.items()}
    return out


def render_gold_accuracy(accuracy: dict, console: Console) -> None:
    """``gold_accuracy``'s figures as a table: one row per field, one column per method."""
    methods = [m for m in METHODS if any(m in v for v in accuracy.values())]
    table = Table(title="accuracy against the gold labels (invalid generated answers count as wrong)")
    table.add_column("field")
    for m in methods:
        table.add_column(m, justify="right")
    for name, per in accuracy.items():
        cells = []
        for m in methods:
            s = per.get(m)
            cells.append("-" if s is None else f"{s['accuracy']:.3f} (n={s['n']}"
                         + (f", {s['invalid']} invalid)" if s["invalid"] else ")"))
        table.add_row(escape(name), *cells)
    console.print(table)
