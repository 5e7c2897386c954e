"""Isolated fields (``isolate_fields``, issue #35 item 3): each field decided in its own branch of
the record's prompt. A field's probabilities equal those of its one-field schema alone, whatever
other fields share the schema and in whatever order; every branch matches the brute-force oracle;
the record is fed once for all branches."""

from __future__ import annotations

import numpy as np
import pytest

from pcd_cli.api import Labeler
from pcd_cli.decoding.oracle import oracle_field
from pcd_cli.errors import SchemaError
from pcd_cli.results import Record
from pcd_cli.schema.load import parse_schema

from ..helpers import ORACLE_SCHEMA, TEXTS, tiny_backend

#: packed vs one-record passes differ by float32 rounding only (the decoder's packing bound)
BOUND = 2e-5
TOL = 1e-4  # the oracle bound of the other decoder tests
FIELDS = dict(ORACLE_SCHEMA["fields"])
FIELDS["topics"] = {"type": "multi", "description": "What the message is about",
                    "labels": ["billing", "time", "weather"]}
FIELDS["size"] = {"type": "ordinal", "labels": ["S", "M", "L"], "nullable": True}


@pytest.fixture(scope="module")
def backend():
    return tiny_backend()


def _isolated(backend, fields: dict, **kw):
    return Labeler(parse_schema({"name": "iso", "fields": fields, "isolate_fields": True}), backend=backend, **kw)


def _probs(labeler, texts=TEXTS) -> dict[str, list[np.ndarray]]:
    """Per declared field, per record: its decisions' probabilities concatenated."""
    out: dict[str, list[np.ndarray]] = {}
    results = list(labeler.label(texts))
    for declared, parts in labeler.schema.declared_parts():
        out[declared.name] = [np.concatenate([r.fields[i].probs for i in parts]) for r in results]
    return out


def test_a_field_is_decided_as_if_alone_whatever_the_other_fields(backend):
    # with the steering check (the default): TEXTS[1]'s "What time is it in" addresses the tool
    # field alone (its label get_time), so it is erased for that field's decision and no other's
    assert _isolated(backend, FIELDS).job.steering_check
    together = _probs(_isolated(backend, FIELDS))
    names = list(FIELDS)
    reordered = _probs(_isolated(backend, {n: FIELDS[n] for n in reversed(names)}))
    fewer = _probs(_isolated(backend, {n: FIELDS[n] for n in names[::2]}))
    worst = 0.0
    for name in names:
        alone = _probs(_isolated(backend, {name: FIELDS[name]}))[name]
        for other in (together, reordered) + ((fewer,) if name in fewer else ()):
            for a, b in zip(alone, other[name]):
                worst = max(worst, float(np.abs(a - b).max()))
    assert worst < BOUND
    # without isolation a field does move when its neighbours change (what isolation is for)
    shared = Labeler(parse_schema({"name": "s", "fields": FIELDS}), backend=backend)
    shared_alone = Labeler(parse_schema({"name": "s", "fields": {"refund": FIELDS["refund"]}}), backend=backend)
    moved = max(float(np.abs(a - b).max()) for a, b in zip(_probs(shared)["refund"], _probs(shared_alone)["refund"]))
    assert moved > 100 * BOUND


def test_enum_labels_listed_in_another_order_give_the_same_probabilities(backend):
    """Isolation does not reorder labels by itself: the decision endpoints do (canonical order);
    here the same field, same order, with other fields around, in both schemas."""
    a = _probs(_isolated(backend, {"deadline": FIELDS["deadline"], "tool": FIELDS["tool"]}))
    b = _probs(_isolated(backend, {"tool": FIELDS["tool"], "urgent": FIELDS["urgent"],
                                   "deadline": FIELDS["deadline"]}))
    assert max(float(np.abs(x - y).max()) for x, y in zip(a["deadline"], b["deadline"])) < BOUND


