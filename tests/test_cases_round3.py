"""Round-3 cases (issue #20) that this stop fixes, each as its kind: a name given twice is never
resolved silently (CSV headers, Parquet columns, JSONL keys, YAML and JSON schema files);
model hub ids with dots in them are tried as hub ids; a GGUF that is a web page or a cut
download is refused naming the cause. The inputs are copied from
../shared/cases-round3/ into tests/data/cases-round3/."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pcd_cli.backends.torch_backend import resolve_model
from pcd_cli.errors import InputError, ModelError, SchemaError
from pcd_cli.io.readers import InputSpec, RecordReader
from pcd_cli.schema.load import load_schema

from .helpers import pcd

CASE = Path(__file__).with_name("data") / "cases-round3" / "csv-duplicate-header-columns"


def _label(*args):
    return pcd("label", *args, code=None)


@pytest.mark.parametrize("name, column, positions", [("input.csv", "text", "columns 2 and 4"),
                                                     ("input-dup-id.csv", "id", "columns 1 and 3")])
def test_a_csv_header_naming_a_column_twice_exits_2_before_the_model_loads(tmp_path, name, column, positions):
    started = time.perf_counter()
    result = _label(CASE / name, "-s", CASE / "schema.yaml", "--id-field", "id", "-o", tmp_path / "o.parquet")
    assert result.exit_code == 2
    assert f"column {column!r} appears twice in the CSV header ({positions}); rename one" in " ".join(result.output.split())
    assert time.perf_counter() - started < 5  # no model was loaded
    assert not (tmp_path / "o.parquet").exists()


def test_a_parquet_file_with_a_repeated_column_is_refused(tmp_path):
    table = pa.Table.from_arrays([pa.array(["a"]), pa.array(["hello"]), pa.array(["note"])], names=["id", "text", "text"])
    pq.write_table(table, tmp_path / "dup.parquet")
    with pytest.raises(InputError, match=r"column 'text' appears twice in the Parquet schema \(columns 2 and 3\)"):
        list(RecordReader(tmp_path / "dup.parquet", InputSpec(id_field="id")))


def test_a_jsonl_object_repeating_a_read_key_fails_that_row_only(tmp_path):
    rows = (CASE / "input-dup-key.jsonl").read_text() + '{"id": "ok-1", "text": "a fine row", "note": 1}\n'
    (tmp_path / "in.jsonl").write_text(rows)
    items = [i for batch in RecordReader(tmp_path / "in.jsonl", InputSpec(id_field="id")) for i in batch]
    n_dup = len((CASE / "input-dup-key.jsonl").read_text().splitlines())
    assert [type(i).__name__ for i in items] == ["RecordFailure"] * n_dup + ["Record"]
    assert "key 'text' appears twice in the JSON object (keys 2 and 4)" in items[0].error
    assert items[-1].text == "a fine row"
    # a key pcd does not read may repeat (it is not used); the row is labelled
    (tmp_path / "other.jsonl").write_text('{"id": "x", "text": "hi", "n": 1, "n": 2}\n')
    items = [i for b in RecordReader(tmp_path / "other.jsonl", InputSpec(id_field="id")) for i in b]
    assert type(items[0]).__name__ == "Record"


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


@pytest.mark.parametrize("spec", ["Qwen/Qwen2.5-0.5B-Instruct", "meta-llama/Llama-3.1-8B-Instruct",
                                  "microsoft/Phi-3.5-mini-instruct", "mlx-community/Qwen2.5-0.5B-Instruct-4bit"])
def test_hub_ids_with_dots_are_hub_ids(spec):
    assert resolve_model(spec) == (spec, spec)


@pytest.mark.parametrize("spec", ["./missing-model", "models/sub/missing", "/no/such/folder", "weights.bin"])
def test_paths_that_do_not_exist_are_still_refused(spec):
    with pytest.raises(ModelError, match="no such folder or .gguf file"):
        resolve_model(spec)


def test_an_unreachable_hub_id_exits_3_with_the_hubs_reason(tmp_path, monkeypatch):
    import transformers

    def offline(source, *args, **kwargs):  # what transformers raises with no network, at once
        raise OSError(f"We couldn't connect to 'https://huggingface.co' to load the files for {source}, and "
                      "couldn't find them in the cached files.")

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", offline)
    (tmp_path / "in.jsonl").write_text(json.dumps({"text": "hello"}) + "\n")
    result = _label(tmp_path / "in.jsonl", "-s", CASE / "schema.yaml", "--model", "Qwen/Qwen2.5-0.5B-Instruct",
                    "-o", tmp_path / "o.parquet")
    assert result.exit_code == 3
    flat = " ".join(result.output.split())
    assert "--model 'Qwen/Qwen2.5-0.5B-Instruct': cannot load it (We couldn't connect to 'https://huggingface.co'" \
        in flat
    assert "no such folder" not in flat


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


GGUF_CASE = CASE.with_name("gguf-html-page-or-truncated-download")


@pytest.mark.parametrize("command", ["label", "inspect-schema"])
@pytest.mark.parametrize("model, message", [
    ("not-a-model.gguf", "'not-a-model.gguf': not a GGUF file (it starts with b'<!DOCTYP'; a GGUF file starts with "
                         "b'GGUF'): it looks like an HTML page: download with the /resolve/ URL, not /blob/"),
    ("truncated.gguf", "'truncated.gguf': the file is incomplete: 20,000,000 of 98,362,432 bytes "
                       "(an interrupted download? download it again)"),
])
def test_a_gguf_that_is_a_web_page_or_a_cut_download_exits_3_naming_the_cause(tmp_path, monkeypatch, command,
                                                                               model, message):
    from pcd_cli.backends.torch_backend import embedded_gguf_path

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)  # relative names, as the case runs them
    for name in ("input.jsonl", "schema.yaml"):
        (tmp_path / name).write_bytes((GGUF_CASE / name).read_bytes())
    # the page is kept as .html in the repository (no model file is tracked by git) and named as the case names it
    (tmp_path / "not-a-model.gguf").write_bytes((GGUF_CASE / "not-a-model.html").read_bytes())
    with embedded_gguf_path().open("rb") as fh:
        (tmp_path / "truncated.gguf").write_bytes(fh.read(20_000_000))
    args = (["label", "input.jsonl", "-s", "schema.yaml", "--id-field", "id", "-o", "out.parquet", "--quiet"]
            if command == "label" else ["inspect-schema", "schema.yaml"])
    result = pcd(*args, "--model", model, code=None)
    assert result.exit_code == 3, result.output
    assert f"error: {message}" in " ".join(result.output.split())
    assert "Traceback" not in result.output and "reshape" not in result.output
    assert not (tmp_path / "cache").exists()  # no half-converted entry, not even a content key
    assert not (tmp_path / "out.parquet").exists()


REFS_CASE = CASE.with_name("jsonschema-pydantic-enum-refs")


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
