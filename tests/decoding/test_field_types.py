"""Multi-select, nullable, ordinal and integer fields (issue #17): the decoder against the
brute-force oracle, the answer layout they are read in, and the output columns they write.

Every new type is read in the same passes as the fields it sits beside: a multi field is one
boolean decision per option, read as the first key of the field's nested object; an integer
field is a trie over its values' unquoted and quoted spellings; a nullable field's null
option is the unquoted ``null``.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from pcd_cli.decoding.compile import CompiledSchema
from pcd_cli.decoding.decode import Decoder
from pcd_cli.results import FieldResult, Record
from pcd_cli.errors import SchemaError
from pcd_cli.io.output import chosen_options, expected_value
from pcd_cli.decoding.prompt import answer_object, catalog_line
from pcd_cli.schema.load import parse_schema

from ..helpers import TEXTS, pcd, tiny_backend
from ..oracle_sample import max_oracle_diff

TOL = 1e-4

TYPES_SCHEMA = {
    "name": "types",
    "fields": {
        "product": {"type": "enum", "labels": ["APP", "WEB"], "nullable": True, "description": "Product named"},
        "topics": {"type": "multi", "labels": ["billing", "outage", "login"], "max_items": 2,
                   "description": "Topics the message raises"},
        "severity": {"type": "ordinal", "labels": ["LOW", "MEDIUM", "HIGH"], "description": "How bad it is"},
        "stars": {"type": "integer", "minimum": 1, "maximum": 12, "description": "Stars, 1 to 12"},
        "kind": {"type": "enum", "labels": ["bug", "question"], "none_label": "OTHER", "depends_on": ["topics"]},
    },
}


@pytest.fixture(scope="module")
def types_schema():
    return parse_schema(TYPES_SCHEMA)


def test_a_multi_field_is_one_boolean_decision_per_option_in_the_same_wave(types_schema):
    s = types_schema
    assert [f.name for f in s.declared] == ["product", "topics", "severity", "stars", "kind"]
    assert [f.name for f in s.fields] == ["product", "topics.billing", "topics.outage", "topics.login",
                                          "severity", "stars", "kind"]
    assert s.parts == ((0,), (1, 2, 3), (4,), (5,), (6,))
    assert s.waves == ((0,), (1, 2, 3, 4, 5), (6,))  # kind depends on topics: every option before it
    assert s.fields[0].labels == ("APP", "WEB", "null") and s.fields[0].spellings(2) == ("null",)
    assert s.fields[5].labels == tuple(str(v) for v in range(1, 13)) and s.fields[5].spellings(6) == ("7", '"7"')
    assert s.fields[6].labels == ("bug", "question", "OTHER")
    assert [s.fields[5].value(0), s.fields[0].value(2), s.fields[4].value(1)] == [1, None, "MEDIUM"]


def test_catalog_and_answer_lay_out_each_type(types_schema):
    s = types_schema
    assert catalog_line(s.declared[1]) == ('- "topics": Topics the message raises. Allowed: an object with true or '
                                           'false for each of "billing", "outage", "login"')
    assert catalog_line(s.declared[0]).endswith('Allowed: "APP" | "WEB" | null')
    assert catalog_line(s.declared[2]).endswith('Allowed, lowest to highest: "LOW" | "MEDIUM" | "HIGH"')
    assert catalog_line(s.declared[3]).endswith("Allowed: an integer from 1 to 12")
    compiled = CompiledSchema(s, tiny_backend().tokenizer)
    layout = compiled.layout
    answer = answer_object(s, layout, (2, 0, 1, 0, 2, 11, 2))
    assert json.loads(answer) == {"product": None, "topics": {"billing": True, "outage": False, "login": True},
                                  "severity": "HIGH", "stars": 12, "kind": "OTHER"}
    # each option is read as the first key of the nested object, the others follow when written
    assert layout.line(s.fields[2], "true", last=False).strip() == '"topics": {"outage": true,'


@pytest.mark.parametrize("scoring", ["marginal", "exact"])
@pytest.mark.parametrize("chat", [True, False])
def test_decoder_matches_oracle_on_every_type(types_schema, scoring, chat):
    backend = tiny_backend(chat_template=chat)
    compiled = CompiledSchema(types_schema, backend.tokenizer, scoring=scoring, logits_width=backend.logits_width)
    decoder = Decoder(backend, compiled, trace=True)
    results = decoder.decode([Record(i, t) for i, t in enumerate(TEXTS)])
    worst, checked = max_oracle_diff(backend, types_schema, results, scoring, sample=False)
    assert checked == len(types_schema.fields) * len(TEXTS)
    assert worst < TOL
    # one pass per wave for all records and fields: the three options add none
    assert decoder.record_passes == len(types_schema.waves)
    kind = next(t for t in results[0].traces if t["field"] == "kind")
    topics = {o: results[0].fields[1 + i].label == 0 for i, o in enumerate(["billing", "outage", "login"])}
    written = '"topics": {' + ", ".join(f'"{o}": {str(v).lower()}' for o, v in topics.items()) + "},"
    assert written in kind["context"]  # the later wave sees the multi field written whole, as JSON


@pytest.mark.parametrize("scoring, pack", [("marginal", True), pytest.param("exact", False, marks=pytest.mark.full)])
def test_embedded_decoder_matches_oracle_on_a_sample_of_every_type(embedded_backend, types_schema, scoring, pack):
    compiled = CompiledSchema(types_schema, embedded_backend.tokenizer, scoring=scoring,
                              logits_width=embedded_backend.logits_width)
    decoder = Decoder(embedded_backend, compiled, trace=True, pack_records=pack)
    results = decoder.decode([Record(i, t) for i, t in enumerate(TEXTS)])
    worst, checked = max_oracle_diff(embedded_backend, types_schema, results, scoring, sample=True)
    assert checked == len(types_schema.fields) and worst < TOL


def test_chosen_options_follow_threshold_min_and_max_items():
    f = parse_schema({"fields": {"t": {"type": "multi", "labels": list("abcd"), "min_items": 1, "max_items": 2,
                                       "threshold": 0.6}}}).declared[0]
    assert chosen_options(f, [0.1, 0.2, 0.3, 0.05]) == [2]  # none passes: the most probable one
    assert chosen_options(f, [0.9, 0.7, 0.95, 0.61]) == [0, 2]  # four pass: the two most probable, in order
    assert chosen_options(f, [0.65, 0.1, 0.2, 0.3]) == [0]


def test_expected_value_leaves_out_null_and_none_label():
    s = parse_schema({"fields": {"sev": {"type": "ordinal", "labels": ["L", "M", "H"], "none_label": "NA",
                                         "nullable": True},
                                 "n": {"type": "integer", "minimum": 3, "maximum": 5}}})
    sev, n = s.fields
    assert sev.labels == ("L", "M", "H", "NA", "null")
    assert expected_value(sev, [0.2, 0.2, 0.4, 0.1, 0.1]) == pytest.approx((0.2 + 0.8) / 0.8)
    assert expected_value(n, [0.5, 0.25, 0.25]) == pytest.approx(3 * 0.5 + 4 * 0.25 + 5 * 0.25)
    assert expected_value(sev, [0, 0, 0, 0.5, 0.5]) is None


@pytest.mark.parametrize("spec, message", [
    ({"type": "integer", "minimum": 1}, "whole-number 'minimum' and 'maximum'"),
    ({"type": "integer", "minimum": 0, "maximum": 1000}, "at most 500"),
    ({"type": "multi", "labels": ["a", "b"], "nullable": True}, "'nullable' applies to"),
    ({"type": "enum", "labels": ["a", "b"], "none_label": "a"}, "already one of its labels"),
    ({"type": "enum", "labels": ["a", "null"], "nullable": True}, "cannot also have a label 'null'"),
    ({"type": "multi", "labels": ["a", "b"], "threshold": 1.5}, "'threshold' must be a probability"),
    ({"type": "multi", "labels": ["a", "b"], "min_items": 2, "max_items": 1}, "'max_items' must be"),
    ({"type": "boolean", "minimum": 1}, "'minimum' applies to integer fields only"),
])
def test_bad_type_options_name_the_field(spec, message):
    with pytest.raises(SchemaError, match="field 'x'") as err:
        parse_schema({"fields": {"x": spec}})
    assert message in str(err.value)


def test_examples_answer_a_multi_field_with_a_list(types_schema):
    data = dict(TYPES_SCHEMA, examples=[{"text": "App down, charged twice", "labels": {
        "product": None, "topics": ["outage", "billing"], "severity": "HIGH", "stars": 1, "kind": "bug"}}])
    s = parse_schema(data)
    assert s.examples[0].labels == (2, 0, 0, 1, 2, 0, 0)
    bad = dict(TYPES_SCHEMA, examples=[{"text": "x", "labels": dict(data["examples"][0]["labels"], topics="outage")}])
    with pytest.raises(SchemaError, match="a multi-select value must be a list of its options"):
        parse_schema(bad)


def test_pcd_label_writes_every_column_type(tmp_path, types_schema):
    schema_path = tmp_path / "types.json"
    schema_path.write_text(json.dumps(TYPES_SCHEMA))
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"id": f"r{i}", "text": t}) + "\n" for i, t in enumerate(TEXTS)))
    out = tmp_path / "out.parquet"
    pcd("label", data, "-s", schema_path, "-o", out, "--all-probs")
    table = pq.read_table(out)
    types = {f.name: str(f.type) for f in table.schema}
    assert types["topics"].startswith("list<") and types["topics"].endswith(": string>")
    assert types["stars"] == "int64" and types["product"] == "string"
    assert types["topics__probs"].startswith("map<string, float") and types["stars__expected"] == "float"
    meta = {k.decode(): v.decode() for k, v in table.schema.metadata.items()}
    assert json.loads(meta["pcd.schema_json"])["topics"] == ["billing", "outage", "login"]
    assert json.loads(meta["pcd.field_types"])["stars"] == {"type": "integer"}
    df = pd.read_parquet(out)
    multi = types_schema.declared[1]
    for _, row in df.iterrows():
        p_yes = dict(row["topics__probs"])
        chosen = [multi.labels[i] for i in chosen_options(multi, [p_yes[o] for o in multi.labels])]
        assert list(row["topics"]) == chosen and len(chosen) <= 2
        assert row["topics__prob"] == pytest.approx(np.prod([p_yes[o] if o in chosen else 1 - p_yes[o]
                                                             for o in multi.labels]), rel=1e-5)
        stars = dict(row["stars__probs"])
        assert row["stars__expected"] == pytest.approx(sum(int(k) * p for k, p in stars.items()), rel=1e-4)
        assert row["stars"] == int(max(stars, key=stars.get))
        product = dict(row["product__probs"])
        assert (row["product"] is None) == (max(product, key=product.get) == "null")
        assert row["kind"] in ("bug", "question", "OTHER")


def test_the_run_summary_counts_each_multi_option_with_its_own_mass(tmp_path, types_schema, monkeypatch):
    """A decoded row's options are counted from its RecordResult (each option's own mass); a
    copied row's (here a repeated text, deduplicated) from its output row, which holds only the
    field's mass (the smallest of its options'). Labels: as written (in the list or not)."""
    from collections import Counter

    from pcd_cli.api import Labeler
    from pcd_cli.engines.local import label_file
    from pcd_cli.io.readers import InputSpec

    labeler = Labeler(types_schema, backend=tiny_backend())
    decoded, inner = [], labeler.label_batch
    monkeypatch.setattr(labeler, "label_batch", lambda batch: decoded.extend(out := inner(batch)) or out)
    data = tmp_path / "in.jsonl"
    texts = TEXTS + [TEXTS[0]]  # the last row repeats the first: deduplicated, not decoded
    data.write_text("".join(json.dumps({"id": f"r{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    out = tmp_path / "out.parquet"
    stats = label_file(labeler, data, InputSpec(id_field="id"), output=out, errors_path=tmp_path / "e.jsonl",
                       progress=False)
    assert (stats.records, stats.deduplicated, [r.id for r in decoded]) == (4, 1, ["r0", "r1", "r2"])
    rows = pq.read_table(out).to_pylist()
    multi, part = types_schema.declared[1], types_schema.parts[1]
    assert all(len({r.fields[i].mass for i in part}) == len(part) for r in decoded)  # the options' masses differ
    summary = stats.to_dict()["fields"]
    for k, i in enumerate(part):
        option = types_schema.fields[i]
        masses = [r.fields[i].mass for r in decoded] + [rows[3]["topics__mass"]]
        assert summary[option.name]["mean_mass"] == pytest.approx(sum(masses) / 4, rel=1e-6)
        written = [multi.labels[k] in row["topics"] for row in rows]
        assert summary[option.name]["labels"] == dict(Counter(option.labels[0 if yes else 1] for yes in written))
        p_yes = [dict(row["topics__probs"])[multi.labels[k]] for row in rows]
        assert summary[option.name]["mean_prob"] == pytest.approx(
            sum(p if yes else 1 - p for p, yes in zip(p_yes, written)) / 4, rel=1e-5)


def test_label_frame_matches_the_cli_columns(types_schema):
    from pcd_cli.api import Labeler

    labeler = Labeler(types_schema, backend=tiny_backend())
    frame = labeler.label_frame(pd.DataFrame({"text": TEXTS[:2]}))
    assert list(frame.columns[:7]) == ["row", "product", "product__prob", "product__mass", "product__probs",
                                       "product__steered", "topics"]  # the steering check is on by default
    assert all(isinstance(v, (list, np.ndarray)) for v in frame["topics"])
    assert frame["stars"].dtype == "int64"


def test_field_result_of_an_option_is_its_p_yes():
    res = FieldResult(label=0, value=True, prob=0.8, mass=0.5, probs=(0.8, 0.2))
    f = parse_schema({"fields": {"t": {"type": "multi", "labels": ["a", "b"]}}}).declared[0]
    assert chosen_options(f, [res.probs[0], 0.3]) == [0]
