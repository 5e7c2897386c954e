"""Order-debiased labelling (``--permutations K``, issue #18 item 1): every ordering's branch
against the brute-force oracle, invariance of the combined probabilities under reordering the
schema's label list, and the output columns."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from pcd_cli.decoding.compile import CompiledSchema
from pcd_cli.decoding.decode import Decoder
from pcd_cli.results import Record
from pcd_cli.errors import SchemaError
from pcd_cli.decoding.oracle import oracle_field
from pcd_cli.decoding.permute import (balanced_counts, compile_orderings, label_orderings, max_orderings,
                                      orderings_for)
from pcd_cli.schema.load import parse_schema

from ..helpers import TEXTS, pcd, tiny_backend

TOL = 1e-4
FIELDS = {"sentiment": {"type": "enum", "labels": ["NEGATIVE", "NEUTRAL", "POSITIVE"]},
          "urgent": {"type": "boolean"},
          "severity": {"type": "ordinal", "labels": ["LOW", "HIGH"]},
          "route": {"type": "enum", "labels": ["billing", "tech", "sales"], "depends_on": ["urgent"]}}


def test_orderings_are_the_cyclic_shifts_and_their_reversals():
    assert label_orderings(3) == [(0, 1, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0), (0, 2, 1), (1, 0, 2)]
    assert label_orderings(2) == [(0, 1), (1, 0)]
    assert len(label_orderings(5)) == 10 and len(set(label_orderings(5))) == 10
    schema = parse_schema({"fields": FIELDS})
    orders = orderings_for(schema, 6)
    assert [o["sentiment"] for o in orders] == label_orderings(3)
    assert [o["urgent"] for o in orders] == [(0, 1), (1, 0)] * 3
    assert all("severity" not in o for o in orders)  # an ordinal scale keeps its order
    with pytest.raises(SchemaError, match="--permutations 7: unbalanced for field 'sentiment'"):
        orderings_for(schema, 7)
    twice = orderings_for(schema, 12)  # balanced, past the 6 distinct ones: they repeat (pcd serve's one K)
    assert twice == orders + orders


@pytest.mark.parametrize("sizes", [(3,), (2,), (4,), (2, 3), (3, 4), (2, 5)])
def test_only_balanced_counts_are_accepted_and_they_put_each_label_at_each_place_equally_often(sizes):
    """Issue #45: ``--permutations 4`` on a 3-label field was accepted (one label listed first twice
    as often as another). Every K is checked: accepted exactly when each field's labels are at each
    place equally often; refused naming the field and the counts that fit."""
    schema = parse_schema({"fields": {f"f{i}": {"type": "enum", "labels": [f"l{j}" for j in range(n)]}
                                      for i, n in enumerate(sizes)}})
    fit = balanced_counts(schema)
    for k in range(2, 2 * max(sizes) + 2 + (fit[-1] if fit else 0)):
        try:
            orders = orderings_for(schema, k)
        except SchemaError as exc:
            assert k not in fit
            assert f"--permutations {k}: unbalanced for field 'f" in str(exc)
            assert f"(for every field of this schema: {' or '.join(map(str, fit))})" in str(exc)
            continue
        assert k in fit or (k > max(fit[-1], max_orderings(schema)) and k % fit[0] == 0)
        for i, n in enumerate(sizes):
            places = np.zeros((n, n), dtype=int)  # label x place
            for o in orders:
                for place, label in enumerate(o[f"f{i}"]):
                    places[label, place] += 1
            assert (places == k // n).all()
    expected = {(3,): [3, 6], (2,): [2], (4,): [4, 8], (2, 3): [6], (3, 4): [12], (2, 5): [10]}[sizes]
    assert fit == expected
    with pytest.raises(SchemaError, match="no boolean or enum field"):
        orderings_for(parse_schema({"fields": {"n": {"type": "integer", "minimum": 1, "maximum": 3}}}), 2)


def _decode(backend, schema, k, scoring, texts=TEXTS):
    orderings = compile_orderings(schema, backend.tokenizer, k, scoring=scoring, logits_width=backend.logits_width)
    decoder = Decoder(backend, orderings[0], orderings=orderings, trace=True)
    return orderings, decoder, decoder.decode([Record(i, t) for i, t in enumerate(texts)])


@pytest.mark.parametrize("scoring", ["marginal", pytest.param("exact", marks=pytest.mark.full)])
def test_every_ordering_branch_matches_the_oracle_and_combines_by_the_mean(scoring):
    backend = tiny_backend()
    schema = parse_schema({"fields": FIELDS})
    orderings, decoder, results = _decode(backend, schema, 6, scoring, texts=TEXTS[:1])
    assert len({c.prompt.head_ids for c in orderings}) == 1  # one head, cached once
    worst = 0.0
    for result in results:
        assert len(result.traces) == 6 * len(schema.fields)
        for fi, field in enumerate(schema.fields):
            traces = [t for t in result.traces if t["field"] == field.name]
            assert len({t["context"] for t in traces}) == 6  # each ordering its own prompt
            branch = []
            for t in traces:
                lines = [(field.labels.index(line["label"]), line["text"]) for line in t["lines"]]
                probs, mass = oracle_field(backend, t["context"], field, lines, scoring)
                got = np.array([t["probs"][label] for label in field.labels])
                worst = max(worst, float(np.abs(got - probs).max()), abs(t["mass"] - mass))
                branch.append(got)
            res = result.fields[fi]
            assert np.allclose(res.probs, np.mean(branch, axis=0), atol=1e-12)
            assert res.label == int(np.argmax(res.probs))
            assert res.order_spread == pytest.approx(max(b[res.label] for b in branch) - min(b[res.label] for b in branch))
    assert worst < TOL


def test_combined_probabilities_do_not_depend_on_the_schema_label_order():
    """With every ordering of the set (K = 2n), reversing or shifting the schema's list gives the
    same set of prompts, so the same combined probabilities (one permuted field)."""
    backend = tiny_backend()
    labels = ["NEGATIVE", "NEUTRAL", "POSITIVE"]
    per_schema = []
    for order in (labels, labels[::-1], labels[1:] + labels[:1]):
        schema = parse_schema({"fields": {"sentiment": {"type": "enum", "labels": order}}})
        _, _, results = _decode(backend, schema, 6, "marginal")
        per_schema.append([{schema.fields[0].labels[i]: p for i, p in enumerate(r.fields[0].probs)} for r in results])
    for other in per_schema[1:]:
        for a, b in zip(per_schema[0], other):
            assert max(abs(a[label] - b[label]) for label in labels) < 1e-5


def test_the_record_is_fed_once_for_all_orderings():
    backend = tiny_backend()
    schema = parse_schema({"fields": {"sentiment": FIELDS["sentiment"]}})
    text = ("a long record " * 40).strip()
    _, decoder, results = _decode(backend, schema, 6, "marginal", texts=[text])
    assert not hasattr(results[0], "error")
    plain = Decoder(backend, CompiledSchema(schema, backend.tokenizer, label_orders=orderings_for(schema, 3)[0],
                                            logits_width=backend.logits_width))
    plain.decode([Record(0, text)])
    record_tokens = len(backend.tokenizer.encode(text))
    # six branches of (tail + forest) and the shared record once, not six records
    assert decoder.tokens_fed < plain.tokens_fed + 5 * (plain.tokens_fed - record_tokens)
    assert decoder.tokens_fed < 6 * plain.tokens_fed - 4 * record_tokens


def test_pcd_label_permutations_writes_the_spread_and_the_orderings(tmp_path):
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"id": f"r{i}", "text": t}) + "\n" for i, t in enumerate(TEXTS)))
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({"fields": {"sentiment": FIELDS["sentiment"], "urgent": FIELDS["urgent"]}}))
    out = tmp_path / "out.parquet"
    pcd("label", data, "-s", schema, "-o", out, "--permutations", "6")
    table = pq.read_table(out)
    meta = json.loads(table.schema.metadata[b"pcd.permutations"])
    assert meta["k"] == 6 and meta["orders"]["sentiment"][1] == ["NEUTRAL", "POSITIVE", "NEGATIVE"]
    assert meta["orders"]["sentiment"][3] == ["POSITIVE", "NEUTRAL", "NEGATIVE"]
    assert meta["orders"]["urgent"] == [["true", "false"], ["false", "true"]] * 3
    spread = table.column("sentiment__order_spread").to_pylist()
    assert len(spread) == 3 and all(0 <= s <= 1 for s in spread)
    result = pcd("label", data, "-s", schema, "-o", out, "--permutations", "9", code=2)
    assert "--permutations 9: unbalanced for field 'urgent' (2 labels)" in " ".join(result.stderr.split())
    result = pcd("label", data, "-s", schema, "-o", out, "--permutations", "4", code=2)  # issue #45
    assert "--permutations 4: unbalanced for field 'sentiment' (3 labels)" in " ".join(result.stderr.split())


def test_prior_correction_and_calibration_keep_the_order_spread():
    from pcd_cli.api import _reweighted
    from pcd_cli.results import FieldResult

    field = parse_schema({"fields": {"s": {"type": "enum", "labels": ["a", "b"]}}}).fields[0]
    res = FieldResult(label=0, value="a", prob=0.6, mass=0.5, probs=(0.6, 0.4), order_spread=0.3)
    moved = _reweighted(field, res, np.array([0.2, 0.8]))
    assert (moved.value, moved.order_spread, moved.raw_probs) == ("b", 0.3, (0.6, 0.4))
