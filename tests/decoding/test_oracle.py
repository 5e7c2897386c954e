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

from ..helpers import CASES, TEXTS, label_case
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


# -- every case of tests/data/cases.jsonl (schema and label cases from public bug reports of similar
# tools; formerly tests/test_cases.py): each labels validly and matches the oracle

def _check_against_oracle(backend, schema, result, scoring, *, sample=True):
    """Every field of the case against the oracle: its top two labels' ``p * mass`` (``make
    test``), or every label and the mass (``make test-full``); tests/oracle_sample.py."""
    worst, checked = max_oracle_diff(backend, schema, [result], scoring, sample=sample)
    assert checked == len(schema.fields)
    assert worst < 1e-4


def _case_labels_validly_and_matches_oracle(backend, case_id, *, sample):
    case = CASES[case_id]
    schema, _, result = label_case(backend, case)
    for field, res in zip(schema.fields, result.fields):
        assert res.value in ((True, False) if field.is_boolean else field.labels)
        assert abs(sum(res.probs) - 1) < 1e-9 and 0 < res.mass <= 1
    if max(len(f.labels) for f in schema.fields) <= 10:
        _check_against_oracle(backend, schema, result, "marginal", sample=sample)
    picked = {f.name: r.value for f, r in zip(schema.fields, result.fields)}
    print(f"{case_id}: picked {picked}, case expects {case['expected'].get('label', case['expected'].get('labels'))}")


@pytest.mark.parametrize("case_id", [pytest.param(c, marks=pytest.mark.full) if c == "large-enum-parser-blowup" else c
                                     for c in sorted(CASES)])  # its 255 labels stay in make test (test_label_strings.py)
def test_case_labels_validly_and_matches_oracle(embedded_backend, case_id):
    _case_labels_validly_and_matches_oracle(embedded_backend, case_id, sample=True)


@pytest.mark.full
@pytest.mark.parametrize("case_id", sorted(CASES))
def test_case_matches_oracle_on_every_label(embedded_backend, case_id):
    _case_labels_validly_and_matches_oracle(embedded_backend, case_id, sample=False)
