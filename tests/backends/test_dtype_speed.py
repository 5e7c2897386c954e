"""bfloat16 said once, measured not assumed (issue #38 item 5): ``pcd bench``'s bfloat16-vs-float32
measurement is kept per model, and ``pcd label`` in float32 says it in one line at the end only when
that measurement found bfloat16 faster on this machine."""

from __future__ import annotations

import json

from pcd_cli.backends import dtype_speed

from ..helpers import pcd, save_tiny_model

MEASURED = {"speedup": 1.68, "labels_equal": 30, "decisions": 30, "max_abs_dprob": 0.063}


class TorchBackend:  # what bfloat16_would_run checks: the backend's class, device and dtype
    def __init__(self, dtype: str = "float32", model_id: str = "m"):
        self.device, self.dtype_name, self.model_id = "cpu", dtype, model_id


def test_the_note_needs_a_measurement_that_found_bfloat16_faster(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(dtype_speed, "cpu_has_bfloat16", lambda: True)
    assert dtype_speed.bfloat16_note(TorchBackend()) is None  # never measured: nothing said
    dtype_speed.record_measurement("m", MEASURED, schema="tweets", records=30)
    note = dtype_speed.bfloat16_note(TorchBackend())
    assert "1.68x faster" in note and "30/30 labels equal" in note and "max |dp| 0.063" in note
    assert dtype_speed.bfloat16_note(TorchBackend("bfloat16")) is None  # already bfloat16
    assert dtype_speed.bfloat16_note(TorchBackend(model_id="other")) is None  # measured for another model
    dtype_speed.record_measurement("m", {**MEASURED, "speedup": 1.01}, schema="tweets", records=30)
    assert dtype_speed.bfloat16_note(TorchBackend()) is None  # the latest measurement: not faster
    saved = json.loads((tmp_path / "pcd" / "dtype-speed.json").read_text())
    assert saved["m"]["speedup"] == 1.01 and saved["m"]["schema"] == "tweets"
    monkeypatch.setattr(dtype_speed, "cpu_has_bfloat16", lambda: False)
    dtype_speed.record_measurement("m", MEASURED, schema="tweets", records=30)
    assert dtype_speed.bfloat16_note(TorchBackend()) is None  # a CPU without bfloat16


def test_pcd_label_says_it_once_at_the_end(tmp_path, monkeypatch):
    model = tmp_path / "tiny"
    save_tiny_model(model)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(dtype_speed, "cpu_has_bfloat16", lambda: True)
    schema = tmp_path / "s.yaml"
    schema.write_text("fields:\n  urgent: {type: boolean}\n")
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in ("a", "b", "c")))
    args = ("label", data, "-s", schema, "--model", model, "-o", tmp_path / "out.parquet")
    assert "bfloat16" not in pcd(*args).stderr
    from pcd_cli.backends import load_backend

    dtype_speed.record_measurement(load_backend(str(model), device="cpu").model_id, MEASURED, schema="s", records=3)
    said = pcd(*args).stderr
    assert said.count("pcd bench measured --dtype bfloat16 1.68x faster") == 1
    assert "bfloat16" not in pcd(*args, "--dtype", "float32").stderr  # a dtype asked for: not second-guessed


def test_half_precision_that_is_a_poor_choice_for_the_device_is_named(tmp_path, monkeypatch):
    """Issue #45: ``--dtype float16`` on a CPU was accepted without a word (slower and less exact
    there); bfloat16 is named where the CPU lacks it or pcd bench measured it slower."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(dtype_speed, "cpu_has_float16", lambda: False)
    monkeypatch.setattr(dtype_speed, "cpu_has_bfloat16", lambda: True)
    note = dtype_speed.dtype_note(TorchBackend("float16"))
    assert note == ("--dtype float16 is a poor choice for this device: this CPU has no float16 arithmetic: slower "
                    "than float32 here, and less exact; float32 (the default on a CPU) is faster here and more exact")
    assert dtype_speed.dtype_note(TorchBackend("float32")) is None
    assert dtype_speed.dtype_note(TorchBackend("bfloat16")) is None  # the CPU has it, nothing measured
    dtype_speed.record_measurement("m", {**MEASURED, "speedup": 0.8, "labels_equal": 28}, schema="s", records=30)
    assert "pcd bench measured it 0.80x the speed of float32 for this model here (slower), and less exact " \
           "(28/30 labels equal)" in dtype_speed.dtype_note(TorchBackend("bfloat16"))
    dtype_speed.record_measurement("m", MEASURED, schema="s", records=30)  # measured faster: a fine choice
    assert dtype_speed.dtype_note(TorchBackend("bfloat16")) is None
    monkeypatch.setattr(dtype_speed, "cpu_has_bfloat16", lambda: False)
    assert "this CPU has no bfloat16 instructions" in dtype_speed.dtype_note(TorchBackend("bfloat16"))
    monkeypatch.setattr(dtype_speed, "cpu_has_float16", lambda: True)  # a CPU with float16 arithmetic
    assert dtype_speed.dtype_note(TorchBackend("float16")) is None
    gpu = TorchBackend("float16")
    gpu.device = "cuda:0"
    monkeypatch.setattr(dtype_speed, "cpu_has_float16", lambda: False)
    assert dtype_speed.dtype_note(gpu) is None


def test_pcd_label_says_the_poor_dtype_once_at_the_end(tmp_path, monkeypatch):
    model = tmp_path / "tiny"
    save_tiny_model(model)
    monkeypatch.setattr(dtype_speed, "cpu_has_float16", lambda: False)
    schema = tmp_path / "s.yaml"
    schema.write_text("fields:\n  urgent: {type: boolean}\n")
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in ("a", "b", "c")))
    args = ("label", data, "-s", schema, "--model", model, "--device", "cpu")
    said = pcd(*args, "-o", tmp_path / "h.parquet", "--dtype", "float16").stderr
    assert " ".join(said.split()).count("--dtype float16 is a poor choice for this device") == 1
    logged = pcd(*args, "-o", tmp_path / "j.parquet", "--dtype", "float16", "--log-format", "json").stderr
    notes = [e for e in map(json.loads, logged.splitlines()) if e["event"] == "note"]
    assert len(notes) == 1 and notes[0]["message"].startswith("--dtype float16 is a poor choice for this device")
    assert "poor choice" not in pcd(*args, "-o", tmp_path / "f.parquet", "--dtype", "float32").stderr
