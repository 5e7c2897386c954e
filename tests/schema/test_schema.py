"""Schema validation: every bad schema is refused naming the field and the problem."""

from __future__ import annotations

import enum
import json
from pathlib import Path
from typing import Annotated, Literal, Optional

import pytest
from pydantic import BaseModel, Field

from pcd_cli.errors import SchemaError
from pcd_cli.decoding.prompt import LAYOUTS, catalog_line
from pcd_cli.schema.load import load_schema, parse_schema
from pcd_cli.schema.load import schema_from_model

from ..helpers import pcd


def _schema(**fields):
    return {"name": "t", "fields": fields}


@pytest.mark.parametrize("data, message", [
    ({"name": "t"}, "no fields"),
    ({"name": "t", "fields": {}}, "no fields"),
    (_schema(a={"type": "string"}), "field 'a': unknown type 'string'"),
    (_schema(a={"type": "enum", "labels": []}), "field 'a': an enum needs a non-empty list"),
    (_schema(a={"type": "enum", "labels": ["X", "X"]}), "field 'a': duplicate label 'X'"),
    (_schema(a={"type": "enum", "labels": [1, 2]}), "field 'a': label #1 is 1 (int), not a string"),
    (_schema(a={"type": "enum", "labels": ["yes", True]}), "field 'a': label #2 is True (bool)"),
    (_schema(a={"type": "enum", "labels": ["", "B"]}), "field 'a': label #1 is empty"),
    (_schema(a={"type": "enum", "labels": ["only"]}), "field 'a': an enum needs at least two labels"),
    (_schema(a={"type": "boolean", "labels": ["y", "n"]}), "field 'a': a boolean takes no labels"),
    (_schema(a={"type": "boolean"}, a__prob={"type": "boolean"}), "field 'a__prob': clashes with the output column"),
    (_schema(a={"type": "boolean"}, b={"type": "boolean", "depends_on": ["zz"]}), "unknown field 'zz'"),
    (_schema(a={"type": "boolean"}, b={"type": "boolean", "depends_on": ["c"]},
             c={"type": "boolean", "depends_on": ["b"]}), "cycle"),
    ({"name": "t", "fields": [{"type": "boolean"}]}, "fields[0]: a list item needs a 'name'"),
])
def test_bad_schemas_are_refused_naming_field_and_problem(data, message):
    with pytest.raises(SchemaError) as info:
        parse_schema(data)
    assert message in str(info.value)


def test_id_column_clash_is_refused():
    schema = parse_schema(_schema(id={"type": "boolean"}))
    with pytest.raises(SchemaError, match="field 'id': clashes with the id column 'id'"):
        schema.check_output_columns("id")
    schema.check_output_columns("row")


def test_case_only_differences_warn_and_keep_case():
    schema = parse_schema(_schema(car={"type": "enum", "labels": ["sedan", "SUV", "suv", "Truck"]}))
    assert schema.fields[0].labels == ("sedan", "SUV", "suv", "Truck")
    assert schema.warnings == ("field 'car': labels 'SUV' and 'suv' differ only by case",)


def test_waves_first_field_alone_then_depends_on_levels():
    schema = parse_schema(_schema(a={"type": "boolean"}, b={"type": "boolean"},
                                  c={"type": "boolean", "depends_on": ["b"]}, d={"type": "boolean"}))
    assert schema.waves == ((0,), (1, 3), (2,))
    with pytest.raises(SchemaError, match="first field"):
        parse_schema(_schema(a={"type": "boolean", "depends_on": ["b"]}, b={"type": "boolean"}))


@pytest.mark.parametrize("name, n_fields", [("support_triage", 28), ("fintech_fraud", 28), ("code_security", 28),
                                            ("customs_255", 4), ("sms_spam", 1), ("airline_sentiment", 1)])
def test_shipped_schemas_load(name, n_fields):
    schema = load_schema(f"schemas/{name}.yaml")
    assert len(schema.fields) == n_fields
    assert schema.waves[0] == (0,)
    if name == "customs_255":
        assert len(schema.fields[0].labels) == 255
        assert schema.fields[0].labels[1] == "CAT_001_Meat_&_Edible_Offal"


