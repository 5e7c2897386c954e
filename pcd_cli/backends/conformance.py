"""Backend conformance: any backend's decoder results against an independent oracle.

Library code so every backend runs the same checks (tests/backends/test_conformance.py runs them
for ``TorchBackend``; the MLX backend's tests call ``run_family`` with its own loader):

1. ``build_tiny_model(family, folder)`` writes a tiny random-initialised checkpoint of one
   architecture family (``FAMILIES``) as a transformers folder (config, safetensors,
   tokenizer), small enough for CPU tests yet with the features that break naive caching:
   sliding windows (``WINDOW`` positions, crossed by the head alone), alternating
   sliding/full layers, and ``longrope`` whose short/long switch falls between the test's
   short and long records.
2. ``EagerOracle(folder)`` loads the same weights with **eager attention** and scores with
   a **full forward over the complete text, no cache** (``full_logprobs``), for
   ``pcd_cli.decoding.oracle.oracle_field``. It shares no code with any backend.
3. ``check_decoder(backend, oracle, ...)`` decodes records through ``Decoder`` (both scoring
   modes, packed and one record per pass) and returns the largest difference from the
   oracle over every label probability and candidate mass.

The bar (docs/how-it-works.md, "The correctness oracle"): ``TOLERANCE`` = 1e-4 in float32.

Architectures that cannot be scored exactly (recurrent/hybrid layers) must be refused when
loaded: ``REFUSED_FAMILIES`` lists tiny configs for that check.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..decoding.compile import CompiledSchema
from ..decoding.decode import Decoder
from ..decoding.oracle import oracle_decision_features, oracle_field, oracle_pooled_features
from ..results import Record, RecordResult
from ..schema.load import parse_schema
from ..schema.model import Schema

#: Largest allowed |pcd - oracle| over probabilities and candidate mass, in float32.
TOLERANCE = 1e-4
#: Sliding window of the tiny sliding-window models, in positions (far below any head).
WINDOW = 24
#: ``original_max_position_embeddings`` of the tiny longrope model: between the short
#: records' complete texts and the long record's text (asserted by ``check_decoder``).
LONGROPE_ORIGINAL = 256

#: Families checked, by name: (transformers model_type, config overrides).
FAMILIES: dict[str, tuple[str, dict]] = {
    "llama": ("llama", {}),
    "qwen2": ("qwen2", {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 1}),
    "qwen3": ("qwen3", {}),
    "mistral": ("mistral", {"sliding_window": WINDOW}),
    "gemma3": ("gemma3_text", {"sliding_window": WINDOW, "layer_types": ["sliding_attention", "full_attention"],
                               "query_pre_attn_scalar": 16, "head_dim": 16}),
    "phi3": ("phi3", {"sliding_window": WINDOW}),
    "phi3-longrope": ("phi3", {"max_position_embeddings": 4 * LONGROPE_ORIGINAL,
                               "original_max_position_embeddings": LONGROPE_ORIGINAL, "rope_parameters": {
        "rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": LONGROPE_ORIGINAL,
        "short_factor": [1.0, 1.9, 4.0, 7.5], "long_factor": [1.0, 7.0, 30.0, 80.0]}}),
}
#: Tiny configs of architectures a backend must refuse at load time (recurrent state).
REFUSED_FAMILIES: dict[str, tuple[str, dict]] = {
    "mamba": ("mamba", {}),
    "jamba": ("jamba", {}),
    "qwen3_next": ("qwen3_next", {}),
    "rwkv": ("rwkv", {}),
}

#: Sizes shared by every tiny model.
TINY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 4096, "tie_word_embeddings": True}

#: A schema with a boolean first (quoted and bare spellings), shared prefixes, a label that
#: is a prefix of another and labels colliding on their first token.
SCHEMA = {
    "name": "conformance",
    "fields": {
        "urgent": {"type": "boolean", "description": "Whether the customer needs help today"},
        "deadline": {"type": "enum", "labels": ["1_HOUR", "12_HOURS", "1_WEEK", "NONE"]},
        "action": {"type": "enum", "labels": ["CALL", "CALL BACK", "EMAIL"]},
    },
}
_LONG = ("Our warehouse in Rotterdam reports that pallets 4411 to 4470 arrived with torn wrapping, two of them "
         "soaked, and the carrier's driver left before anyone could sign the damage note. ")
#: Short records, and one long enough to cross the longrope switch on its own.
TEXTS = (
    "Please call me back within 12 hours, my invoice was charged twice.",
    "What time is it in Tokyo right now? The meeting notes from Tuesday mention a 9am slot but nobody confirmed it.",
    "Thanks, all good.",
    _LONG * 6 + "Please call me.",
)


@dataclass(frozen=True)
class Check:
    """One ``check_decoder`` run.

    Attributes:
        max_diff: largest |pcd - oracle| over all label probabilities and masses.
        records: records compared. passes: forward passes the decoder spent on them.
        longest_record: tokens of the longest record part (shows the window was crossed).
        variants: the backend's RoPE variant per record (``Backend.rope_variant``).
    """

    max_diff: float
    records: int
    passes: int
    longest_record: int
    variants: tuple


def tiny_config(family: str, vocab_size: int, *, refused: bool = False):
    """The transformers config of a tiny ``family`` model with ``vocab_size`` tokens."""
    from transformers import AutoConfig

    model_type, overrides = (REFUSED_FAMILIES if refused else FAMILIES)[family]
    sizes = {} if refused else dict(TINY)
    return AutoConfig.for_model(model_type, **{**sizes, "vocab_size": vocab_size, **overrides})


def build_tiny_model(family: str, folder: str | Path, tokenizer_source: str | Path, *, seed: int = 0,
                     refused: bool = False, sharpen: float = 4.0) -> Path:
    """Write a tiny random-initialised ``family`` checkpoint (float32) and tokenizer to ``folder``.

    ``sharpen`` scales every weight so the random model's distributions are peaked enough
    for differences to show. ``refused``: a ``REFUSED_FAMILIES`` entry, written as config and
    tokenizer only (no weights). Returns ``folder``.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = Path(folder)
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_source))
    if refused:  # the config alone: a backend must refuse it before loading any weight
        tiny_config(family, len(tokenizer), refused=True).save_pretrained(str(folder))
        tokenizer.save_pretrained(str(folder))
        return folder
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(family, len(tokenizer), refused=refused),
                                             dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(sharpen)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder


class EagerOracle:
    """The brute-force side: eager attention, full forward over the whole text, no cache.

    Provides what ``pcd_cli.decoding.oracle.oracle_field`` needs (``tokenizer.encode`` and
    ``full_logprobs``), from the checkpoint folder alone.
    """

    def __init__(self, folder: str | Path):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self._torch = torch
        tok = AutoTokenizer.from_pretrained(str(folder))
        self.model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32,
                                                          attn_implementation="eager").eval()
        self.vocab_size = len(tok)
        self.tokenizer = type("OracleTokenizer", (), {
            "encode": staticmethod(lambda text: tok(text, add_special_tokens=False)["input_ids"])})()

    def full_logprobs(self, ids: Sequence[int], rows: Sequence[int] | None = None) -> np.ndarray:
        """float64 ``(len(rows), vocab_size)`` next-token log-probs after each row of ``ids``."""
        torch = self._torch
        keep = torch.tensor(list(rows) if rows is not None else range(len(ids)))
        with torch.inference_mode():
            logits = self.model(input_ids=torch.tensor([list(ids)]), use_cache=False, logits_to_keep=keep).logits[0]
        return torch.log_softmax(logits[:, : self.vocab_size].double(), dim=-1).numpy()


def max_oracle_diff(oracle, schema: Schema, results: Sequence[RecordResult], scoring: str,
                    memo: dict | None = None) -> float:
    """Largest |pcd - oracle| over every field of ``results`` (traced), probabilities and mass.

    ``memo`` (optional) keeps oracle answers by (context, field) across calls.
    """
    memo = {} if memo is None else memo
    worst = 0.0
    for result in results:
        for trace in result.traces:
            fi = schema.field_index(trace["field"])
            field = schema.fields[fi]
            lines = [(field.labels.index(line["label"]), line["text"]) for line in trace["lines"]]
            key = (trace["context"], fi, scoring)
            if key not in memo:
                memo[key] = oracle_field(oracle, trace["context"], field, lines, scoring)
            probs, mass = memo[key]
            got = result.fields[fi]
            worst = max(worst, float(np.abs(np.array(got.probs) - probs).max()), abs(got.mass - mass))
    return worst


def check_decoder(backend, oracle, *, scoring: str, pack: bool, schema: Schema | None = None,
                  texts: Sequence[str] = TEXTS, budget: int = 4096, memo: dict | None = None) -> Check:
    """Decode ``texts`` on ``backend`` and compare every field with ``oracle``.

    Raises:
        AssertionError: a record failed, or the records did not all come back.
    """
    schema = schema or parse_schema(SCHEMA)
    compiled = CompiledSchema(schema, backend.tokenizer, scoring=scoring, logits_width=backend.logits_width)
    decoder = Decoder(backend, compiled, max_tokens_per_pass=budget, trace=True, pack_records=pack)
    results = decoder.decode([Record(i, t) for i, t in enumerate(texts)])
    failed = [r for r in results if not isinstance(r, RecordResult)]
    assert not failed, f"records failed: {failed}"
    longest = max(len(backend.tokenizer.encode(t)) for t in texts)
    variants = tuple(decoder._prepare(Record(i, t)).variant for i, t in enumerate(texts))
    return Check(max_diff=max_oracle_diff(oracle, schema, results, scoring, memo), records=len(results),
                 passes=decoder.record_passes, longest_record=longest, variants=variants)


