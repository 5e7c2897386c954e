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

``baseline="llama.cpp"`` replaces the two transformers methods by llama.cpp's
grammar-constrained JSON on the same GGUF file (``pcd_cli.bench_llamacpp``). Every run also
states pcd's forward limit (``forward_limit``: tokens pcd fed per record, and its packed time
against plain causal forward passes over as many tokens), and on a CPU with ``avx512_bf16``
both dtypes' speed and agreement on the same records (``compare_dtypes``).
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
from .backends.dtype_speed import bfloat16_would_run, record_measurement
from .decoding.decode import DEFAULT_MAX_TOKENS_PER_PASS
from .decoding.prompt import answer_object
from .errors import InputError, ModelError
from .io.files import write_atomic
from .io.output import declared_values
from .io.readers import InputSpec, read_records
from .job import LabelJob
from .results import Record, RecordResult
from .schema.model import Schema

METHODS = ("generate", "generate_cached", "pcd")
#: ``pcd bench --baseline``: what pcd is compared with (transformers ``generate``, or
#: llama.cpp's grammar-constrained JSON on the GGUF file, ``pcd_cli.bench_llamacpp``).
BASELINES = ("transformers", "llama.cpp")


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
              permutations: int = 1, baseline: str = "transformers", compare_dtype: bool = False) -> BenchReport:
    """Run pcd and a baseline on the first ``spec.limit`` records of ``input_path``.

    ``backend``: a loaded backend, or ``auto``/``torch``/``mlx`` (see ``Labeler``);
    ``permutations``: pcd's ``--permutations K`` (generation then reads the prompt of the
    first ordering, the values listed after the record); ``baseline``: one of ``BASELINES``
    (``llama.cpp``: ``methods`` is ignored, the GGUF is ``model`` or the embedded model's
    file); ``compare_dtype``: on a CPU with ``avx512_bf16`` running float32, also label the
    records in bfloat16 (``compare_dtypes``; loads the model a second time).

    Raises:
        InputError: no usable record in the input, an unknown baseline, a schema with
            ``isolate_fields``, or ``--baseline llama.cpp`` with a model that is not a GGUF file.
            ModelError: llama-cpp-python missing for ``llama.cpp``; see also ``Labeler`` (and
            CompileError).
    """
    if baseline not in BASELINES:
        raise InputError(f"--baseline {baseline!r}: expected one of {', '.join(BASELINES)}")
    if schema.isolate_fields:  # the baselines generate one object from one prompt; isolated fields have one each
        raise InputError("pcd bench compares the shared-catalog prompt with generation from it; a schema with "
                         "isolate_fields has one prompt per field: bench it without isolate_fields")
    gguf = None
    if baseline == "llama.cpp":
        from .bench_llamacpp import INSTALL_HINT, LLAMA_METHOD, baseline_gguf, llama_cpp_available

        if not llama_cpp_available():
            raise ModelError(f"--baseline llama.cpp needs llama-cpp-python: {INSTALL_HINT}")
        gguf = baseline_gguf(model)  # refused before the model loads
        methods = (LLAMA_METHOD, "pcd")
    items = [r for batch in read_records(input_path, spec) for r in batch]
    records = [r for r in items if isinstance(r, Record)]
    if not records:  # said before the model loads, with the first row's reason
        why = f" (e.g. {items[0].error})" if items else " (it is empty)"
        raise InputError(f"{str(input_path)!r}: no usable record to benchmark{why}")
    labeler = Labeler(schema, LabelJob(model=model, device=device, dtype=dtype,
                                       max_tokens_per_pass=max_tokens_per_pass, permutations=permutations),
                      backend=backend)
    backend = labeler.backend
    cap = max_new_tokens or 2 * _answer_tokens(labeler) + 32
    report = BenchReport(schema=schema.name, model=backend.model_id, device=str(backend.device),
                         records=len(records), max_new_tokens=cap)
    prompt = labeler.compiled.prompt
    head = list(prompt.head_ids)
    eos = set(backend.eos_token_ids)
    labeler.label_batch(records[:1])  # warm-up (first-call allocations), not timed
    generated = [m for m in methods if m in ("generate", "generate_cached")]
    if generated:
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
        for method in generated:
            started = time.perf_counter()
            new, passes_used = backend.generate(ids, cap, cache_prefix_len=len(head) if method == "generate_cached" else 0)
            latency = time.perf_counter() - started
            hit_cap = len(new) >= cap and not (eos & set(new))
            text = prompt.layout.opener + backend.tokenizer.decode([t for t in new if t not in eos])
            parsed, values, problems = check_generated(schema, text, hit_cap)
            agree = sum(values.get(k) == v for k, v in pcd_values.items()) / len(pcd_values)
            report.rows.append(BenchRow(str(record.id), method, latency, passes_used, len(new), parsed,
                                        parsed and not problems, tuple(problems), agree, values))
    passes, fed = labeler.forward_passes, labeler.decoder.tokens_fed
    started = time.perf_counter()
    packed = labeler.label_batch(records)
    packed_seconds = time.perf_counter() - started
    packed_passes, fed = labeler.forward_passes - passes, labeler.decoder.tokens_fed - fed
    # before llama.cpp runs: its threads may still hold the cores for a while after it returns
    limit = forward_limit(labeler, records, packed_seconds, fed, packed_passes)
    if gguf is not None:
        report.rows += _llamacpp_rows(labeler, schema, records, report.rows, gguf, cap, report.summary)
    report.summary = {**summarize(report.rows, methods), **report.summary, "forward_limit": limit}
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
        pcd_packed_passes_per_record=packed_passes / len(records),
        peak_rss_mb=peak_rss_mb(), **({"mlx_peak_mb": backend.peak_memory_mb()}
                                       if hasattr(backend, "peak_memory_mb") else {}), machine=f"{platform.machine()} {platform.system()}", device=report.device,
        max_new_tokens=cap)
    if gguf is not None:
        from .bench_llamacpp import llamacpp_summary

        runs = report.summary["forward_limit"]["pcd_runs_s"]  # pcd's two packed runs: their mean
        report.summary.update(llamacpp_summary(report.summary.pop("_llama_runs"), 2 * len(records) / sum(runs),
                                               report.summary["pcd_median_latency_s"]))
    if compare_dtype and bfloat16_would_run(labeler.backend):
        report.summary["dtypes"] = compare_dtypes(labeler, records, packed, packed_seconds, model=model)
        record_measurement(labeler.backend.model_id, report.summary["dtypes"], schema=schema.name,
                           records=len(records))  # pcd label's bfloat16 note reads it
    return report