def test_json_schema_and_preset_formats(tmp_path):
    js = {"title": "x", "type": "object", "properties": {
        "spam": {"type": "boolean", "description": "is it spam"},
        "lang": {"type": "string", "enum": ["en", "fr"]}}}
    path = tmp_path / "s.json"
    path.write_text(json.dumps(js))
    schema = load_schema(path)
    assert [(f.name, f.type, f.labels) for f in schema.fields] == [("spam", "boolean", ("true", "false")),
                                                                    ("lang", "enum", ("en", "fr"))]
    preset = parse_schema({"id": "fraud", "schema": {
        "risk_tier": {"type": "enum", "description": "tier", "choices": ["LOW", "HIGH"]},
        "is_fraud": {"type": "boolean", "description": "fraud?"}}})
    assert preset.name == "fraud"
    assert [(f.name, f.labels) for f in preset.fields] == [("risk_tier", ("LOW", "HIGH")),
                                                           ("is_fraud", ("true", "false"))]


def test_unreadable_yaml_is_a_schema_error(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("fields: [unclosed")
    with pytest.raises(SchemaError, match="not valid YAML"):
        load_schema(path)


@pytest.mark.parametrize("label, spelled", [
    ('say "hi"', '"say \\"hi\\""'),
    ("back\\slash", '"back\\\\slash"'),
    ("http://example.com/path", '"http://example.com/path"'),
    ("R&D team", '"R&D team"'),
    ("在线", '"在线"'),
    ("🙏", '"🙏"'),
])
def test_labels_are_json_escaped_minimally_and_round_trip(label, spelled):
    schema = parse_schema(_schema(x={"type": "enum", "labels": [label, "other"]}))
    field = schema.fields[0]
    assert field.spellings(0) == (spelled,)
    assert json.loads(spelled) == label
    assert field.value(0) == label
    for layout in LAYOUTS:
        line = layout.line(field, spelled, last=False)
        assert json.loads("{" + line.strip().rstrip(",") + "}") == {"x": label}
    assert spelled in catalog_line(field)


def test_boolean_has_quoted_and_bare_spellings():
    field = parse_schema(_schema(b={"type": "boolean"})).fields[0]
    assert field.spellings(0) == ("true", '"true"')
    assert field.spellings(1) == ("false", '"false"')
    assert field.value(0) is True and field.value(1) is False


# -- JSON Schema as tools write it (issue #20 item 4) ------------------------------------------

def _load_json(tmp_path, data, name="s.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return load_schema(path)


def _json_problem(tmp_path, prop, defs=None):
    """The message for a JSON Schema with the one property ``x``."""
    data = {"type": "object", "properties": {"x": prop}}
    if defs:
        data["$defs"] = defs
    with pytest.raises(SchemaError) as info:
        _load_json(tmp_path, data)
    return str(info.value)


class Colour(str, enum.Enum):
    """The main colour of the product"""
    red = "red"
    green = "green"


class Size(str, enum.Enum):
    small = "small"
    large = "large"


class Product(BaseModel):
    """The input is a product listing."""
    colour: Colour
    size: Size = Field(description="How big it is")
    fragile: bool = Field(description="Breaks easily")
    channel: Literal["web", "store"]
    grade: Literal["A", "B", "C"] = Field(description="Quality grade", title="Grade given")


def test_a_pydantic_json_schema_gives_the_same_schema_as_the_model(tmp_path):
    schema = _load_json(tmp_path, Product.model_json_schema())
    assert schema == schema_from_model(Product)  # fields, descriptions, name, instructions, hash
    assert [(f.name, f.type, f.labels, f.description) for f in schema.fields] == [
        ("colour", "enum", ("red", "green"), "The main colour of the product"),  # the $defs target's description
        ("size", "enum", ("small", "large"), "How big it is"),  # the property's, over the target's title
        ("fragile", "boolean", ("true", "false"), "Breaks easily"),
        ("channel", "enum", ("web", "store"), ""),  # pydantic's title 'Channel' only re-spells the name
        ("grade", "enum", ("A", "B", "C"), "Quality grade")]
    assert (schema.name, schema.instructions) == ("Product", "The input is a product listing.")


class TypedProduct(BaseModel):
    """Every field type and option beyond bool and enum (issue #17)."""
    colour: Optional[Colour] = None
    tags: set[Literal["eco", "sale", "new"]] = Field(description="Tags", min_length=1, max_length=2,
                                                     json_schema_extra={"x-pcd-threshold": 0.4})
    sizes: list[Size]
    grade: Literal["A", "B", "C", "UNGRADED"] = Field(json_schema_extra={"x-pcd-type": "ordinal",
                                                                         "x-pcd-none-label": "UNGRADED"})
    stars: Annotated[int, Field(ge=1, le=5)]
    rank: int = Field(gt=0, lt=11, description="Rank in its shelf")
    score: Optional[Annotated[int, Field(ge=0, le=3)]] = None
    fragile: bool | None = Field(default=None, json_schema_extra={"depends_on": ["colour"]})


def test_a_typed_model_and_its_json_schema_give_the_same_schema(tmp_path):
    schema = _load_json(tmp_path, TypedProduct.model_json_schema())
    assert schema == schema_from_model(TypedProduct)  # declared fields, decisions, hash
    assert [(f.name, f.type, f.labels, f.nullable, f.none_label) for f in schema.declared] == [
        ("colour", "enum", ("red", "green", "null"), True, None),
        ("tags", "multi", ("eco", "sale", "new"), False, None),
        ("sizes", "multi", ("small", "large"), False, None),
        ("grade", "ordinal", ("A", "B", "C", "UNGRADED"), False, "UNGRADED"),
        ("stars", "integer", ("1", "2", "3", "4", "5"), False, None),
        ("rank", "integer", tuple(map(str, range(1, 11))), False, None),
        ("score", "integer", ("0", "1", "2", "3", "null"), True, None),
        ("fragile", "boolean", ("true", "false", "null"), True, None)]
    assert (schema.declared[1].threshold, schema.declared[1].min_items, schema.declared[1].max_items) == (0.4, 1, 2)
    assert schema.declared[-1].depends_on == ("colour",)


def test_refs_to_refs_definitions_and_single_part_allof_are_followed(tmp_path):
    schema = _load_json(tmp_path, {
        "type": "object",
        "definitions": {"Tone": {"$ref": "#/definitions/Inner"},  # draft-07 and pydantic 1 spell it so
                        "Inner": {"enum": ["calm", "angry"], "title": "Inner", "description": "How it sounds"}},
        "$defs": {"Level": {"allOf": [{"$ref": "#/$defs/Scale"}]},
                  "Scale": {"$defs": {"Deep": {"type": "string", "enum": ["low", "high"]}},
                            "$ref": "#/$defs/Scale/$defs/Deep", "title": "Urgency level"},
                  "Flag": {"type": "boolean"}},
        "properties": {
            "tone": {"$ref": "#/definitions/Tone"},
            "level": {"allOf": [{"$ref": "#/$defs/Level"}], "description": "How urgent"},
            "level2": {"$ref": "#/$defs/Level"},
            "flag": {"allOf": [{"$ref": "#/$defs/Flag"}], "title": "Needs a reply"},
        }})
    assert [(f.name, f.type, f.labels, f.description) for f in schema.fields] == [
        ("tone", "enum", ("calm", "angry"), "How it sounds"),
        ("level", "enum", ("low", "high"), "How urgent"),
        ("level2", "enum", ("low", "high"), "Urgency level"),  # a title that says more than the name
        ("flag", "boolean", ("true", "false"), "Needs a reply")]
    assert schema.warnings == ()


def test_anyof_and_oneof_of_consts_are_an_enum_and_label_titles_warn(tmp_path):
    schema = _load_json(tmp_path, {"type": "object", "properties": {
        "plan": {"description": "Plan bought",
                 "oneOf": [{"const": "free", "title": "Free tier"}, {"const": "pro", "description": "Paid"}]},
        "tier": {"anyOf": [{"const": "gold", "title": "Gold"}, {"enum": ["silver", "bronze"]}]}}})
    assert [(f.name, f.labels, f.description) for f in schema.fields] == [
        ("plan", ("free", "pro"), "Plan bought"), ("tier", ("gold", "silver", "bronze"), "")]
    assert schema.warnings == ("field 'plan': the titles and descriptions of its oneOf labels are not shown to the "
                               "model (pcd's catalog lists the labels only); put what matters in the field's "
                               "description",)  # 'Gold' only re-spells its label: nothing is lost


KINDS = ("pcd fields are boolean, enum (ordinal with x-pcd-type), integer with minimum and maximum, or an array of "
         "enum items (multi-select)")
MULTI = "a multi-select is an array whose items are an enum of strings (list[Literal[...]], set[MyEnum])"


@pytest.mark.parametrize("prop, defs, message", [
    ({"type": "string"}, None, f"field 'x': type 'string' without enum (free text) is not supported; {KINDS}: "
                               "list the labels with enum"),
    ({"type": "integer"}, None, "field 'x': type 'integer' without both bounds (no lower or upper bound) is not "
                                "supported; pcd reads an integer as one of its values: give minimum (or "
                                "exclusiveMinimum) and maximum (or exclusiveMaximum), at most 500 values"),
    ({"type": "number"}, None, "field 'x': type 'number' (a decimal number) is not supported; use type 'integer' "
                               "with minimum and maximum, or list the values with enum"),
    ({"type": "array", "items": {"type": "string"}}, None,
     f"field 'x': type 'array' of free text is not supported; {MULTI}"),
    ({"$ref": "#/$defs/Sub"}, {"Sub": {"type": "object", "properties": {"y": {"type": "boolean"}}}},
     f"field 'x': type 'object' (a nested object) is not supported; {KINDS}"),
    ({"type": "date"}, None, f"field 'x': unknown JSON Schema type 'date'; {KINDS}"),
    ({}, None, f"field 'x': a property with no type, enum or $ref (any value) is not supported; {KINDS}"),
    ({"const": "a"}, None, "field 'x': const 'a' (one fixed value) is not a decision; give at least two labels "
                           "with enum, or drop the field"),
    ({"$ref": "other.json#/$defs/A"}, None, "field 'x': $ref 'other.json#/$defs/A' is not a local reference; pcd "
                                            "follows only references into the same file ('#/$defs/...', "
                                            "'#/definitions/...'): inline the definition"),
    ({"$ref": "https://example.com/s.json"}, None, "field 'x': $ref 'https://example.com/s.json' is not a local "
                                                   "reference; pcd follows only references into the same file "
                                                   "('#/$defs/...', '#/definitions/...'): inline the definition"),
    ({"$ref": "#/$defs/Nope"}, {"A": {"enum": ["a", "b"]}}, "field 'x': $ref '#/$defs/Nope' points to nothing in "
                                                            "this file"),
    ({"$ref": "#/$defs/A"}, {"A": {"$ref": "#/$defs/B"}, "B": {"allOf": [{"$ref": "#/$defs/A"}]}},
     "field 'x': $ref '#/$defs/A' forms a cycle ('#/$defs/A' -> '#/$defs/B' -> '#/$defs/A')"),
    ({"allOf": [{"enum": ["a", "b"]}, {"enum": ["b", "c"]}]}, None,
     "field 'x': allOf with 2 parts is not supported; pcd follows allOf only with a single part (as pydantic "
     "writes a described $ref)"),
    ({"anyOf": [{"type": "string"}, {"type": "integer"}]}, None,
     "field 'x': anyOf with a 'string' part (a union of types) is not supported; pcd reads anyOf/oneOf when "
     "every part is a const or an enum, or when one part is left beside null parts (Optional[...])"),
    ({"anyOf": [{"type": "string"}, {"type": "null"}]}, None,  # Optional[str]: the part is what is refused
     f"field 'x': type 'string' without enum (free text) is not supported; {KINDS}: list the labels with enum"),
    ({"enum": [1, 5]}, None, "field 'x': enum lists whole numbers with gaps (1, 5); an integer field reads every "
                             "whole number from its lower to its upper bound: to keep integers in the output, allow "
                             "the range, Annotated[int, Field(ge=1, le=5)] (JSON Schema: \"minimum\": 1, "
                             "\"maximum\": 5); or make the values labels, Literal['1', '5'], and the output column "
                             "holds strings ('5', not 5)"),
    ({"enum": [True]}, None, "field 'x': enum allows only True, one fixed value, which is not a decision; use bool "
                             "(true or false), or drop the field"),
    ({"enum": [1, "a"]}, None, "field 'x': label #1 is the number 1, not a string; quote it: \"1\""),
    ({"enum": ["yes", True]}, None, "field 'x': label #2 is the boolean True, not a string; quote it: \"true\""),
])
def test_json_schema_constructs_pcd_cannot_express_name_the_field_and_the_construct(tmp_path, prop, defs, message):
    assert _json_problem(tmp_path, prop, defs).replace(str(tmp_path / "s.json"), "s.json") == message


class Maybe(BaseModel):
    colour: Optional[Colour] = None
    fragile: Optional[bool] = None
    channel: Literal["web", "store"] | None = Field(default=None, description="Where")


@pytest.mark.parametrize("prop, defs", [
    ({"anyOf": [{"$ref": "#/$defs/A"}, {"type": "null"}]}, {"A": {"enum": ["a", "b"]}}),
    ({"oneOf": [{"type": "null"}, {"const": "a"}, {"const": "b"}]}, None),
    ({"type": ["string", "null"], "enum": ["a", "b"]}, None),
    ({"enum": ["a", "b", None]}, None),
])
def test_json_schema_null_parts_make_the_field_nullable(tmp_path, prop, defs):
    data = {"type": "object", "properties": {"x": prop}, **({"$defs": defs} if defs else {})}
    (f,) = _load_json(tmp_path, data).fields
    assert (f.type, f.labels, f.nullable) == ("enum", ("a", "b", "null"), True)


def test_optional_fields_are_nullable_the_same_way_from_the_model_and_from_its_json_schema(tmp_path):
    schema = _load_json(tmp_path, Maybe.model_json_schema(), "maybe.json")
    assert schema == schema_from_model(Maybe)
    assert [(f.name, f.labels, f.nullable) for f in schema.fields] == [
        ("colour", ("red", "green", "null"), True), ("fragile", ("true", "false", "null"), True),
        ("channel", ("web", "store", "null"), True)]


def test_every_problem_of_a_model_is_listed():
    bad = type("Bad", (BaseModel,), {"__annotations__": {"ok": bool, "n": int, "one": Literal["only"],
                                                           "m": Optional[float]}})
    with pytest.raises(SchemaError) as info:
        schema_from_model(bad)
    assert str(info.value) == (
        "Bad has 3 problems:\n"
        "  field 'n' of Bad: type int without both bounds is not supported; pcd reads an integer as one of its "
        "values: give Field(ge=..., le=...) (or gt/lt, conint), at most 500 values\n"
        "  field 'one': an enum needs at least two labels, got ['only']\n"
        "  field 'm' of Bad: type float is not supported; use bool, Literal['a', 'b', ...] or a str Enum, int with "
        "Field(ge=..., le=...), list[Literal[...]] / set[MyEnum] (multi-select), or Optional[...] of one of them")


# -- all problems of a schema in one run (issue #20 item 9) ------------------------------------

def _problems(tmp_path, text, name="schema.yaml"):
    (tmp_path / name).write_text(text)
    with pytest.raises(SchemaError) as info:
        load_schema(tmp_path / name)
    return str(info.value).replace(str(tmp_path / name), name)


def test_every_problem_of_a_yaml_schema_is_listed_once(tmp_path):
    text = """\
name: triage
colour: red
fields:
  sentiment:
    type: enum
    descripton: How the customer feels
    labels: [POSITIVE, NEGATIVE, POSITIVE, " "]
  urgent:
    type: bool
    labels: [y, n]
  route:
    type: enumm
    depends_on: [urgent, nowhere]
  team:
    type: enum
    labels: [A, B]
    depends_on: [team]
  sentiment__prob: {type: boolean}
  loop_a: {type: boolean, depends_on: [loop_b]}
  loop_b: {type: boolean, depends_on: [loop_a]}
"""
    assert _problems(tmp_path, text) == """schema.yaml has 10 problems:
  schema: unknown key 'colour' (known keys: name, instructions, fields, examples, rules, isolate_fields, record_quoting)
  field 'sentiment': unknown key 'descripton' (did you mean 'description'?)
  field 'sentiment': label #4 is only whitespace (' '); the model cannot write it in a way that means anything; give it a name
  field 'sentiment': duplicate label 'POSITIVE'
  field 'urgent': a boolean takes no labels (its values are true and false); use type: enum for named labels
  field 'route': unknown type 'enumm'; expected one of boolean, enum, ordinal, integer, multi
  field 'route': depends_on names an unknown field 'nowhere'
  field 'team': depends_on names the field itself
  field 'sentiment__prob': clashes with the output column 'sentiment__prob' of field 'sentiment'; rename it
  field 'loop_a': depends_on forms a cycle"""


def test_every_problem_of_a_json_schema_is_listed(tmp_path):
    data = {"title": "Review", "type": "object", "$defs": {"S": {"enum": ["neg", "pos", "neg"]}},
            "properties": {"sentiment": {"$ref": "#/$defs/S"}, "note": {"type": "string"},
                           "ok": {"type": "boolean"}, "stars": {"enum": [1, 3, 5]},
                           "maybe": {"anyOf": [{"type": "number"}, {"type": "null"}]}}}
    (tmp_path / "review.json").write_text(json.dumps(data))
    with pytest.raises(SchemaError) as info:
        load_schema(tmp_path / "review.json")
    assert str(info.value) == f"""{tmp_path / 'review.json'} has 4 problems:
  field 'sentiment': duplicate label 'neg'
  field 'note': type 'string' without enum (free text) is not supported; {KINDS}: list the labels with enum
  field 'stars': enum lists whole numbers with gaps (1, 3, 5); an integer field reads every whole number from \
its lower to its upper bound: to keep integers in the output, allow the range, Annotated[int, Field(ge=1, le=5)] \
(JSON Schema: "minimum": 1, "maximum": 5); or make the values labels, Literal['1', '3', '5'], and the output \
column holds strings ('5', not 5)
  field 'maybe': type 'number' (a decimal number) is not supported; use type 'integer' with minimum and maximum, \
or list the values with enum"""


def test_examples_are_checked_once_the_fields_are_sound_and_all_listed(tmp_path):
    text = """\
fields:
  urgent: {type: boolean}
  team: {type: enum, labels: [A, B]}
examples:
  - text: "Server down"
    labels: {urgent: yes, team: C}
  - text: "Invoice question"
    labels: {urgent: no}
  - text: "Fine"
    labels: {urgent: no, team: B}
"""
    assert _problems(tmp_path, text) == (
        "schema.yaml has 2 problems:\n"
        "  examples[0]: field 'team': 'C' is not one of its labels (A | B)\n"
        "  examples[1]: field 'team' has no value; an example must answer every field")
    # YAML booleans stay booleans where they are values of a boolean field
    schema = load_schema(_write(tmp_path, text.replace("team: C", "team: A").replace("{urgent: no}",
                                                                                     "{urgent: no, team: B}")))
    assert [e.labels for e in schema.examples] == [(0, 0), (1, 1), (1, 1)]


def _write(tmp_path, text, name="ok.yaml"):
    (tmp_path / name).write_text(text)
    return tmp_path / name


# -- labels YAML turned into booleans, numbers or dates (issue #20 item 11b) -------------------

def test_every_label_yaml_converted_is_named_as_written(tmp_path):
    text = """\
fields:
  answer: {type: enum, labels: [YES, NO, MAYBE]}
  code:
    type: enum
    choices:
      - 007
      - "12"
      - 1.50
      - 2024-01-01
      - ~
  on: {type: boolean}
  reply: {type: boolean, description: yes}
"""
    assert _problems(tmp_path, text) == """schema.yaml has 8 problems:
  field 'answer': label #1 is written YES, which YAML reads as the boolean True, not as text; quote it: "YES"
  field 'answer': label #2 is written NO, which YAML reads as the boolean False, not as text; quote it: "NO"
  field 'code': label #1 is written 007, which YAML reads as the number 7, not as text; quote it: "007"
  field 'code': label #3 is written 1.50, which YAML reads as the number 1.5, not as text; quote it: "1.50"
  field 'code': label #4 is written 2024-01-01, which YAML reads as the date 2024-01-01, not as text; quote it: "2024-01-01"
  field 'code': label #5 is written ~, which YAML reads as null (no value), not as text; quote it: "~"
  field name on is read by YAML as the boolean True, not as text; quote it: "on"
  field 'reply': 'description' must be a string"""


def test_one_converted_label_keeps_a_one_line_message_and_quoting_fixes_it(tmp_path):
    text = "fields:\n  answer:\n    type: enum\n    labels:\n      - YES\n      - 'NO'\n"
    assert _problems(tmp_path, text) == ("field 'answer': label #1 is written YES, which YAML reads as the boolean "
                                         "True, not as text; quote it: \"YES\"")
    schema = load_schema(_write(tmp_path, text.replace("- YES", '- "YES"')))
    assert schema.fields[0].labels == ("YES", "NO")


def test_list_form_and_preset_files_name_converted_labels_as_written(tmp_path):
    listed = "fields:\n  - name: answer\n    type: enum\n    labels: [Off, 'on']\n"
    assert _problems(tmp_path, listed) == ("field 'answer': label #1 is written Off, which YAML reads as the "
                                           "boolean False, not as text; quote it: \"Off\"")
    preset = "id: p\nschema:\n  tier: {type: enum, choices: [0x1F, B]}\n"
    assert _problems(tmp_path, preset) == ("field 'tier': label #1 is written 0x1F, which YAML reads as the number "
                                           "31, not as text; quote it: \"0x1F\"")


# -- the schema cases of tests/data/cases-round3/ (issue #20; formerly tests/test_cases_round3.py):
# a key given twice, an unknown key, and jsonschema-pydantic-enum-refs (pydantic's own JSON Schema
# gives the model's fields)

REFS_CASE = Path(__file__).parents[1] / "data" / "cases-round3" / "jsonschema-pydantic-enum-refs"


@pytest.mark.parametrize("name, text, message", [
    ("s.yaml", "fields:\n  a:\n    type: boolean\n  a:\n    type: boolean\n",
     "key 'a' appears twice in one YAML mapping (lines 2 and 4)"),
    ("s.yaml", "fields:\n  a:\n    type: enum\n    labels: [X, Y]\n    labels: [Y, Z]\n",
     "key 'labels' appears twice in one YAML mapping (lines 4 and 5)"),
    ("s.json", '{"fields": {"a": {"type": "boolean"}, "a": {"type": "boolean"}}}',
     "key 'a' appears twice in one JSON object (entries 1 and 2)"),
    ("s.yaml", "fields:\n  a:\n    type: enum\n    labels: [X, Y, X]\n", "field 'a': duplicate label 'X'"),
])
def test_a_schema_naming_a_key_twice_is_refused(tmp_path, name, text, message):
    (tmp_path / name).write_text(text)
    with pytest.raises(SchemaError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_schema(tmp_path / name)


@pytest.mark.parametrize("text, message", [
    ("fields:\n  a:\n    type: enum\n    descripton: x\n    labels: [A, B]\n",
     "field 'a': unknown key 'descripton' (did you mean 'description'?)"),
    ("fields:\n  a:\n    type: enum\n    label: [A, B]\n", "field 'a': unknown key 'label' (did you mean 'labels'?)"),
    ("name: x\nfield:\n  a: {type: boolean}\n", "schema: unknown key 'field' (did you mean 'fields'?)"),
    ("fields:\n  a: {type: boolean, colour: red}\n", "field 'a': unknown key 'colour' (known keys: type, description"),
])
def test_an_unknown_schema_key_is_an_error_naming_the_nearest_known_one(tmp_path, text, message):
    (tmp_path / "s.yaml").write_text(text)
    with pytest.raises(SchemaError) as exc:
        load_schema(tmp_path / "s.yaml")
    assert message in str(exc.value)


def test_pydantics_own_json_schema_gives_the_fields_of_the_model(monkeypatch):
    monkeypatch.chdir(REFS_CASE)  # the case names models.py relative to its folder
    from_json = load_schema("review.schema.json")
    assert from_json == load_schema("models.py:Review")  # fields, descriptions, name, instructions, hash
    assert [(f.name, f.type, f.labels, f.description) for f in from_json.fields] == [
        ("sentiment", "enum", ("negative", "neutral", "positive"), "Overall opinion of the product"),
        ("mentions_price", "boolean", ("true", "false"), "The review talks about the price"),
        ("channel", "enum", ("web", "store"), "Where it was bought")]


def test_an_optional_field_is_nullable_the_same_way_from_the_json_schema_and_the_model(monkeypatch):
    monkeypatch.chdir(REFS_CASE)  # issue #17 made Optional[...] a nullable field (it was refused before)
    from_json = load_schema("review_optional.schema.json")
    assert from_json == load_schema("models.py:ReviewOptional")
    (sentiment, _) = from_json.fields
    assert (sentiment.labels, sentiment.nullable) == (("negative", "neutral", "positive", "null"), True)
    result = pcd("inspect-schema", "review_optional.schema.json", code=None)
    assert result.exit_code == 0, result.output


def test_the_case_json_schema_passes_inspection(monkeypatch):
    monkeypatch.chdir(REFS_CASE)
    result = pcd("inspect-schema", "review.schema.json", code=None)
    assert result.exit_code == 0, result.output
