"""Decoder rules: packing, budget splits, spellings, first field first, probability sanity."""

from __future__ import annotations

import numpy as np
import pytest

from pcd_cli.decoding.compile import CompiledSchema
from pcd_cli.decoding.decode import Decoder
from pcd_cli.results import Record
from pcd_cli.errors import CompileError
from pcd_cli.decoding.oracle import oracle_field, oracle_label_logprobs
from pcd_cli.schema.load import load_schema, parse_schema

from ..helpers import TEXTS, tiny_backend

MORE_TEXTS = TEXTS + ["URGENT: the production API is down, call me NOW.", "Could you email me the March invoice?"]


def _run(backend, schema, *, scoring="marginal", budget=2048, pack=True, texts=MORE_TEXTS, trace=False,
         truncate="middle"):
    compiled = CompiledSchema(schema, backend.tokenizer, scoring=scoring, logits_width=backend.logits_width)
    decoder = Decoder(backend, compiled, max_tokens_per_pass=budget, pack_records=pack, trace=trace,
                      truncate=truncate)
    results = decoder.decode([Record(i, t) for i, t in enumerate(texts)])
    assert backend.cache_length(decoder.cache) == len(compiled.prompt.head_ids)  # the forest KV is dropped
    return decoder, results


def _max_diff(a, b):
    return max(max(float(np.abs(np.subtract(fa.probs, fb.probs)).max()), abs(fa.mass - fb.mass))
               for ra, rb in zip(a, b) for fa, fb in zip(ra.fields, rb.fields))


@pytest.mark.parametrize("scoring", ["marginal", "exact"])
def test_packed_records_equal_one_record_per_pass(embedded_backend, oracle_schema, scoring):
    packed_dec, packed = _run(embedded_backend, oracle_schema, scoring=scoring)
    single_dec, single = _run(embedded_backend, oracle_schema, scoring=scoring, pack=False)
    assert single_dec.record_passes == 2 * len(MORE_TEXTS)  # two waves, one pass each
    assert packed_dec.record_passes == 2  # every record fits one pass per wave
    assert _max_diff(packed, single) < 1e-5


def _split_forests_stay_exact(*, every_label: bool):
    backend = tiny_backend(seed=3)
    schema = load_schema("schemas/customs_255.yaml")
    texts = ["Batch of 5,000 titanium hex-flange fasteners for turbine rotors.", "Roasted coffee beans, 20 bags."]
    for scoring in ("marginal", "exact") if every_label else ("exact",):  # the last one's forest meets the oracle
        big_dec, big = _run(backend, schema, scoring=scoring, budget=8192, texts=texts, trace=True)
        small_dec, small = _run(backend, schema, scoring=scoring, budget=64, texts=texts)
        assert small_dec.record_passes > 2 * big_dec.record_passes
        assert _max_diff(big, small) < 1e-5
    # and the big forest itself against the oracle (exact scoring): all 255 labels (make test-full),
    # or labels from the first, middle and last parts of the trie plus the winner, as p * mass
    trace = big[1].traces[0]
    field = schema.fields[0]
    lines = [(field.labels.index(l["label"]), l["text"]) for l in trace["lines"]]
    result = big[1].fields[0]
    assert abs(sum(result.probs) - 1) < 1e-9
    if every_label:
        probs, mass = oracle_field(backend, trace["context"], field, lines, "exact")
        assert np.abs(np.array(result.probs) - probs).max() < 1e-4
        assert abs(result.mass - mass) < 1e-4
        return
    sampled = {0, 1, 127, 128, 253, 254, int(np.argmax(result.probs))}
    oracle = oracle_label_logprobs(backend, trace["context"], field, lines, "exact", labels=sampled)
    assert max(abs(result.probs[i] * result.mass - np.exp(oracle[i])) for i in sampled) < 1e-4


def test_forests_split_across_passes_stay_exact():
    _split_forests_stay_exact(every_label=False)


@pytest.mark.full
def test_forests_split_across_passes_stay_exact_on_every_label():
    _split_forests_stay_exact(every_label=True)