def _llamacpp_rows(labeler, schema: Schema, records, pcd_rows: list[BenchRow], gguf: Path, cap: int,
                   summary: dict) -> list[BenchRow]:
    """llama.cpp's row per record (``bench_llamacpp.run_llamacpp``), checked and compared with
    pcd's values; its runs and set-up facts go into ``summary`` (``_llama_runs`` is taken out
    by ``run_bench``), the agreement per field as ``llama_cpp_agreement_per_field``."""
    from .bench_llamacpp import LLAMA_METHOD, agreement_per_field, run_llamacpp

    pcd_values = {r.record: r.values for r in pcd_rows if r.method == "pcd"}
    kept = [r for r in records if str(r.id) in pcd_values]
    runs, info = run_llamacpp(labeler, kept, gguf=gguf, n_threads=cpu_threads(labeler.backend), max_new_tokens=cap,
                              gpu=str(labeler.backend.device).startswith("cuda"))
    rows = []
    for run in runs:
        parsed, values, problems = check_generated(schema, run.text, run.hit_cap)
        mine = pcd_values[run.record]
        agree = sum(values.get(k) == v for k, v in mine.items()) / len(mine)
        rows.append(BenchRow(run.record, LLAMA_METHOD, run.latency_s, 0, run.output_tokens,  # passes: not counted
                             parsed, parsed and not problems, tuple(problems), agree, values))
    summary.update({f"llama_cpp_{k}": v for k, v in info.items()}, _llama_runs=runs,
                   llama_cpp_agreement_per_field=agreement_per_field(
                       schema, [(pcd_values[r.record], r.values) for r in rows]))
    return rows


