"""Schema validation: every bad schema is refused naming the field and the problem."""

from __future__ import annotations

import json

import pytest

from pcd_cli.errors import SchemaError
from pcd_cli.prompt import LAYOUTS, catalog_line
from pcd_cli.schema import load_schema, parse_schema


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