@pytest.mark.parametrize("scoring", ["marginal", pytest.param("exact", marks=pytest.mark.full)])
def test_every_isolated_branch_matches_the_oracle(backend, scoring):
    labeler = _isolated(backend, FIELDS, trace=True, scoring=scoring)
    schema = labeler.schema
    worst = 0.0
    for result in labeler.label(TEXTS[:2]):
        assert len(result.traces) == len(schema.fields)
        for field, trace in zip(schema.fields, result.traces):
            assert trace["field"] == field.name
            # the branch's context: the record, then this field's catalog alone, then its answer
            assert "Key:\n- " + '"' + (field.group or field.name) + '"' in trace["context"]
            others = {f.group or f.name for f in schema.fields} - {field.group or field.name}
            assert not any(f'"{o}"' in trace["context"] for o in others)
            lines = [(field.labels.index(line["label"]), line["text"]) for line in trace["lines"]]
            probs, mass = oracle_field(backend, trace["context"], field, lines, scoring)
            got = np.array([trace["probs"][label] for label in field.labels])
            worst = max(worst, float(np.abs(got - probs).max()), abs(trace["mass"] - mass))
    assert worst < TOL


def test_the_record_is_fed_once_for_every_field(backend):
    texts = TEXTS * 4
    # without the steering check: its second decodes (of the records without their addressing
    # sentences) are extra passes, per field alone but per distinct text together
    together = _isolated(backend, FIELDS, steering_check=False)
    list(together.label(texts))
    separately = 0
    for name in FIELDS:
        alone = _isolated(backend, {name: FIELDS[name]}, steering_check=False)
        list(alone.label(texts))
        separately += alone.decoder.tokens_fed
    # each record's tokens before the branches part (the record text and the prompt around it)
    shared = sum(len(together.decoder._prepare(Record(i, t)).chain) for i, t in enumerate(texts))
    assert shared > 12 * 10
    # separately each of the 7 fields feeds that part of every record; together it is fed once
    assert together.decoder.tokens_fed == separately - (len(FIELDS) - 1) * shared
    assert together.metadata()["pcd.isolate_fields"] == "true"


def test_what_cannot_hold_with_isolation_is_refused(backend):
    with pytest.raises(SchemaError, match="'route': depends_on"):
        parse_schema({"fields": {"urgent": {"type": "boolean"},
                                 "route": {"type": "enum", "labels": ["a", "b"], "depends_on": ["urgent"]}},
                      "isolate_fields": True})
    with pytest.raises(SchemaError, match="isolate_fields' must be true or false"):
        parse_schema({"fields": {"urgent": {"type": "boolean"}}, "isolate_fields": "yes"})
    schema = parse_schema({"fields": FIELDS})
    with pytest.raises(SchemaError, match="--permutations 2 cannot be combined with isolate_fields"):
        Labeler(schema, backend=backend, isolate_fields=True, permutations=2)
    with pytest.raises(SchemaError, match="few-shot examples cannot be combined"):
        Labeler(schema, backend=backend, isolate_fields=True,
                examples=parse_schema({"fields": {"urgent": {"type": "boolean"}},
                                       "examples": [{"text": "x", "labels": {"urgent": True}}]}).examples)
    # the run's option and the schema's key are one switch
    assert Labeler(schema, backend=backend, isolate_fields=True).isolate_fields
    assert parse_schema({"fields": FIELDS, "isolate_fields": True}).source_sha256 != schema.source_sha256


def test_pcd_tune_refuses_an_isolated_schema_before_loading_a_model(tmp_path):
    """The trainer reads the shared-catalog prompt only: an isolated schema is refused (exit 2),
    not trained on another prompt than the one it will be labelled with."""
    import json

    from ..helpers import pcd

    schema = tmp_path / "s.yaml"
    schema.write_text("isolate_fields: true\nfields:\n  refund: {type: boolean}\n")
    gold = tmp_path / "gold.jsonl"
    gold.write_text("".join(json.dumps({"id": f"k{i}", "text": f"t {i}", "refund": i % 2 == 0}) + "\n" for i in range(8)))
    said = pcd("tune", gold, "-s", schema, "-o", tmp_path / "out", "--model", tmp_path / "no-model", code=2)
    assert "isolate_fields is not trained yet" in " ".join((said.stdout + said.stderr).split())
