"""Issue #17 item 5, "schema formats stay equal": every new field type and option (ordinal,
integer, nullable, none_label, multi with threshold/min_items/max_items) reads the same from
pcd's YAML and JSON, a JSON Schema and a Pydantic model (and the model's own
``model_json_schema()``); every bad option is refused up front naming the field; and
``pcd inspect-schema`` shows each declared field's type, with how an integer range tokenizes.
"""

from __future__ import annotations

import enum
import functools
import json
from typing import Annotated, Literal, Optional, Union

import pytest
import yaml
from pydantic import BaseModel, Field, conint, create_model
from pcd_cli.errors import SchemaError
from pcd_cli.schema.load import load_schema, parse_schema
from pcd_cli.schema.jsonschema import integer_bounds
from pcd_cli.schema.load import schema_from_model

from ..helpers import pcd

YAML = """\
name: Ticket
instructions: The input is a support ticket.
fields:
  product: {type: enum, labels: [APP, WEB], nullable: true, description: Product the ticket is about}
  topics:
    type: multi
    labels: [billing, outage, login]
    min_items: 1
    max_items: 2
    threshold: 0.4
    description: Topics the ticket raises
  severity: {type: ordinal, labels: [LOW, MEDIUM, HIGH], none_label: NOT_AN_ISSUE, description: How bad it is}
  stars: {type: integer, minimum: 1, maximum: 5, description: Stars given}
  urgency: {type: integer, minimum: 1, maximum: 5}
  score: {type: integer, minimum: 0, maximum: 10, nullable: true}
  refund: {type: boolean, nullable: true}
  kind: {type: enum, labels: [bug, question], none_label: OTHER}
  level: {type: ordinal, labels: [L1, L2], nullable: true}
  escalate: {type: boolean, depends_on: [severity]}
"""

#: The same schema as a hand-written JSON Schema, in other spellings than pydantic's.
JSON_SCHEMA = {
    "title": "Ticket", "description": "The input is a support ticket.", "type": "object",
    "$defs": {"Topic": {"type": "string", "enum": ["billing", "outage", "login"]}},
    "properties": {
        "product": {"type": ["string", "null"], "enum": ["APP", "WEB", None], "description": "Product the ticket is about"},
        "topics": {"type": "array", "items": {"$ref": "#/$defs/Topic"}, "uniqueItems": True, "minItems": 1,
                   "maxItems": 2, "x-pcd-threshold": 0.4, "description": "Topics the ticket raises"},
        "severity": {"enum": ["LOW", "MEDIUM", "HIGH"], "x-pcd-type": "ordinal", "x-pcd-none-label": "NOT_AN_ISSUE",
                     "description": "How bad it is"},
        "stars": {"type": "integer", "minimum": 1, "maximum": 5, "description": "Stars given"},
        "urgency": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 6},
        "score": {"oneOf": [{"type": "integer", "minimum": 0, "maximum": 10}, {"type": "null"}]},
        "refund": {"type": ["boolean", "null"]},
        "kind": {"anyOf": [{"const": "bug"}, {"const": "question"}, {"const": "OTHER"}], "x-pcd-none-label": "OTHER"},
        "level": {"anyOf": [{"const": "L1"}, {"const": "L2"}, {"type": "null"}], "x-pcd-type": "ordinal"},
        "escalate": {"type": "boolean", "depends_on": ["severity"]},
    }}


class Topic(str, enum.Enum):
    billing = "billing"
    outage = "outage"
    login = "login"


class Ticket(BaseModel):
    """The input is a support ticket."""
    product: Optional[Literal["APP", "WEB"]] = Field(None, description="Product the ticket is about")
    topics: set[Topic] = Field(description="Topics the ticket raises", min_length=1, max_length=2,
                               json_schema_extra={"x-pcd-threshold": 0.4})
    severity: Literal["LOW", "MEDIUM", "HIGH", "NOT_AN_ISSUE"] = Field(
        description="How bad it is", json_schema_extra={"x-pcd-type": "ordinal", "x-pcd-none-label": "NOT_AN_ISSUE"})
    stars: Annotated[int, Field(ge=1, le=5, description="Stars given")]
    urgency: conint(gt=0, lt=6)
    score: Optional[int] = Field(None, ge=0, le=10)
    refund: bool | None = None
    kind: Literal["bug", "question", "OTHER"] = Field(json_schema_extra={"x-pcd-none-label": "OTHER"})
    level: Literal["L1", "L2"] | None = Field(None, json_schema_extra={"x-pcd-type": "ordinal"})
    escalate: bool = Field(json_schema_extra={"depends_on": ["severity"]})


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def _seen(schema):
    return (schema.name, schema.instructions, schema.declared, schema.fields, schema.parts, schema.waves,
            schema.source_sha256)


