"""Trunk sharing between a wave's forests (issue #38): a multi field's options share the text
``"topics": {"`` before their own key, so it is fed once per record and each option adds only
its key and its yes/no decision; every option still equals the brute-force oracle."""

from __future__ import annotations

import pytest

from pcd_cli.decoding.compile import CompiledSchema
from pcd_cli.decoding.decode import Decoder
from pcd_cli.decoding.prompt import common_prefix_len
from pcd_cli.results import Record
from pcd_cli.schema.load import parse_schema

from ..helpers import TEXTS, tiny_backend
from ..oracle_sample import max_oracle_diff

OPTIONS = ["delay", "cancellation", "baggage", "customer_service", "booking", "refund", "seating", "food",
           "crew", "wifi", "price", "loyalty_program"]
SCHEMA = {"fields": {
    "sentiment": {"type": "enum", "labels": ["NEGATIVE", "NEUTRAL", "POSITIVE"]},
    "mentions_delay": {"type": "boolean"},
    "topics": {"type": "multi", "labels": OPTIONS, "description": "What the tweet is about"},
}}


@pytest.fixture(scope="module")
def schema():
    return parse_schema(SCHEMA)


def _unshared(plan):
    return sum(len(f.ids) for f in plan.forests)


def test_each_option_shares_the_previous_options_trunk(schema):
    backend = tiny_backend()
    compiled = CompiledSchema(schema, backend.tokenizer, logits_width=backend.logits_width)
    plan = compiled.default_plans()[1]
    options = [f for f in plan.forests if schema.fields[f.field_index].group == "topics"]
    assert len(options) == 12
    assert options[0].shared == 0 or options[0].shared == common_prefix_len(plan.forests[0].ids, options[0].ids)
    tok = backend.tokenizer
    for before, forest in zip(options, options[1:]):
        k = forest.shared
        assert forest.ids[:k] == before.ids[:k] and k <= min(forest.trunk_len, before.trunk_len)
        assert k == min(common_prefix_len(before.ids, forest.ids), forest.trunk_len, before.trunk_len)
        assert '"topics": {"' in tok.decode(list(plan.context_ids) + list(forest.ids[:k]))
    # every option after the first saves the shared tokens; the plan counts them once
    assert plan.n_tokens == _unshared(plan) - sum(f.shared for f in plan.forests)
    assert sum(f.shared for f in options[1:]) >= 11 * 4


@pytest.mark.parametrize("scoring, pack", [("marginal", True), ("exact", True),
                                           pytest.param("marginal", False, marks=pytest.mark.full)])  # 35 s unpacked
def test_every_option_matches_the_oracle_with_shared_trunks(schema, scoring, pack):
    backend = tiny_backend()
    compiled = CompiledSchema(schema, backend.tokenizer, scoring=scoring, logits_width=backend.logits_width)
    decoder = Decoder(backend, compiled, trace=True, pack_records=pack)
    results = decoder.decode([Record(i, t) for i, t in enumerate(TEXTS)])
    worst, checked = max_oracle_diff(backend, schema, results, scoring, sample=False)
    assert checked == len(schema.fields) * len(TEXTS) == 14 * 3
    assert worst < 1e-4


def test_shared_trunks_survive_a_pass_split(schema):
    """A budget that cuts a wave inside the options: shared tokens fed in an earlier pass are
    still attended to there (their KV stays in the cache until the wave ends)."""
    backend = tiny_backend()
    compiled = CompiledSchema(schema, backend.tokenizer, logits_width=backend.logits_width)
    decoder = Decoder(backend, compiled, trace=True, max_tokens_per_pass=16)
    results = decoder.decode([Record(i, t) for i, t in enumerate(TEXTS[:2])])
    worst, _ = max_oracle_diff(backend, schema, results, "marginal", sample=False)
    assert worst < 1e-4
    assert decoder.record_passes > 2 * len(schema.waves)


def test_tokens_fed_per_record_drop_by_the_shared_trunks(schema):
    backend = tiny_backend()
    compiled = CompiledSchema(schema, backend.tokenizer, logits_width=backend.logits_width)
    decoder = Decoder(backend, compiled)
    (result,) = decoder.decode([Record(0, TEXTS[0])])
    assert schema.waves == ((0,), tuple(range(1, 14)))
    plan0 = compiled.wave_plan(0, compiled.prompt.tail_text)
    plan1 = compiled.wave_plan(1, compiled.prompt.tail_text + compiled.written_text({0: result.fields[0].label}))
    chain = len(compiled.record_chain(0, TEXTS[0])[1])
    written = len(plan1.context_ids) - len(plan0.context_ids)
    saved = sum(f.shared for f in plan1.forests)
    assert decoder.tokens_fed == chain + plan0.n_tokens + written + plan1.n_tokens
    assert decoder.tokens_fed == chain + _unshared(plan0) + written + _unshared(plan1) - saved
    assert saved >= 11 * 4
