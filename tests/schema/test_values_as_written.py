"""Issue #28 item 6, values as tools write them: Pydantic IntEnum / Literal of ints or bools and
their model_json_schema() keep their types (or are refused with a fix that keeps them), no
message names pcd's internal module, and gold written by pandas as 4.0 reads as 4.

Case: cases-round4/pydantic-int-enums-unions-and-annotated (models.py copied under tests/data)."""

from __future__ import annotations

import enum
import json
import shutil
from pathlib import Path
from typing import Literal, Optional

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from pydantic import BaseModel

from pcd_cli.errors import SchemaError
from pcd_cli.quality.data import FieldSpec, gold_label_index, read_gold
from pcd_cli.schema.load import load_schema, parse_schema, schema_from_model
from pcd_cli.schema.model import decision_labels

from ..helpers import flat, pcd

CASE = Path(__file__).parents[1] / "data" / "cases-round4" / "pydantic-int-enums-unions-and-annotated"

#: model -> the output columns (name -> Arrow type) both forms give, or the phrases its refusal holds.
ACCEPTED = {"IntEnumField": {"priority": "int64"}, "LiteralInts": {"priority": "int64"},
            "LiteralBools": {"urgent": "bool"}, "SplitConstraints": {"stars": "int64"},
            "AnnotatedTypes": {"delta": "int64"}, "OptionalAnnotated": {"stars": "int64"},
            "Aliased": {"Sentiment": "string"}}
REFUSED = {"SteppedInts": ["field 'discount_pct'", "whole numbers with gaps (0, 5, 10, 25)",
                           "Annotated[int, Field(ge=0, le=25)]", "Literal['0', '5', '10', '25']",
                           "the output column holds strings ('5', not 5)"],
           "DiscriminatedUnion": ["field 'action'", "a union of objects", "discriminated union"]}