def test_yaml_json_json_schema_and_pydantic_give_the_same_schema(tmp_path):
    data = yaml.safe_load(YAML)
    forms = {
        "yaml": load_schema(_write(tmp_path, "t.yaml", YAML)),
        "json": load_schema(_write(tmp_path, "t.json", json.dumps(data))),
        "json schema": load_schema(_write(tmp_path, "js.json", json.dumps(JSON_SCHEMA))),
        "json schema in yaml": load_schema(_write(tmp_path, "js.yaml", yaml.safe_dump(JSON_SCHEMA, sort_keys=False))),
        "pydantic": schema_from_model(Ticket),
        "pydantic's json schema": load_schema(_write(tmp_path, "m.json", json.dumps(Ticket.model_json_schema()))),
    }
    want = _seen(forms["yaml"])
    for form, schema in forms.items():
        assert _seen(schema) == want, form
    s = forms["yaml"]
    assert [(f.name, f.type, f.labels) for f in s.declared] == [
        ("product", "enum", ("APP", "WEB", "null")), ("topics", "multi", ("billing", "outage", "login")),
        ("severity", "ordinal", ("LOW", "MEDIUM", "HIGH", "NOT_AN_ISSUE")), ("stars", "integer", ("1", "2", "3", "4", "5")),
        ("urgency", "integer", ("1", "2", "3", "4", "5")), ("score", "integer", (*map(str, range(11)), "null")),
        ("refund", "boolean", ("true", "false", "null")), ("kind", "enum", ("bug", "question", "OTHER")),
        ("level", "ordinal", ("L1", "L2", "null")), ("escalate", "boolean", ("true", "false"))]
    topics = s.declared[1]
    assert (topics.threshold, topics.min_items, topics.max_items) == (0.4, 1, 2)
    assert [f.name for f in s.fields[1:4]] == ["topics.billing", "topics.outage", "topics.login"]
    assert [f.nullable for f in s.declared] == [True, False, False, False, False, True, True, False, True, False]
    assert (s.declared[2].none_label, s.declared[7].none_label) == ("NOT_AN_ISSUE", "OTHER")


def test_the_hash_tells_each_option_apart():
    base = yaml.safe_load(YAML)
    hashes = {parse_schema(base).source_sha256}
    for field, key, value in [("product", "nullable", False), ("topics", "threshold", 0.5), ("topics", "max_items", 3),
                              ("topics", "min_items", 0), ("severity", "none_label", "NONE"), ("severity", "type", "enum"),
                              ("stars", "maximum", 6)]:
        data = yaml.safe_load(YAML)
        data["fields"][field][key] = value
        hashes.add(parse_schema(data).source_sha256)
    assert len(hashes) == 8


@pytest.mark.parametrize("minimum, exclusive_minimum, maximum, exclusive_maximum, bounds", [
    (1, None, 5, None, (1, 5)),
    (None, 0, None, 6, (1, 5)),
    (0.5, None, 5.9, None, (1, 5)),
    (None, 0.5, None, 5.5, (1, 5)),
    (1, 1, 5, 5, (2, 4)),  # both given: the tighter one
    (1, True, 5, True, (2, 4)),  # draft-04: exclusiveMinimum/Maximum as booleans beside minimum/maximum
    (1, False, 5, False, (1, 5)),
    (-3, None, None, None, (-3, None)),
    (None, None, None, None, (None, None)),
])
def test_integer_bounds(minimum, exclusive_minimum, maximum, exclusive_maximum, bounds):
    assert integer_bounds(minimum, exclusive_minimum, maximum, exclusive_maximum) == bounds


# -- every bad option is refused up front, naming the field ------------------------------------