@pytest.mark.parametrize("scoring", ["marginal", "exact"])
def test_probabilities_sum_to_one_and_mass_in_unit_interval(embedded_backend, oracle_schema, scoring):
    _, results = _run(embedded_backend, oracle_schema, scoring=scoring)
    for result in results:
        for field, res in zip(oracle_schema.fields, result.fields):
            assert abs(sum(res.probs) - 1.0) < 1e-9
            assert 0.0 < res.mass <= 1.0
            assert res.label == int(np.argmax(res.probs))
            assert res.prob == res.probs[res.label]
            assert res.value == field.value(res.label)


def test_first_field_is_decided_alone_and_written_in(embedded_backend, oracle_schema):
    decoder, results = _run(embedded_backend, oracle_schema, trace=True, texts=TEXTS[:1])
    traces = {t["field"]: t for t in results[0].traces}
    first = oracle_schema.fields[0]
    opener = decoder.compiled.layout.opener
    assert traces[first.name]["context"].endswith(opener)
    chosen = results[0].fields[0].label
    written = decoder.compiled.written_line(0, chosen)
    assert written == decoder.compiled.layout.line(first, first.spellings(chosen)[0], last=False)
    for field in oracle_schema.fields[1:]:
        assert traces[field.name]["context"].endswith(opener + written)


def test_quoted_booleans_are_scored_and_summed(embedded_backend):
    # the raw record: on it SmolLM2 puts real mass on quoted booleans, the paths this test sums
    # (on the quoted prompt it puts less than 0.01 there); tests/test_steering.py checks quoted records
    schema = parse_schema({"fields": {"is_spam": {"type": "boolean", "description": "Whether it is spam"}},
                           "record_quoting": "none"})
    _, results = _run(embedded_backend, schema, scoring="exact", trace=True,
                      texts=["WIN A FREE PRIZE!!! Click this link now."])
    trace = results[0].traces[0]
    field = schema.fields[0]
    lines = [(field.labels.index(l["label"]), l["text"]) for l in trace["lines"]]
    assert [text.split(": ")[1].split("\n")[0] for _, text in lines] == ["true", '"true"', "false", '"false"']
    bare = [(label, text) for label, text in lines if '"true"' not in text and '"false"' not in text]
    _, mass_bare = oracle_field(embedded_backend, trace["context"], field, bare, "exact")
    res = results[0].fields[0]
    assert res.mass > mass_bare + 0.01  # SmolLM2 quotes its booleans: the quoted paths carry real mass
    probs, mass = oracle_field(embedded_backend, trace["context"], field, lines, "exact")
    assert abs(res.mass - mass) < 1e-4 and np.abs(np.array(res.probs) - probs).max() < 1e-4


def test_prefix_labels_are_followed_past_the_shared_part(embedded_backend):
    schema = parse_schema({"fields": {
        "name": {"type": "enum", "labels": ["John", "John Doe"]},
        "code": {"type": "enum", "labels": ["0", "1", "12"]},
        "tool": {"type": "enum", "labels": ["get_weather", "get_time"]}}})
    compiled = CompiledSchema(schema, embedded_backend.tokenizer)
    plan0 = compiled.wave_plan(0, compiled.prompt.tail_text)
    john = plan0.forests[0]
    decode = embedded_backend.tokenizer.decode
    for term in john.terminals:  # 'John' is only told from 'John Doe' by the token after it
        q, c = term.edges[-1]
        token = decode([john.query_ids[q][c]])
        assert ('"' in token) if schema.fields[0].labels[term.label] == "John" else ("D" in token)
    plan1 = compiled.wave_plan(1, plan0.context_text + compiled.written_line(0, 0))
    code, tool = plan1.forests
    depth = {schema.fields[1].labels[t.label]: len(t.edges) for t in code.terminals}
    assert depth == {"0": 1, "1": 2, "12": 2}  # '1' and '12' share the token '1'; the next token decides
    trunk_text = embedded_backend.tokenizer.decode(tool.ids[: len(tool.ids) - len(tool.query_rows) + 1])
    assert trunk_text.endswith('"get_')  # the shared 'get_' is known text, not a decision
    for forest in (code, tool):
        paths = [t.edges for t in forest.terminals]
        assert len(set(paths)) == len(paths) == len(schema.fields[forest.field_index].labels)


def test_label_token_beyond_logits_width_is_a_compile_error(embedded_backend):
    schema = parse_schema({"fields": {"topic": {"type": "enum", "labels": ["billing", "technical"]}}})
    with pytest.raises(CompileError, match="field 'topic', label 'billing': token id .* outside the model's 100 logits"):
        CompiledSchema(schema, embedded_backend.tokenizer, logits_width=100)