def cpu_threads(backend) -> int:
    """Threads the backend computes with (``backend.cpu_threads`` where it says, else the CPUs
    this process may run on)."""
    import os

    threads = getattr(backend, "cpu_threads", None)
    return int(threads) if threads else len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else (os.cpu_count() or 1)


def forward_limit(labeler, records, packed_seconds: float, tokens_fed: int, passes: int) -> dict:
    """pcd's packed time against plain forward passes over the same number of tokens.

    The plain passes are causal forwards on the cached prompt head, ``tokens_fed`` tokens cut
    into ``passes`` equal chunks (pcd's passes, at most ``max_tokens_per_pass`` each), no
    token forest, no reads beyond one row: the cost of the tokens alone, i.e. the fastest any
    method that reads those tokens could go on this backend. Timed interleaved with a second
    packed run of ``records`` (plain, pcd, plain), each side its fastest, so that a load that
    changes during the run moves both alike.

    Returns:
        ``{"tokens_per_record", "passes", "pcd_s", "plain_forward_s", "ratio", "pcd_runs_s"}``:
        ``ratio`` = pcd's time / the plain passes' time (1.0: pcd is at the forward limit);
        ``pcd_runs_s``: both packed runs (``packed_seconds`` and the second); seconds wall-clock.
    """
    import numpy as np

    backend = labeler.backend
    cache = labeler.decoder.cache
    head = len(labeler.compiled.prompt.head_ids)
    filler = np.array(backend.tokenizer.encode("The quick brown fox jumps over the lazy dog. "))
    sizes = [len(c) for c in np.array_split(np.arange(tokens_fed), max(passes, 1)) if len(c)]

    def one(n: int) -> None:
        ids = np.resize(filler, n)
        visible = np.zeros((n, head + n), dtype=bool)
        visible[:, :head] = True
        visible[:, head:] = np.tril(np.ones((n, n), dtype=bool))
        backend.forward(cache, ids, np.arange(head, head + n), visible, np.array([n - 1]), np.array([[0]]))
        backend.truncate(cache, head)

    def plain_run() -> float:
        started = time.perf_counter()
        for n in sizes:
            one(n)
        return time.perf_counter() - started

    one(sizes[0])  # warm-up for this shape
    plain = plain_run()
    started = time.perf_counter()
    labeler.label_batch(records)
    again = time.perf_counter() - started
    plain = min(plain, plain_run())
    pcd = min(packed_seconds, again)
    return {"tokens_per_record": tokens_fed / len(records), "passes": passes, "pcd_s": pcd,
            "plain_forward_s": plain, "ratio": pcd / plain, "pcd_runs_s": [packed_seconds, again]}