def _problem(data) -> str:
    with pytest.raises(SchemaError) as info:
        parse_schema(data)
    return str(info.value)


def _fields(**fields):
    return {"name": "t", "fields": fields}


TOO_MANY = "field 'n': 501 values from 0 to 500; an integer field may have at most 500"
NULLABLE_MULTI = "field 'm': 'nullable' applies to boolean, enum, ordinal and integer fields only, not to type multi"
NULL_LABEL = "field 'e': a nullable field cannot also have a label 'null'"


@pytest.mark.parametrize("spec, message", [
    ({"n": {"type": "integer", "minimum": 5, "maximum": 1}}, "field 'n': 'maximum' (1) must be above 'minimum' (5)"),
    ({"n": {"type": "integer", "minimum": 1}}, "field 'n': an integer needs whole-number 'minimum' and 'maximum' "
                                               "(got 1 and None)"),
    ({"n": {"type": "integer", "minimum": 1.5, "maximum": 3}}, "field 'n': an integer needs whole-number"),
    ({"n": {"type": "integer", "minimum": 1, "maximum": 3, "labels": ["1", "2"]}},
     "field 'n': an integer takes 'minimum' and 'maximum', not labels"),
    ({"n": {"type": "integer", "minimum": 0, "maximum": 500}}, TOO_MANY),
    ({"e": {"type": "enum", "labels": ["a", "b"], "minimum": 1}}, "field 'e': 'minimum' applies to integer fields only"),
    ({"m": {"type": "multi", "labels": ["a", "b"], "nullable": True}}, NULLABLE_MULTI),
    ({"e": {"type": "enum", "labels": ["a", "b"], "nullable": "yes"}}, "field 'e': 'nullable' must be true or false"),
    ({"e": {"type": "enum", "labels": ["a", "b"], "none_label": "a"}},
     "field 'e': none_label 'a' is already one of its labels"),
    ({"e": {"type": "enum", "labels": ["a", "b"], "none_label": ""}}, "field 'e': 'none_label' must be a non-empty"),
    ({"b": {"type": "boolean", "none_label": "x"}}, "field 'b': 'none_label' applies to enum and ordinal fields only"),
    ({"m": {"type": "multi", "labels": ["a", "b"], "threshold": 1.5}},
     "field 'm': 'threshold' must be a probability between 0 and 1 (exclusive), got 1.5"),
    ({"m": {"type": "multi", "labels": ["a", "b"], "threshold": 0}}, "field 'm': 'threshold' must be a probability"),
    ({"e": {"type": "enum", "labels": ["a", "b"], "threshold": 0.5}}, "field 'e': 'threshold' applies to multi"),
    ({"m": {"type": "multi", "labels": ["a", "b", "c"], "min_items": 2, "max_items": 1}},
     "field 'm': 'max_items' must be a whole number >= max(1, min_items), got 1"),
    ({"m": {"type": "multi", "labels": ["a", "b"], "min_items": 3}}, "field 'm': 2 options with min_items 3"),
    ({"m": {"type": "multi", "labels": ["a", "b"], "min_items": -1}}, "field 'm': 'min_items' must be a whole number"),
    ({"m": {"type": "multi"}}, "field 'm': a multi needs a non-empty list of 'labels' (its options)"),
    ({"e": {"type": "enum", "labels": ["null", "b"], "nullable": True}}, NULL_LABEL),
    ({"x": {"type": "float"}}, "field 'x': unknown type 'float'; expected one of boolean, enum, ordinal, integer, multi"),
])
def test_bad_options_name_the_field(spec, message):
    assert message in _problem(_fields(**spec))


def test_a_multi_value_that_is_not_a_list_in_an_example_names_the_field():
    data = _fields(topics={"type": "multi", "labels": ["billing", "outage"]}, n={"type": "integer", "minimum": 1,
                                                                                 "maximum": 3, "nullable": True})
    data["examples"] = [{"text": "Refund please", "labels": {"topics": "billing", "n": None}}]
    assert _problem(data) == ("examples[0]: field 'topics': a multi-select value must be a list of its options, "
                              "got 'billing'")
    data["examples"] = [{"text": "Refund please", "labels": {"topics": ["refund"], "n": 2}}]
    assert _problem(data) == "examples[0]: field 'topics': 'refund' is not one of its options (billing | outage)"
    data["examples"] = [{"text": "Refund please", "labels": {"topics": ["billing"], "n": 4}}]
    assert _problem(data) == "examples[0]: field 'n': 4 is not one of its labels (1..null)"
    data["examples"] = [{"text": "Refund please", "labels": {"topics": [], "n": None}}]
    assert parse_schema(data).examples[0].labels == (1, 1, 3)  # no option: both false; n: its null option


