"""Every label is scored exactly as the schema writes it: labels sharing a prefix, a label that is a
prefix of another, labels colliding on their first token, 255 shared-prefix labels, mixed case,
quotes, slashes, backslashes and non-ASCII text, each to its closing quote.

Each test runs a case of tests/data/cases.jsonl (from public bug reports of similar tools; it was
in tests/test_cases.py) on the embedded model; the case's id is named in the test.
"""

from __future__ import annotations

import pytest

from pcd_cli.api import Labeler
from pcd_cli.schema.load import parse_schema

from ..helpers import CASES, label_case


def test_shared_prefix_labels_score_end_of_label(embedded_backend):
    case = CASES["shared-prefix-labels-no-eos"]
    schema, labeler, first = label_case(embedded_backend, case, scoring="exact")
    (again,) = list(labeler.label([case["input"]]))  # repeated calls: no crash, same numbers
    assert first.fields[0].probs == again.fields[0].probs
    p0, p1, p12 = first.fields[0].probs
    assert p1 > 0 and p12 > 0 and abs(p0 + p1 + p12 - 1) < 1e-9
    lines = dict((l["label"], l["text"]) for l in first.traces[0]["lines"])
    assert lines["1"].endswith('"1"\n}') and lines["12"].endswith('"12"\n}')  # closing quote and line end scored


def test_first_token_collision_is_followed_not_tied(embedded_backend):
    schema, _, result = label_case(embedded_backend, CASES["first-token-only-enum"])
    p_weather, p_time = result.fields[0].probs
    assert abs(p_weather - p_time) > 1e-3  # a tie would mean the shared first token decided


def test_label_that_is_prefix_of_another(embedded_backend):
    schema, labeler, result = label_case(embedded_backend, CASES["label-is-prefix-of-other-label"])
    compiled = labeler.compiled
    forest = compiled.wave_plan(0, compiled.prompt.tail_text).forests[0]
    decode = embedded_backend.tokenizer.decode
    john = next(t for t in forest.terminals if schema.fields[0].labels[t.label] == "John")
    q, c = john.edges[-1]
    assert '"' in decode([forest.query_ids[q][c]])  # 'John' is scored with its closing quote
    assert min(result.fields[0].probs) > 0


def test_slash_and_special_characters_round_trip(embedded_backend):
    schema, _, result = label_case(embedded_backend, CASES["slash-in-enum-escaped"])
    texts = [l["text"] for l in result.traces[0]["lines"]]
    assert any('"http://example.com/path"' in t for t in texts) and not any("\\/" in t for t in texts)
    assert result.fields[0].value in ("http://example.com/path", "https://example.org/a/b")
    special = parse_schema({"fields": {"x": {"type": "enum", "labels": ['say "hi"', "a\\b", "R&D team", "ok"]}}})
    labeler = Labeler(special, backend=embedded_backend)
    (res,) = list(labeler.label(["The R&D team said hi."]))
    assert set(special.fields[0].labels) >= {res.fields[0].value}
    assert abs(sum(res.fields[0].probs) - 1) < 1e-9


@pytest.mark.parametrize("case_id", ["cjk-enum-latin1-mangled", "emoji-grammar-crash"])
def test_non_ascii_label_lines_round_trip_through_the_tokenizer(embedded_backend, case_id):
    schema, labeler, result = label_case(embedded_backend, CASES[case_id])
    tok = embedded_backend.tokenizer
    for trace in result.traces:
        for line in trace["lines"]:
            assert tok.decode(tok.encode(trace["context"] + line["text"])) == trace["context"] + line["text"]
    for field, res in zip(schema.fields, result.fields):
        assert res.value in field.labels and min(res.probs) > 0


def test_255_shared_prefix_labels_compile_and_score_exactly(embedded_backend):
    schema, labeler, result = label_case(embedded_backend, CASES["large-enum-parser-blowup"])
    probs = result.fields[0].probs
    assert len(probs) == 255 and abs(sum(probs) - 1) < 1e-9 and min(probs) > 0
    forest = labeler.compiled.wave_plan(0, labeler.compiled.prompt.tail_text).forests[0]
    by_label = {schema.fields[0].labels[t.label]: t.edges for t in forest.terminals}
    assert len({by_label["CAT_001"], by_label["CAT_012"], by_label["CAT_123"]}) == 3


def test_mixed_case_labels_are_kept_exactly(embedded_backend):
    schema, _, result = label_case(embedded_backend, CASES["enum-case-variants-unsupported-backend"])
    assert schema.fields[0].labels == ("sedan", "SUV", "Truck", "Coupe")
    assert result.fields[0].value in schema.fields[0].labels