@pytest.fixture(scope="module")
def case_dir(tmp_path_factory):
    """The case's models.py and each model's model_json_schema() file, in a fresh folder."""
    import importlib.util

    folder = tmp_path_factory.mktemp("int-enums")
    shutil.copy(CASE / "models.py", folder / "models.py")
    spec = importlib.util.spec_from_file_location("case_int_enum_models", folder / "models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name in (*ACCEPTED, *REFUSED):
        (folder / f"{name}.json").write_text(json.dumps(getattr(module, name).model_json_schema()))
    (folder / "empty.jsonl").write_text("")
    return folder


@pytest.mark.parametrize("model", list(ACCEPTED))
def test_case_models_and_their_json_schema_give_the_same_typed_output(case_dir, model):
    columns = []
    for source in (f"{case_dir / 'models.py'}:{model}", case_dir / f"{model}.json"):
        out = case_dir / f"{model}.parquet"
        pcd("label", case_dir / "empty.jsonl", "-s", source, "-o", out, "-q")
        schema = pq.read_schema(out)
        columns.append({f.name: str(f.type) for f in schema if f.name in ACCEPTED[model]})
        out.unlink()
    assert columns == [ACCEPTED[model], ACCEPTED[model]]
    assert load_schema(f"{case_dir / 'models.py'}:{model}").source_sha256 == \
        load_schema(case_dir / f"{model}.json").source_sha256


@pytest.mark.parametrize("model", list(REFUSED))
def test_case_refusals_name_the_construct_with_a_fix_and_no_internal_module(case_dir, model):
    for source in (f"{case_dir / 'models.py'}:{model}", case_dir / f"{model}.json"):
        result = pcd("label", case_dir / "empty.jsonl", "-s", source, "-o", case_dir / "out.parquet", code=2)
        message = result.stderr.strip()
        assert "_pcd_schema" not in message and "pcd_cli" not in message
        assert len(message.splitlines()) == 1, message
        for phrase in REFUSED[model]:
            assert phrase in flat(message), (source, message)
    assert "Union[Refund, Replace]" in flat(pcd("label", case_dir / "empty.jsonl", "-s",
                                                 f"{case_dir / 'models.py'}:DiscriminatedUnion", "-o",
                                                 case_dir / "out.parquet", code=2).stderr)


class Level(enum.IntEnum):
    LOW = 0
    HIGH = 1


class Kinds(BaseModel):
    level: Optional[Level] = None             # an IntEnum under Optional: a nullable integer 0..1
    flag: Optional[Literal[True, False]] = None  # a nullable boolean
    score: Literal[3, 1, 2]                   # any order: the range 1..3


def test_int_enums_and_bool_literals_under_optional_keep_their_types(tmp_path):
    fields = {f.name: f for f in schema_from_model(Kinds).fields}
    assert (fields["level"].type, fields["level"].labels) == ("integer", ("0", "1", "null"))
    assert (fields["flag"].type, fields["flag"].labels) == ("boolean", ("true", "false", "null"))
    assert (fields["score"].type, fields["score"].labels) == ("integer", ("1", "2", "3"))
    assert fields["level"].value(1) == 1 and fields["flag"].value(0) is True and fields["level"].value(2) is None
    (tmp_path / "kinds.json").write_text(json.dumps(Kinds.model_json_schema()))
    assert load_schema(tmp_path / "kinds.json").source_sha256 == schema_from_model(Kinds).source_sha256


def test_hand_written_json_integer_enum_and_stepped_multi(tmp_path):
    data = {"type": "object", "properties": {
        "priority": {"type": "integer", "enum": [1, 2, 3]},
        "urgent": {"enum": [False, True]},
        "maybe": {"anyOf": [{"const": 2}, {"const": 1}, {"type": "null"}]}}}
    (tmp_path / "s.json").write_text(json.dumps(data))
    fields = {f.name: f for f in load_schema(tmp_path / "s.json").fields}
    assert (fields["priority"].type, fields["priority"].labels) == ("integer", ("1", "2", "3"))
    assert fields["urgent"].type == "boolean"
    assert (fields["maybe"].type, fields["maybe"].labels, fields["maybe"].nullable) == \
        ("integer", ("1", "2", "null"), True)
    multi = {"type": "object", "properties": {"codes": {"type": "array", "items": {"enum": [1, 2]}}}}
    (tmp_path / "m.json").write_text(json.dumps(multi))
    with pytest.raises(SchemaError, match="field 'codes': type 'array' of whole numbers is not supported"):
        load_schema(tmp_path / "m.json")


def test_other_refusals_never_name_the_internal_module(tmp_path):
    (tmp_path / "m.py").write_text("from typing import Union\nfrom pydantic import BaseModel\n"
                                   "class A(BaseModel):\n    x: bool\n"
                                   "class M(BaseModel):\n    a: list[A]\n    b: Union[A, int]\n")
    with pytest.raises(SchemaError) as info:
        load_schema(f"{tmp_path / 'm.py'}:M")
    assert "_pcd_schema" not in str(info.value)
    assert "type list[A] is not supported" in str(info.value)
    assert "type Union[A, int] (a union of types) is not supported" in str(info.value)


def test_gold_written_by_pandas_as_floats_reads_as_whole_numbers(tmp_path):
    schema = parse_schema({"name": "t", "fields": {
        "stars": {"type": "integer", "minimum": 1, "maximum": 5},
        "level": {"type": "ordinal", "labels": ["1", "2", "3", "4", "5"]},
        "grade": {"type": "ordinal", "labels": ["low", "mid", "high"]}}})
    frame = pd.DataFrame({"id": ["a", "b", "c"], "stars": [4, None, 2], "level": [4, 1, None],
                          "grade": ["mid", None, "high"]})
    assert frame["stars"].dtype == np.float64  # pandas: an int column with a gap is float
    frame.to_csv(tmp_path / "gold.csv", index=False)
    assert "4.0" in (tmp_path / "gold.csv").read_text()
    frame.to_parquet(tmp_path / "gold.parquet")
    for path in (tmp_path / "gold.csv", tmp_path / "gold.parquet"):
        gold = read_gold(path)
        read = {f.name: [gold_label_index(v, FieldSpec.of(f)) if v is not None and v == v else None
                         for v in gold[f.name]] for f in schema.fields}
        assert read == {"stars": [3, None, 1], "level": [3, 0, None], "grade": [1, None, 2]}, path
    spec = FieldSpec.of(schema.fields[1])
    assert [gold_label_index(v, spec) for v in ("4.0", " 4 ", 4.5, "4.5", True, "four")] == [3, 3, None, None, None,
                                                                                            None]
    # the same rule for examples and tune's gold rows (decision_labels -> Field.label_index)
    assert decision_labels(schema.declared, {"stars": "4.0", "level": 2.0, "grade": "low"}) == (3, 1, 0)
    with pytest.raises(SchemaError, match="field 'stars': '4.5' is not one of its labels"):
        decision_labels(schema.declared, {"stars": "4.5", "level": 2, "grade": "low"})