def _json_problem(prop) -> str:
    return _problem({"type": "object", "properties": {"x": prop}})


KINDS = ("pcd fields are boolean, enum (ordinal with x-pcd-type), integer with minimum and maximum, or an array of "
         "enum items (multi-select)")
MULTI = "a multi-select is an array whose items are an enum of strings (list[Literal[...]], set[MyEnum])"
BOUNDS = ("is not supported; pcd reads an integer as one of its values: give minimum (or exclusiveMinimum) and maximum "
          "(or exclusiveMaximum), at most 500 values")


@pytest.mark.parametrize("prop, message", [
    ({"type": "integer", "minimum": 1}, f"field 'x': type 'integer' without both bounds (no upper bound) {BOUNDS}"),
    ({"type": "integer", "exclusiveMaximum": 9}, f"field 'x': type 'integer' without both bounds (no lower bound) {BOUNDS}"),
    ({"type": ["integer", "null"]}, f"field 'x': type 'integer' without both bounds (no lower or upper bound) {BOUNDS}"),
    ({"type": "integer", "minimum": "1", "maximum": 5}, "field 'x': 'minimum' of an integer must be a number, got '1'"),
    ({"type": "integer", "minimum": 0, "maximum": 10, "multipleOf": 5},
     "field 'x': multipleOf on an integer is not supported; pcd reads every whole number from minimum to maximum: "
     "drop multipleOf, or list the values with enum"),
    ({"type": "integer", "minimum": 0, "maximum": 1000}, "field 'x': 1001 values from 0 to 1000; an integer field may "
                                                        "have at most 500"),
    ({"type": "number", "minimum": 0, "maximum": 1}, "field 'x': type 'number' (a decimal number) is not supported; "
                                                     "use type 'integer' with minimum and maximum, or list the values "
                                                     "with enum"),
    ({"anyOf": [{"type": "string"}, {"type": "null"}]}, f"field 'x': type 'string' without enum (free text) is not "
                                                        f"supported; {KINDS}: list the labels with enum"),
    ({"type": "array", "items": {"type": "string"}}, f"field 'x': type 'array' of free text is not supported; {MULTI}"),
    ({"type": "array", "items": {"type": "object"}}, f"field 'x': type 'array' of nested objects is not supported; "
                                                     f"{MULTI}"),
    ({"type": "array"}, f"field 'x': type 'array' with no items schema (a list of anything) is not supported; {MULTI}"),
    ({"type": "array", "items": {"enum": ["a", "b", None]}},
     f"field 'x': type 'array' of items that may be null is not supported; {MULTI}"),
    ({"type": ["array", "null"], "items": {"enum": ["a", "b"]}}, NULLABLE_MULTI.replace("'m'", "'x'")),
    ({"type": "object", "properties": {"y": {"type": "boolean"}}},
     f"field 'x': type 'object' (a nested object) is not supported; {KINDS}"),
    ({"anyOf": [{"type": "null"}]}, "field 'x': anyOf of null parts only (always no value) is not a decision"),
    ({"enum": ["a", "b"], "x-pcd-type": "scale"}, "field 'x': x-pcd-type 'scale' is not supported; the one value is "
                                                  "'ordinal' (on an enum)"),
    ({"type": "boolean", "x-pcd-type": "ordinal"}, "field 'x': x-pcd-type 'ordinal' applies to an enum (its labels in "
                                                   "order, lowest first), not to a boolean"),
    ({"type": "array", "items": {"enum": ["a", "b"]}, "x-pcd-threshold": 2},
     "field 'x': 'threshold' must be a probability between 0 and 1 (exclusive), got 2"),
    ({"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 2, "maxItems": 1},
     "field 'x': 'max_items' must be a whole number >= max(1, min_items), got 1"),
    ({"type": "boolean", "x-pcd-none-label": "n/a"}, "field 'x': 'none_label' applies to enum and ordinal fields only"),
    ({"enum": ["null", "b", None]}, NULL_LABEL.replace("'e'", "'x'")),
])
def test_json_schema_refusals_name_the_field_and_the_construct(prop, message):
    assert message in _json_problem(prop)


USE = ("use bool, Literal['a', 'b', ...] or a str Enum, int with Field(ge=..., le=...), list[Literal[...]] / "
       "set[MyEnum] (multi-select), or Optional[...] of one of them")


@pytest.mark.parametrize("annotation, message", [
    ((int, ...), "field 'x' of M: type int without both bounds is not supported; pcd reads an integer as one of its "
                 "values: give Field(ge=..., le=...) (or gt/lt, conint), at most 500 values"),
    ((conint(ge=0), ...), "field 'x' of M: type int without both bounds"),
    ((Annotated[int, Field(ge=0, le=600)], ...), "field 'x': 601 values from 0 to 600"),
    ((Annotated[int, Field(ge=0, le=10, multiple_of=5)], ...), "field 'x' of M: multiple_of on an int is not supported"),
    ((float, ...), f"field 'x' of M: type float is not supported; {USE}"),
    ((str, ...), f"field 'x' of M: type str is not supported; {USE}"),
    ((Union[int, str], ...), f"field 'x' of M: type Union[int, str] (a union of types) is not supported; {USE}"),
    ((Optional[Union[bool, str]], None), "field 'x' of M: type Optional[bool | str] (a union of types) is not supported"),
    ((list[str], ...), "field 'x' of M: type list[str] is not supported; a multi-select is list[Literal['a', 'b', ...]] "
                       "or set[MyEnum] (a str Enum)"),
    ((list[Optional[Literal["a", "b"]]], ...), "field 'x' of M: type list[Optional[Literal['a', 'b']]] is not "
                                               "supported"),
    ((Optional[list[Literal["a", "b"]]], None), NULLABLE_MULTI.replace("'m'", "'x'")),
    ((list[Literal["a", "b"]], Field(min_length=2, max_length=1)), "field 'x': 'max_items' must be a whole number"),
    ((set[Literal["a", "b"]], Field(json_schema_extra={"x-pcd-threshold": 1.0})), "field 'x': 'threshold' must be"),
    ((Optional[Literal["null", "b"]], None), NULL_LABEL.replace("'e'", "'x'")),
    ((Literal["a", "b"], Field(json_schema_extra={"x-pcd-type": "scale"})), "field 'x' of M: x-pcd-type 'scale'"),
    ((bool, Field(json_schema_extra={"x-pcd-type": "ordinal"})), "field 'x' of M: x-pcd-type 'ordinal' applies to an "
                                                                  "enum"),
])
def test_pydantic_refusals_name_the_field_and_the_type(annotation, message):
    with pytest.raises(SchemaError) as info:
        schema_from_model(create_model("M", x=annotation))
    assert message in str(info.value)


def test_frozenset_of_an_enum_and_literal_unions_read_as_their_json_schema(tmp_path):
    M = create_model("M", tags=(frozenset[Topic], ...), mood=(Union[Literal["calm"], Literal["angry"], None], None),
                     n=(Optional[conint(ge=-2, le=2)], None))
    schema = schema_from_model(M)
    assert schema == load_schema(_write(tmp_path, "m.json", json.dumps(M.model_json_schema())))
    assert [(f.name, f.type, f.labels) for f in schema.declared] == [
        ("tags", "multi", ("billing", "outage", "login")), ("mood", "enum", ("calm", "angry", "null")),
        ("n", "integer", ("-2", "-1", "0", "1", "2", "null"))]


# -- pcd inspect-schema shows the declared types -----------------------------------------------

@pytest.fixture
def load_once(monkeypatch):
    """The embedded tokenizer and config, read from the GGUF file once for both runs below."""
    from pcd_cli.backends import torch_backend

    for name in ("load_tokenizer", "load_config"):
        monkeypatch.setattr(torch_backend, name, functools.cache(getattr(torch_backend, name)))


def test_inspect_schema_json_and_table_show_every_type(tmp_path, load_once):
    data = yaml.safe_load(YAML)
    data["fields"]["score"] = {"type": "integer", "minimum": 1, "maximum": 100, "description": "Score, 1 to 100"}
    data["fields"] = {"topics": data["fields"].pop("topics"), **data["fields"]}  # a multi field first
    path = _write(tmp_path, "t.json", json.dumps(data))
    result = pcd("inspect-schema", str(path), "--json", code=None)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    declared = {d["name"]: d for d in report["declared"]}
    assert list(declared) == list(data["fields"])
    assert declared["topics"] == {
        "name": "topics", "type": "multi", "labels": ["billing", "outage", "login"], "nullable": False,
        "none_label": None, "minimum": None, "maximum": None, "threshold": 0.4, "min_items": 1, "max_items": 2,
        "decisions": ["topics.billing", "topics.outage", "topics.login"], "numbers": None}
    assert (declared["product"]["nullable"], declared["product"]["labels"]) == (True, ["APP", "WEB", "null"])
    assert (declared["severity"]["type"], declared["severity"]["none_label"]) == ("ordinal", "NOT_AN_ISSUE")
    assert (declared["stars"]["minimum"], declared["stars"]["maximum"]) == (1, 5)
    score = declared["score"]
    assert (score["type"], score["minimum"], score["maximum"], score["decisions"]) == ("integer", 1, 100, ["score"])
    numbers = score["numbers"]  # the embedded SmolLM2 tokenizer writes one digit per token
    assert numbers == {"values": 100, "digit_tokens": [1, 3], "first_tokens": 9, "colliding": 100,
                       "line_end": 10, "depth": numbers["depth"], "exact": True}
    assert numbers["depth"] >= 4  # ' ', '1', '0', '0' before the line end tells 100 from 10
    assert report["layout"]["newline"]["family"] == "glued_after"  # probed on the multi field's whole line
    fields = {f["name"]: f for f in report["fields"]}  # the decisions, each with its token paths
    assert fields["topics.login"]["type"] == "boolean" and fields["severity"]["type"] == "ordinal"
    score_paths = {lab["label"]: lab["spellings"][0] for lab in fields["score"]["labels"]}
    assert score_paths["1"]["spelling"] == "1" and score_paths["100"]["pieces"][:4] == [" ", "1", "0", "0"]
    ten = score_paths["10"]  # a prefix of 100: told apart by the token after its digits, the line end
    assert ten["pieces"][:3] == [" ", "1", "0"] and ten["identified_at"] == 4 and ten["pieces"][3] == ","

    table = pcd("inspect-schema", str(path), code=None, env={"COLUMNS": "200"})
    assert table.exit_code == 0, table.output
    out = table.stdout
    words = " ".join(out.split())  # the long lines as words (rich wraps them)
    assert "declared fields" in out and "LOW < MEDIUM < HIGH; none_label NOT_AN_ISSUE" in out
    assert "billing, outage, login; an option is chosen at P(yes) >= 0.4, at least 1, at most 2" in out
    assert "APP, WEB; or null" in out and "1..100 (100 values)" in out
    assert ("score: 100 values 1..100, 1 to 3 digit tokens each; 100 share their first digit token with another "
            "(9 distinct first tokens); 10 are a prefix of another value, told apart by the token after their digits; "
            f"trie depth {numbers['depth']} tokens; exact: every value has its own token path to the end of its line "
            "and is read until it is identified") in words
    assert " topics.billing option " in out  # a multi field's decisions, one per option


def test_the_shipped_ticket_routing_schema_uses_every_new_kind():
    schema = load_schema("schemas/ticket_routing.yaml")
    kinds = {f.name: (f.type, f.nullable, f.none_label) for f in schema.declared}
    assert kinds["topics"] == ("multi", False, None) and kinds["product"] == ("enum", True, None)
    assert kinds["severity"] == ("ordinal", False, "NOT_AN_ISSUE") and kinds["urgency"] == ("integer", False, None)
    assert len(schema.rules) == 3 and schema.warnings == ()
    assert schema.waves[0] == schema.parts[0]  # the multi field first: its options are wave 0, together