def test_padded_logit_columns_are_ignored():
    import torch

    from pcd_cli.backends.torch_backend import TorchBackend

    plain = tiny_backend(seed=5)
    padded_model = type(plain.model)(type(plain.model.config)(**{**plain.model.config.to_dict(),
                                                                  "vocab_size": plain.tokenizer.vocab_size + 64}))
    with torch.no_grad():
        state = plain.model.state_dict()
        for name, tensor in padded_model.state_dict().items():
            src = state[name]
            tensor[: src.shape[0]].copy_(src)
            if tensor.shape[0] != src.shape[0]:
                tensor[src.shape[0]:] = 50.0  # padded rows that would swamp the softmax if counted
    padded = TorchBackend(padded_model.eval(), plain.tokenizer._tok, "padded")
    assert padded.logits_width == plain.logits_width + 64
    schema = parse_schema({"fields": {"relevant": {"type": "boolean"}}})
    _, a = _run(plain, schema, texts=["Quarterly revenue grew 12% year over year."])
    _, b = _run(padded, schema, texts=["Quarterly revenue grew 12% year over year."])
    assert _max_diff(a, b) < 1e-5


def test_record_longer_than_the_context_is_cut_or_refused_alone(embedded_backend, oracle_schema, monkeypatch):
    # the embedded model's own 8192 positions, cut to 1024: the same code path, an eighth of the work
    monkeypatch.setattr(embedded_backend, "max_positions", 1024)
    long_text = "word " * (embedded_backend.max_positions + 10)
    _, results = _run(embedded_backend, oracle_schema, texts=[long_text, TEXTS[1]], truncate="error")
    assert results[0].error.startswith("record 0: too long for the model (")
    assert "the model's context is 1024" in results[0].error
    assert len(results[1].fields) == len(oracle_schema.fields) and not results[1].truncated
    _, cut = _run(embedded_backend, oracle_schema, texts=[long_text, TEXTS[1]])
    assert cut[0].truncated and not cut[1].truncated
    assert [f.label for f in cut[1].fields] == [f.label for f in results[1].fields]  # the other is unaffected
    assert _max_diff(cut[1:], results[1:]) < 1e-5


def test_api_refuses_a_bare_string_and_reads_numbers_as_text(embedded_backend):
    from pcd_cli import Labeler, RecordFailure

    labeler = Labeler(parse_schema({"fields": {"spam": {"type": "boolean"}}}), backend=embedded_backend)
    with pytest.raises(TypeError, match="not a single string"):
        list(labeler.label("hi there"))
    results = list(labeler.label(["ok", 123, ""]))
    assert [type(r).__name__ for r in results] == ["RecordResult", "RecordResult", "RecordFailure"]
    assert isinstance(results[2], RecordFailure) and results[2].error == "row 2: the text is empty"


def test_two_labelers_on_one_backend_do_not_clobber_each_other():
    """Each Labeler owns its KV cache: interleaving two on one backend changes nothing."""
    from pcd_cli import Labeler
    from pcd_cli.backends import Backend

    backend = tiny_backend(seed=7)
    assert isinstance(backend, Backend)  # the Protocol (runtime-checked members)
    spam = parse_schema({"fields": {"spam": {"type": "boolean", "description": "Whether it is spam"}}})
    topic = parse_schema({"fields": {"topic": {"type": "enum", "labels": ["billing", "outage", "other"]},
                                     "urgent": {"type": "boolean"}}})
    texts = MORE_TEXTS[:3]

    def one_by_one(labeler):
        return [r for text in texts for r in labeler.label([text])]

    alone_a = one_by_one(Labeler(spam, backend=backend))
    alone_b = one_by_one(Labeler(topic, backend=backend))
    a, b = Labeler(spam, backend=backend), Labeler(topic, backend=backend)  # b's prefill follows a's
    mixed_a, mixed_b = [], []
    for text in texts:
        mixed_a += a.label([text])
        mixed_b += b.label([text])
    assert [len(r.fields) for r in mixed_a + mixed_b] == [1, 1, 1, 2, 2, 2]
    assert _max_diff(alone_a, mixed_a) == 0.0  # bit-identical
    assert _max_diff(alone_b, mixed_b) == 0.0