#: Largest allowed difference, relative to the largest feature's magnitude, between a decision
#: point's hidden state read in a packed pass and read alone or by a plain forward (float32).
FEATURE_TOLERANCE = 1e-5


def check_features(backend, *, schema: Schema | None = None, texts: Sequence[str] = TEXTS,
                   layers: Sequence[int] | None = None) -> dict[str, float]:
    """``Backend.forward_features`` at every field's decision point, packed against alone.

    ``texts`` are decoded with ``Decoder.feature_layers`` set (every layer and every layer's
    record-mean, ``-l``, when ``layers`` is ``None``): packed in one group, one record per group,
    and packed under a small token budget (passes split mid-forest and mid-record); each field's
    features are compared with the single run's, with ``oracle_decision_features`` and with
    ``oracle_pooled_features`` (plain forwards over the complete text, no cache).

    Returns:
        ``{"packed", "split", "oracle", "pooled_oracle"}``: largest |difference| over every
        record, field, layer and dimension, divided by the largest |feature| (compare with
        ``FEATURE_TOLERANCE``).

    Raises:
        AssertionError: a record failed.
    """
    schema = schema or parse_schema(SCHEMA)
    layers = tuple(layers or (*range(1, backend.n_layers + 1), *range(-1, -backend.n_layers - 1, -1)))
    points, pooled = [l for l in layers if l > 0], [l for l in layers if l < 0]
    compiled = CompiledSchema(schema, backend.tokenizer, scoring="marginal", logits_width=backend.logits_width)

    def run(pack: bool, budget: int) -> list[RecordResult]:
        decoder = Decoder(backend, compiled, max_tokens_per_pass=budget, trace=True, pack_records=pack)
        decoder.feature_layers = layers
        results = decoder.decode([Record(i, t) for i, t in enumerate(texts)])
        assert all(isinstance(r, RecordResult) for r in results), f"records failed: {results}"
        return results

    single, packed, split = run(False, 4096), run(True, 4096), run(True, 40)
    scale = max(float(np.abs(f.features[l]).max()) for r in single for f in r.fields for l in layers)
    worst = {"packed": 0.0, "split": 0.0, "oracle": 0.0, "pooled_oracle": 0.0}
    for alone, *others in zip(single, packed, split):
        for name, other in zip(("packed", "split"), others):
            for f, g in zip(alone.fields, other.fields):
                worst[name] = max(worst[name], max(float(np.abs(f.features[l] - g.features[l]).max())
                                                   for l in layers) / scale)
        for trace in alone.traces:
            fi = schema.field_index(trace["field"])
            field = schema.fields[fi]
            lines = [(field.labels.index(line["label"]), line["text"]) for line in trace["lines"]]
            if points:
                want = oracle_decision_features(backend, trace["context"], lines, points)
                got = np.stack([alone.fields[fi].features[l] for l in points])
                worst["oracle"] = max(worst["oracle"], float(np.abs(got - want).max()) / scale)
        if pooled:
            want = oracle_pooled_features(backend, compiled, alone.id, texts[alone.id], [-l for l in pooled])
            for f in alone.fields:  # every field of the record reads the same means
                got = np.stack([f.features[l] for l in pooled])
                worst["pooled_oracle"] = max(worst["pooled_oracle"], float(np.abs(got - want).max()) / scale)
    return worst


def run_family(family: str, folder: str | Path, load: Callable[[Path], object], tokenizer_source: str | Path
               ) -> dict[tuple[str, str], Check]:
    """Build ``family``'s tiny model in ``folder`` (if absent), load it with ``load`` and run
    ``check_decoder`` for both scoring modes, packed and one record per pass.

    Returns ``{(scoring, "packed"|"single"): Check}``.
    """
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        build_tiny_model(family, folder, tokenizer_source)
    backend = load(folder)
    oracle = EagerOracle(folder)
    memo: dict = {}
    return {(scoring, "packed" if pack else "single"): check_decoder(backend, oracle, scoring=scoring, pack=pack,
                                                                      memo=memo)
            for scoring in ("marginal", "exact") for pack in (True, False)}
