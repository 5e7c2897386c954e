"""``pcd bench --baseline llama.cpp``: pcd beside llama.cpp's grammar-constrained JSON.

What a user who wants speed on a CPU runs instead of pcd: llama.cpp (through
llama-cpp-python, the optional extra ``bench``) on the GGUF file, with a grammar built from
the schema's JSON Schema so that the answer always parses and every value is allowed.

Per record, on the same GGUF file pcd loads (default: the embedded model's own file,
``pcd_cli.backends.torch_backend.embedded_gguf_path``):

* the prompt is pcd's own (same instructions, catalog and chat template), token for token,
  up to the JSON opener, which the grammar makes the model write;
* greedy decoding (``temperature=0``), the grammar of ``answer_json_schema(schema)`` converted
  by ``llama_cpp.LlamaGrammar.from_json_schema``, generation capped as for transformers;
* llama.cpp's own KV prefix reuse between records (``Llama.generate`` keeps the longest
  common token prefix of the previous call: the prompt head is computed once);
* ``n_threads`` = the threads pcd's backend uses.

Also timed: llama.cpp's prefill alone of each record (one token generated, no grammar): its
forward limit on the same prompt.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from .errors import InputError, ModelError
from .schema.model import NULL_LABEL, Schema

#: ``pcd bench`` method names of the llama.cpp rows: grammar-constrained JSON generation.
LLAMA_METHOD = "llama.cpp"
INSTALL_HINT = ("pip install 'pcd-cli[bench]' (llama-cpp-python compiles llama.cpp: about 10 minutes; "
                "CMAKE_ARGS=\"-DGGML_NATIVE=ON\" builds it for this CPU)")


def llama_cpp_available() -> bool:
    """Whether ``llama_cpp`` (llama-cpp-python) is importable (without importing it)."""
    return importlib.util.find_spec("llama_cpp") is not None


def answer_json_schema(schema: Schema) -> dict:
    """The JSON Schema of the answer object pcd reads: every declared field required, in
    schema order, no other key.

    boolean -> ``{"type": "boolean"}``; enum/ordinal -> ``{"enum": labels}``; integer ->
    ``{"enum": [ints]}`` (unquoted, as pcd writes it); nullable -> ``null`` added to the enum;
    multi -> an object of one boolean per option, all required (the line pcd writes:
    ``"topics": {"billing": true, ...}``).
    """
    props: dict = {}
    for f in schema.declared:
        if f.is_multi:
            props[f.name] = {"type": "object", "properties": {o: {"type": "boolean"} for o in f.labels},
                             "required": list(f.labels), "additionalProperties": False}
            continue
        if f.is_boolean and not f.nullable:
            props[f.name] = {"type": "boolean"}
            continue
        values = [f.value(i) for i in range(len(f.labels))]
        if f.nullable:
            values = [v for v in values if v is not None] + [None]
        props[f.name] = {"enum": values}
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def baseline_gguf(model: str | None) -> Path:
    """The GGUF file llama.cpp runs for ``--model`` (``None``: the embedded model's own file).

    Raises:
        InputError: ``model`` is not a ``.gguf`` file (llama.cpp reads nothing else).
        ModelError: the embedded model is not installed.
    """
    if model is None:
        from .backends.torch_backend import embedded_gguf_path

        return embedded_gguf_path()
    path = Path(model)
    if path.suffix.lower() != ".gguf" or not path.is_file():
        raise InputError(f"--baseline llama.cpp runs a GGUF file; --model {model!r} is not one "
                         "(give --model x.gguf, or leave --model out for the embedded model's own file)")
    return path


def prompt_ids_before_opener(labeler, record) -> list[int]:
    """pcd's prompt for ``record``, token ids from the start (head included), without the JSON
    opener that ends it (the grammar makes the model write the whole object).

    The prompt's tail is re-tokenized without its opener after the same anchor pcd uses
    (``CompiledSchema.encode_context``); the record's tokens are pcd's own.

    Raises:
        RecordError: as ``CompiledSchema.record_chain``.
    """
    compiled = labeler.compiled
    prompt = compiled.prompt
    opener = prompt.layout.opener
    _, after = prompt.record_ids(record.id, record.text)
    ids = list(prompt.head_ids) + list(after)
    tail = compiled.encode_context(prompt.tail_text)
    bare = compiled.encode_context(prompt.tail_text[: len(prompt.tail_text) - len(opener)])
    keep = 0
    while keep < min(len(tail), len(bare)) and tail[keep] == bare[keep]:
        keep += 1
    cut = len(tail) - keep  # tokens of the tail that change once the opener is gone
    if cut == 0 or ids[len(ids) - cut:] != tail[keep:]:
        raise ModelError("llama.cpp baseline: the prompt's last tokens are not its tail's (cannot take the "
                         "JSON opener off)")
    return ids[: len(ids) - cut] + bare[keep:]


@dataclass(frozen=True)
class LlamaRun:
    """One record through llama.cpp.

    Attributes:
        record: record id as text.
        latency_s: wall-clock seconds of the grammar-constrained generation.
        prefill_s: wall-clock seconds of the same prompt with one token generated, no grammar.
        prompt_tokens: tokens of the prompt (head included; the head is reused from the cache).
        output_tokens: tokens generated under the grammar.
        text: the generated text.
        hit_cap: generation stopped at the token cap.
    """

    record: str
    latency_s: float
    prefill_s: float
    prompt_tokens: int
    output_tokens: int
    text: str
    hit_cap: bool


def run_llamacpp(labeler, records, *, gguf: Path, n_threads: int, max_new_tokens: int,
                 prefill: bool = True, gpu: bool = False) -> tuple[list[LlamaRun], dict]:
    """Generate each record's answer with llama.cpp under the schema's JSON grammar.

    Args:
        labeler: the ``Labeler`` pcd benchmarks (its prompt and tokenizer are used).
        records: ``Record`` values, in order (the first is also run once untimed: warm-up,
            the prompt head enters llama.cpp's cache).
        gguf: the GGUF file (``baseline_gguf``).
        n_threads: llama.cpp threads (generation and batch).
        max_new_tokens: generation cap per record.
        prefill: also time the prompt alone (one token, no grammar) per record.
        gpu: offload every layer (``n_gpu_layers=-1``; pcd runs on a GPU too), else none.

    Returns:
        ``(runs, info)``: one ``LlamaRun`` per record; ``info`` holds ``llama_cpp_version``,
        ``gguf``, ``n_threads``, ``load_s`` and ``grammar_s`` (grammar build), not timed per record.

    Raises:
        ModelError: llama-cpp-python is not installed (the message says how to install it).
    """
    if not llama_cpp_available():
        raise ModelError(f"--baseline llama.cpp needs llama-cpp-python: {INSTALL_HINT}")
    import llama_cpp

    prompts = [prompt_ids_before_opener(labeler, r) for r in records]
    n_ctx = max(len(p) for p in prompts) + max_new_tokens + 16
    started = time.perf_counter()
    llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=n_ctx, n_batch=512, n_threads=n_threads,
                          n_threads_batch=n_threads, n_gpu_layers=-1 if gpu else 0, seed=0, verbose=False)
    load_s = time.perf_counter() - started
    started = time.perf_counter()
    grammar = llama_cpp.LlamaGrammar.from_json_schema(json.dumps(answer_json_schema(labeler.schema)),
                                                      verbose=False)
    grammar_s = time.perf_counter() - started

    def generate(ids, cap, with_grammar):
        out = llm.create_completion(prompt=ids, max_tokens=cap, temperature=0.0, top_k=1,
                                    grammar=grammar if with_grammar else None)
        choice = out["choices"][0]
        return choice["text"], out["usage"]["completion_tokens"], choice.get("finish_reason") == "length"

    generate(prompts[0], max_new_tokens, True)  # warm-up: the head enters the cache
    timed = []
    for ids in prompts:  # each call reuses the previous one's longest common prefix: the head
        started = time.perf_counter()
        text, n_out, hit_cap = generate(ids, max_new_tokens, True)
        timed.append((time.perf_counter() - started, text, n_out, hit_cap))
    prefills = [float("nan")] * len(prompts)
    if prefill:  # after the generation loop, so that no record finds its own prompt cached
        for i, ids in enumerate(prompts):
            started = time.perf_counter()
            generate(ids, 1, False)
            prefills[i] = time.perf_counter() - started
    runs = [LlamaRun(str(r.id), t, p, len(ids), n_out, text, hit_cap)
            for r, ids, (t, text, n_out, hit_cap), p in zip(records, prompts, timed, prefills)]
    return runs, {"llama_cpp_version": getattr(llama_cpp, "__version__", "?"), "gguf": str(gguf),
                  "n_threads": n_threads, "gpu_layers": "all" if gpu else "none", "load_s": load_s,
                  "grammar_s": grammar_s}


def agreement_per_field(schema: Schema, pairs) -> dict[str, float]:
    """Per declared field, the share of records where the baseline's value equals pcd's.

    Args:
        pairs: ``(pcd values, baseline values)`` per record, each ``{field: value}``
            (``io.output.declared_values`` / ``bench.check_generated``); a missing baseline
            value counts as a disagreement.
    """
    pairs = list(pairs)
    return {f.name: sum(other.get(f.name, NULL_LABEL) == mine.get(f.name) for mine, other in pairs) / len(pairs)
            for f in schema.declared} if pairs else {}


def llamacpp_summary(runs: list[LlamaRun], pcd_packed_records_per_s: float, pcd_median_latency_s: float) -> dict:
    """Records/s, generated tokens and prefill rate of the llama.cpp runs, and pcd's ratios.

    Args:
        pcd_packed_records_per_s: pcd's packed rate to compare with (``run_bench``: over its two
            packed runs).

    Returns keys ``llama_cpp_records_per_s`` (records over summed generation time),
    ``llama_cpp_median_output_tokens``, ``llama_cpp_prefill_records_per_s`` (records over
    summed prefill-only time), ``pcd_packed_vs_llama_cpp`` (pcd packed records/s over
    llama.cpp's), ``pcd_one_vs_llama_cpp`` (llama.cpp median latency over pcd's one record
    alone), ``llama_cpp_prefill_vs_pcd_packed`` (llama.cpp prefill-only records/s over pcd's
    packed records/s).
    """
    total = sum(r.latency_s for r in runs)
    prefill = [r.prefill_s for r in runs if r.prefill_s == r.prefill_s]
    rps = len(runs) / total
    out = {"llama_cpp_records_per_s": rps,
           "llama_cpp_median_latency_s": statistics.median(r.latency_s for r in runs),
           "llama_cpp_median_output_tokens": statistics.median(r.output_tokens for r in runs),
           "llama_cpp_mean_output_tokens": statistics.mean(r.output_tokens for r in runs),
           "pcd_packed_records_per_s_two_runs": pcd_packed_records_per_s,
           "pcd_packed_vs_llama_cpp": pcd_packed_records_per_s / rps,
           "pcd_one_vs_llama_cpp": statistics.median(r.latency_s for r in runs) / pcd_median_latency_s}
    if prefill:
        out["llama_cpp_prefill_records_per_s"] = len(prefill) / sum(prefill)
        out["llama_cpp_prefill_vs_pcd_packed"] = out["llama_cpp_prefill_records_per_s"] / pcd_packed_records_per_s
    return out
