"""Issue #28 item 5: what ``pcd label`` warns about in a schema when it loads it, ``pcd
inspect-schema`` reports too, in its text, ``--json`` and ``--strict`` output; rules that can
never hold are refused by both alike."""

from __future__ import annotations

import json

import pytest
import yaml

from pcd_cli.backends.torch_backend import load_tokenizer
from pcd_cli.inspect import WARNING_KINDS, inspect
from pcd_cli.schema.load import load_schema

from ..helpers import flat, pcd

#: A label the rules make impossible, three ways: two rules together, a count rule with an
#: if-rule, one rule on an integer field.
SCHEMAS = {
    "two rules together": ({"fields": {"sev": {"type": "enum", "labels": ["LOW", "MID", "HIGH"]},
                                       "outage": {"type": "boolean"}, "esc": {"type": "boolean"}},
                            "rules": [{"if": {"sev": "HIGH"}, "then": {"esc": True}},
                                      {"if": {"outage": True}, "then": {"sev": "HIGH"}},
                                      {"if": {"outage": True}, "not": {"esc": True}}]},
                           [("outage", ["true"], "rules[0], rules[1] and rules[2] together never allow outage = true; "
                                                 "pcd will never write it")]),
    "count rule": ({"fields": {"bug": {"type": "boolean"}, "question": {"type": "boolean"}},
                    "rules": [{"exactly_one": ["bug", "question"]}, {"if": {"bug": True}, "then": {"question": True}}]},
                   [("bug", ["true"], "rules[0] and rules[1] together never allow bug = true; pcd will never write it"),
                    ("question", ["false"], "rules[0] and rules[1] together never allow question = false; pcd will "
                                            "never write it")]),
    "integer field": ({"fields": {"stars": {"type": "integer", "minimum": 1, "maximum": 5},
                                  "angry": {"type": "boolean"}},
                       "rules": [{"if": {"angry": True}, "then": {"stars": [1, 2]}},
                                 {"if": {"angry": False}, "not": {"stars": [1]}},
                                 {"if": {"stars": [4, 5]}, "then": {"angry": True}}]},
                      [("stars", ["4", "5"], "rules[0], rules[1] and rules[2] together never allow stars = 4 | 5; "
                                             "pcd will never write them")]),
}


@pytest.fixture(scope="module")
def smol():
    return load_tokenizer(None)[1]


def _write(tmp_path, name, data):
    path = tmp_path / f"{name.replace(' ', '_')}.yaml"
    path.write_text(yaml.safe_dump({"name": "s", **data}, sort_keys=False))
    return path


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_each_label_warning_is_an_inspect_finding(tmp_path, smol, name):
    data, expected = SCHEMAS[name]
    schema = load_schema(_write(tmp_path, name, data))
    findings = [w for w in inspect(schema, tokenizer=smol).warnings if w.kind == "rule_never_allows"]
    assert [(w.field, list(w.labels), w.message) for w in findings] == expected
    assert [w.message for w in findings] == [m for m in schema.warnings if "never allow" in m]  # label's words


def test_label_text_json_and_strict_all_say_it(tmp_path):
    data, [(field, labels, message)] = SCHEMAS["two rules together"]
    path = _write(tmp_path, "two", data)
    (tmp_path / "empty.jsonl").write_text("")
    label = pcd("label", tmp_path / "empty.jsonl", "-s", path, "-o", tmp_path / "out.parquet")
    assert f"warning: {message}" in flat(label.stderr)
    text = pcd("inspect-schema", path, env={"COLUMNS": "250"})
    assert f"warning [rule_never_allows]: {message}" in text.stdout and text.stdout.rstrip().endswith("1 warning")
    strict = pcd("inspect-schema", path, "--json", "--strict", code=1)
    assert json.loads(strict.stdout)["warnings"] == [{"kind": "rule_never_allows", "field": field, "labels": labels,
                                                      "message": message}]
    assert "rule_never_allows" in WARNING_KINDS and "schema" in WARNING_KINDS


def test_other_load_warnings_are_schema_findings_and_none_is_said_twice(tmp_path, smol):
    described = {"type": "object", "properties": {
        "tone": {"oneOf": [{"const": "calm", "description": "no anger"}, {"const": "angry"}]},
        "car": {"enum": ["sedan", "Sedan", "SUV"]}}}
    (tmp_path / "s.json").write_text(json.dumps(described))
    schema = load_schema(tmp_path / "s.json")
    assert len(schema.warnings) == 2  # the oneOf label titles, the case-only labels
    found = {(w.kind, w.message) for w in inspect(schema, tokenizer=smol).warnings}
    assert ("schema", schema.warnings[0]) in found and schema.warnings[0].startswith("field 'tone': the titles")
    assert sum(k == "schema" for k, _ in found) == 1  # the case-only labels once, under their own kind
    assert sum(k == "case_only" for k, _ in found) == 1


def test_rules_that_never_hold_are_refused_by_both_with_the_same_message(tmp_path):
    data = {"fields": {"a": {"type": "boolean"}, "b": {"type": "boolean"}},
            "rules": [{"if": {"a": True}, "then": {"b": True}}, {"if": {"a": True}, "not": {"b": True}},
                      {"exactly_one": ["a", "b"]}, {"if": {"b": True}, "then": {"a": True}}]}
    path = _write(tmp_path, "never", data)
    (tmp_path / "empty.jsonl").write_text("")
    label = pcd("label", tmp_path / "empty.jsonl", "-s", path, "-o", tmp_path / "out.parquet", code=2)
    inspected = pcd("inspect-schema", path, "--json", code=2)
    assert "cannot hold together with" in flat(label.stderr)
    assert flat(label.stderr) == flat(inspected.stderr)
