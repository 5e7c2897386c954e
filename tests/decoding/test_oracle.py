"""The decoder against the brute-force oracle (plain forward passes over full texts, no cache).

Tiny random models: every decision. The embedded model: a stratified sample in ``make test``
(each field once, both scoring modes, packed and one record per pass), every decision in
``make test-full`` (``-m full``); see ``tests/oracle_sample.py``.
"""

from __future__ import annotations

import pytest

from pcd_cli.decoding.compile import CompiledSchema
from pcd_cli.decoding.decode import Decoder
from pcd_cli.results import Record

from ..helpers import TEXTS
from ..oracle_sample import max_oracle_diff

TOL = 1e-4


def _decode(backend, schema, scoring, budget=2048, pack_records=True):
    compiled = CompiledSchema(schema, backend.tokenizer, scoring=scoring, logits_width=backend.logits_width)
    decoder = Decoder(backend, compiled, max_tokens_per_pass=budget, trace=True, pack_records=pack_records)
    return compiled, decoder, decoder.decode([Record(i, t) for i, t in enumerate(TEXTS)])


def _check(backend, schema, scoring, *, sample, pack_records=True):
    _, _, results = _decode(backend, schema, scoring, pack_records=pack_records)
    assert len(results) == len(TEXTS)
    for result in results:
        assert len(result.traces) == len(schema.fields)
    worst, checked = max_oracle_diff(backend, schema, results, scoring, sample=sample)
    assert checked == (len(schema.fields) if sample else len(schema.fields) * len(TEXTS))
    print(f"{backend.model_id} {scoring}: largest difference from the oracle {worst:.2e} ({checked} decisions)")
    assert worst < TOL


@pytest.mark.parametrize("scoring", ["marginal", "exact"])
@pytest.mark.parametrize("backend_name", ["tiny_chat_backend", "tiny_plain_backend"])
def test_decoder_matches_oracle(request, oracle_schema, scoring, backend_name):
    _check(request.getfixturevalue(backend_name), oracle_schema, scoring, sample=False)


@pytest.mark.parametrize("scoring, pack_records", [("marginal", True),
                                                   pytest.param("exact", False, marks=pytest.mark.full)])
def test_embedded_decoder_matches_oracle_on_a_sample(embedded_backend, oracle_schema, scoring, pack_records):
    _check(embedded_backend, oracle_schema, scoring, sample=True, pack_records=pack_records)


@pytest.mark.full
@pytest.mark.parametrize("scoring", ["marginal", "exact"])
def test_embedded_decoder_matches_oracle_everywhere(embedded_backend, oracle_schema, scoring):
    _check(embedded_backend, oracle_schema, scoring, sample=False)