def compare_dtypes(labeler, records, results, seconds: float, *, model: str | None) -> dict:
    """The same records labelled in bfloat16: speed and agreement against the float32 run.

    Each dtype is timed twice, interleaved (float32 earlier in ``seconds``, bfloat16, float32,
    bfloat16), each its fastest.

    Args:
        labeler: the float32 ``Labeler`` (its schema, options and records' results ``results``,
            packed, in ``seconds``).
        model: the model as given (the bfloat16 copy is loaded again from it).

    Returns:
        ``{"float32_records_per_s", "bfloat16_records_per_s", "speedup", "decisions",
        "labels_equal", "max_abs_dprob", "load_s"}``: ``labels_equal`` counts the decisions
        (record x decision) whose label is the same in both; ``max_abs_dprob`` is the largest
        |p32 - p16| over every label of every decision.
    """
    from .backends import load_backend

    started = time.perf_counter()
    backend = load_backend(model, backend="torch", device="cpu", dtype="bfloat16")
    load_s = time.perf_counter() - started
    other = Labeler(labeler.schema, labeler.job, backend=backend)  # the same job on the bfloat16 model
    other.label_batch(records[:1])  # warm-up
    started = time.perf_counter()
    mine = other.label_batch(records)
    bf16_seconds = time.perf_counter() - started
    started = time.perf_counter()  # float32 again, right after: a load that changed moves both alike
    labeler.label_batch(records)
    seconds = min(seconds, time.perf_counter() - started)
    started = time.perf_counter()
    other.label_batch(records)
    bf16_seconds = min(bf16_seconds, time.perf_counter() - started)
    decisions = equal = 0
    worst = 0.0
    for a, b in zip(results, mine):
        if not (isinstance(a, RecordResult) and isinstance(b, RecordResult)):
            continue
        for fa, fb in zip(a.fields, b.fields):
            decisions += 1
            equal += fa.label == fb.label
            worst = max(worst, max(abs(x - y) for x, y in zip(fa.probs, fb.probs)))
    return {"float32_records_per_s": len(records) / seconds, "bfloat16_records_per_s": len(records) / bf16_seconds,
            "speedup": seconds / bf16_seconds, "decisions": decisions, "labels_equal": equal,
            "max_abs_dprob": worst, "load_s": load_s}


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
    line = (f"pcd: {s['pcd_median_latency_s']:.3f}s per record alone ({s['passes_per_record']:g} passes), "
            f"packed {s['pcd_packed_records_per_s']:.2f} records/s ({s['pcd_packed_passes_per_record']:.2f} "
            f"passes per record); peak RSS {s['peak_rss_mb']:.0f} MiB"
            + (f", MLX peak {s['mlx_peak_mb']:.0f} MiB" if "mlx_peak_mb" in s else ""))
    console.print(line, highlight=False)
    if "generate_median_latency_s" in s:
        console.print(
            f"transformers generate: median {s['generate_median_latency_s']:.3f}s, with the head cached "
            f"{s.get('generate_cached_median_latency_s', float('nan')):.3f}s -> pcd {s['speedup_vs_generate']:.1f}x / "
            f"{s.get('speedup_vs_generate_cached', float('nan')):.1f}x faster; generated JSON valid: "
            f"{s['generate_valid_rate']:.0%}", highlight=False)
    if "llama_cpp_records_per_s" in s:
        per_field = s["llama_cpp_agreement_per_field"]
        low = sorted(per_field.items(), key=lambda kv: kv[1])[:3]
        console.print(
            f"llama.cpp {s['llama_cpp_llama_cpp_version']} (grammar JSON, {s['llama_cpp_n_threads']} threads, "
            f"{Path(s['llama_cpp_gguf']).name}): {s['llama_cpp_records_per_s']:.2f} records/s, "
            f"{s['llama_cpp_median_output_tokens']:g} tokens generated (median), parsed "
            f"{s['llama.cpp_parsed_rate']:.0%}, valid {s['llama.cpp_valid_rate']:.0%}, agreement with pcd "
            f"{s['llama.cpp_agreement_with_pcd']:.0%} of decisions (lowest: "
            + ", ".join(f"{escape(k)} {v:.0%}" for k, v in low) + ")", highlight=False)
        console.print(
            f"pcd / llama.cpp grammar JSON: {s['pcd_packed_vs_llama_cpp']:.1f}x packed "
            f"({s['pcd_packed_records_per_s_two_runs']:.2f} vs {s['llama_cpp_records_per_s']:.2f} records/s), "
            f"{s['pcd_one_vs_llama_cpp']:.1f}x one record alone; llama.cpp prefill alone: "
            f"{s.get('llama_cpp_prefill_records_per_s', float('nan')):.2f} records/s", highlight=False)
    fl = s.get("forward_limit")
    if fl:
        console.print(f"forward limit: pcd fed {fl['tokens_per_record']:.1f} tokens per record ({fl['passes']} passes); "
                      f"its time is {fl['ratio']:.2f}x plain forward passes over as many tokens "
                      f"({fl['pcd_s']:.2f}s vs {fl['plain_forward_s']:.2f}s)", highlight=False)
    dt = s.get("dtypes")
    if dt:
        verdict = ("faster here: --dtype bfloat16 uses it" if dt["speedup"] > 1.05 else
                   "not faster here: keep float32")
        console.print(f"bfloat16 (this CPU has avx512_bf16): {dt['bfloat16_records_per_s']:.2f} vs float32 "
                      f"{dt['float32_records_per_s']:.2f} records/s packed ({dt['speedup']:.2f}x, {verdict}), "
                      f"{dt['labels_equal']}/{dt['decisions']} labels equal, max |dp| {dt['max_abs_dprob']:.3f}",
                      highlight=False)


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
    methods = [m for m in (*METHODS, "llama.cpp") if any(m in v for v in accuracy.values())]
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
