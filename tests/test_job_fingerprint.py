"""The job fingerprint (``pcd_cli.job_fingerprint``): every option of ``LabelJob`` is in it or says
why it changes no value; everything the model reads is keyed by content (weights, tokenizer files,
the whole rendered template around the record); calibration files are checked against the same
parts (issue 51 item 1, round 7's ``reuse-stale-after-chat-template-edit``)."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pyarrow.parquet as pq
import pytest

from pcd_cli import Labeler
from pcd_cli.errors import CalibrationError
from pcd_cli.job import LabelJob
from pcd_cli.job_fingerprint import (CALIBRATION_PARTS, DECISION_NEUTRAL, MODEL_PARTS_KEY, OPTION_PARTS, PART_NAMES,
                                     first_difference)
from pcd_cli.quality.calibration import Calibration, FieldCalibration
from pcd_cli.results import Record

from .helpers import pcd, save_tiny_model, write_jsonl

SCHEMA = {"name": "tone", "fields": [{"name": "tone", "type": "enum", "labels": ["calm", "angry", "sad"]}]}


def test_every_labeljob_option_is_in_the_fingerprint_or_says_why_it_changes_no_value():
    options = {f.name for f in dataclasses.fields(LabelJob)}
    covered, neutral = set(OPTION_PARTS), set(DECISION_NEUTRAL)
    assert not covered & neutral, f"both fingerprinted and declared neutral: {sorted(covered & neutral)}"
    missing = options - covered - neutral
    assert not missing, (f"LabelJob options {sorted(missing)} are neither in job_fingerprint.OPTION_PARTS nor in "
                         "DECISION_NEUTRAL (with the reason they change no value): --reuse would copy stale rows")
    assert not (covered | neutral) - options, f"no such LabelJob option: {sorted((covered | neutral) - options)}"
    unknown = {p for parts in OPTION_PARTS.values() for p in parts} - set(PART_NAMES)
    assert not unknown, f"OPTION_PARTS names parts job_parts has not: {sorted(unknown)}"
    assert all(len(reason) > 20 for reason in DECISION_NEUTRAL.values())


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-model")
    save_tiny_model(folder)
    return folder


def _copy_model(src, dst):
    """A model folder beside ``src``: weights linked (unchanged), every other file copied."""
    dst.mkdir()
    for f in src.iterdir():
        if f.suffix == ".safetensors":
            (dst / f.name).symlink_to(f)
        else:
            shutil.copy(f, dst / f.name)
    return dst


def _labeler(schema_path, model, **job):
    return Labeler(str(schema_path), LabelJob(model=str(model), **job))


@pytest.fixture
def schema_path(tmp_path):
    path = tmp_path / "tone.json"
    path.write_text(json.dumps(SCHEMA))
    return path


def _template_file(folder):
    path = folder / "chat_template.jinja"
    if path.is_file():
        return path, path.read_text()
    config = json.loads((folder / "tokenizer_config.json").read_text())
    return None, config["chat_template"]


def _edit_template(folder, old, new):
    path, text = _template_file(folder)
    assert old in text, "the template changed shape; adjust the edit"
    if path is not None:
        path.write_text(text.replace(old, new))
    else:
        config = json.loads((folder / "tokenizer_config.json").read_text())
        config["chat_template"] = text.replace(old, new)
        (folder / "tokenizer_config.json").write_text(json.dumps(config))


def test_an_edit_after_the_record_changes_the_prompt_part_not_the_weights(model_folder, schema_path, tmp_path):
    before = _labeler(schema_path, model_folder)
    edited = _copy_model(model_folder, tmp_path / "edited")
    _edit_template(edited, "'<|im_start|>assistant\n'", "'<|im_start|>assistant\nReply in JSON only.\n'")
    after = _labeler(schema_path, edited)
    a, b = before.job_parts(), after.job_parts()
    assert a["model"] == b["model"]  # the weights are the same files
    assert before.compiled.prompt.head_sha256 == after.compiled.prompt.head_sha256  # what the old key saw
    assert a["prompt"] != b["prompt"] and a["tokenizer"] != b["tokenizer"]
    assert "another tokenizer or chat template" in first_difference(a, b)
    # and the values do differ: a reuse would have been stale
    rec = "The flight was late and nobody told us why."
    pa, pb = before.label_batch([Record("r", rec)])[0], after.label_batch([Record("r", rec)])[0]
    assert pa.fields[0].probs != pytest.approx(pb.fields[0].probs, abs=1e-6)


def test_tokenizer_files_are_keyed_by_content_and_a_renamed_folder_is_the_same_job(model_folder, schema_path,
                                                                                   tmp_path):
    base = _labeler(schema_path, model_folder).job_parts()
    renamed = _copy_model(model_folder, tmp_path / "renamed")
    assert _labeler(schema_path, renamed).job_parts() == base
    special = _copy_model(model_folder, tmp_path / "special")
    config = json.loads((special / "tokenizer_config.json").read_text())
    config["bos_token"] = "<|im_end|>"  # a special token's role moved; no weight, no template line changed
    config["add_bos_token"] = True
    (special / "tokenizer_config.json").write_text(json.dumps(config))
    changed = _labeler(schema_path, special).job_parts()
    assert changed["model"] == base["model"]
    assert changed["tokenizer"] != base["tokenizer"]


@pytest.mark.parametrize("option, value, part", [
    ("scoring", "exact", "scoring"),
    ("truncate", "head", "truncate"),
    ("permutations", 3, "permutations"),
    ("prior_correction", True, "prior_correction"),
    ("isolate_fields", True, "isolate_fields"),
    ("abstain_below", 0.6, "abstaining"),
    ("dtype", "bfloat16", "dtype"),
    ("steering_check", False, "steering_check"),
    ("record_quoting", "none", "prompt"),
])
def test_an_option_that_changes_values_changes_its_part(model_folder, schema_path, option, value, part):
    assert part in OPTION_PARTS[option]
    base = _labeler(schema_path, model_folder).job_parts()
    other = _labeler(schema_path, model_folder, **{option: value}).job_parts()
    assert base[part] != other[part], f"{option}={value!r} left the {part!r} part unchanged"


def _calibration_for(labeler, **parts):
    fitted = {k: v for k, v in labeler.model_parts().items() if k in CALIBRATION_PARTS} | parts
    field = FieldCalibration("tone", ("calm", "angry", "sad"), 1.0, (0.0, 0.5, -0.5), 20)
    md = labeler.metadata()
    return Calibration(pcd_version="0", model=md["pcd.model"], schema_sha256=md["pcd.schema_sha256"],
                       prompt_head_sha256=md["pcd.prompt_head_sha256"], scoring=md["pcd.scoring"],
                       fields={"tone": field}, fitted_for=fitted)


def test_a_calibration_is_checked_by_content_not_by_the_model_name(model_folder, schema_path, tmp_path):
    labeler = _labeler(schema_path, model_folder)
    cal = _calibration_for(labeler).save(tmp_path / "cal.json")
    loaded = Calibration.load(tmp_path / "cal.json")
    assert loaded.fitted_for == cal.fitted_for and set(loaded.fitted_for) == set(CALIBRATION_PARTS)
    assert json.loads((tmp_path / "cal.json").read_text())["format_version"] == 2
    renamed = _copy_model(model_folder, tmp_path / "renamed-model")  # another name, the same content: applies
    applied = _labeler(schema_path, renamed, calibration=str(tmp_path / "cal.json"))
    assert applied.calibration.fitted_for == cal.fitted_for
    edited = _copy_model(model_folder, tmp_path / "edited")
    _edit_template(edited, "'<|im_start|>assistant\n'", "'<|im_start|>assistant\nReply in JSON only.\n'")
    with pytest.raises(CalibrationError, match="fitted on another prompt.*refit"):
        _labeler(schema_path, edited, calibration=str(tmp_path / "cal.json"))
    other_weights = tmp_path / "other-weights"
    save_tiny_model(other_weights, seed=1)
    with pytest.raises(CalibrationError, match="fitted on other weights"):
        _labeler(schema_path, other_weights, calibration=str(tmp_path / "cal.json"))


def test_a_calibration_for_another_schema_says_what_changed(model_folder, schema_path):
    """A new-user trial: a schema with a label added, or its instructions edited, was refused with
    two hashes only. The message now names the calibrated field whose labels differ, a field the
    schema lacks, or says the labels are the same and the rest of the schema changed."""
    labeler = _labeler(schema_path, model_folder)
    cal = _calibration_for(labeler)
    md = labeler.metadata()
    parts = json.loads(md[MODEL_PARTS_KEY])
    other = md | {MODEL_PARTS_KEY: json.dumps(parts | {"schema": "0" * 64})}
    with pytest.raises(CalibrationError) as same_labels:
        cal.check(other)
    assert "fitted for another schema" in str(same_labels.value)
    assert "(the fields it calibrates have the same labels: the schema's instructions, a description or a rule " \
           "changed): refit it with pcd calibrate for this model, schema and prompt" in str(same_labels.value)
    with pytest.raises(CalibrationError) as added:
        cal.check(other | {"pcd.schema_json": json.dumps({"tone": ["calm", "angry", "sad", "happy"]})})
    assert "(field 'tone' had the labels calm, angry, sad, this schema has calm, angry, sad, happy)" \
        in str(added.value)
    with pytest.raises(CalibrationError, match="field 'tone' is not in this schema"):
        cal.check(other | {"pcd.schema_json": json.dumps({"mood": ["calm"]})})


def test_a_format_1_calibration_still_loads_and_is_checked_by_name(model_folder, schema_path, tmp_path):
    labeler = _labeler(schema_path, model_folder)
    doc = json.loads(_calibration_for(labeler).to_json())
    doc["format_version"] = 1
    del doc["fitted_for"]
    (tmp_path / "v1.json").write_text(json.dumps(doc))
    loaded = Calibration.load(tmp_path / "v1.json")
    assert loaded.fitted_for == {}
    loaded.check(labeler.metadata())  # same model name, schema, head, scoring: applies
    with pytest.raises(CalibrationError, match="pcd.scoring"):
        loaded.check(labeler.metadata() | {"pcd.scoring": "exact"})


def test_reuse_after_a_template_edit_copies_nothing_and_names_the_template(model_folder, schema_path, tmp_path):
    """Round 7's case through the CLI: yesterday's output, today the template after the record was
    edited (weights unchanged): nothing reused, the message says why, values equal a fresh run."""
    model = _copy_model(model_folder, tmp_path / "model")
    rows = [{"id": f"r{i}", "text": t} for i, t in enumerate(["late flight", "great crew, thanks", "lost my bag"])]
    inp = write_jsonl(tmp_path / "in.jsonl", rows)
    common = ["-s", schema_path, "--id-field", "id", "--model", model, "--log-format", "json"]
    pcd("label", inp, *common, "-o", tmp_path / "a.parquet")
    assert MODEL_PARTS_KEY in {k.decode() for k in pq.read_schema(tmp_path / "a.parquet").metadata}
    _edit_template(model, "'<|im_start|>assistant\n'", "'<|im_start|>assistant\nReply in JSON only.\n'")
    result = pcd("label", inp, *common, "-o", tmp_path / "b.parquet", "--reuse", tmp_path / "a.parquet")
    events = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    done = next(e for e in events if e.get("event") == "done")
    assert done["reused"] == 0
    said = " ".join(e.get("message", "") for e in events if e.get("event") == "reuse")
    assert "another tokenizer or chat template" in said
    pcd("label", inp, *common, "-o", tmp_path / "c.parquet")
    b = pq.read_table(tmp_path / "b.parquet").to_pandas()
    c = pq.read_table(tmp_path / "c.parquet").to_pandas()
    assert (b["tone__prob"] - c["tone__prob"]).abs().max() <= 1e-5
