"""The retrain's trainer (``pcd_cli.retrain.fit_on_gold``) on a gold journal's export, with
the tiny random model: ``pcd calibrate`` and ``pcd tune`` (the library functions behind the
commands) run, and their holdout figures, fitted files and the served job's new options come back.
The tune run is in ``make test-full`` only."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from pcd_cli.job import LabelJob
from pcd_cli.schema.load import parse_schema
from pcd_cli.io.gold_journal import GoldJournal
from pcd_cli.retrain import fit_on_gold

from ..helpers import KEYWORD_SCHEMA, keyword_rows, keyword_tune_files


def export(tmp_path, rows=30):
    tmp_path.mkdir(parents=True, exist_ok=True)
    journal = GoldJournal(tmp_path / "gold.jsonl")
    for i, row in enumerate(keyword_rows(rows)):
        journal.append_annotation({"id": i, "data": {"text": row["text"], "id": row["id"]}},
                                  {"id": 100 + i, "completed_by": 1, "result": [{
                                      "from_name": "refund", "to_name": "text", "type": "choices",
                                      "value": {"choices": ["true" if row["refund"] else "false"]}}]})
    assert journal.write_export(tmp_path / "export.json") == rows
    return tmp_path / "export.json"


def check_figures(figures):
    assert set(figures) == {"accuracy", "nll"}
    assert 0.0 <= figures["accuracy"] <= 1.0 and math.isfinite(figures["nll"]) and figures["nll"] > 0


def test_calibrate_on_the_journal(tmp_path):
    keyword_tune_files(tmp_path)
    job = LabelJob(model=str(tmp_path / "tiny-model"))
    fitted = fit_on_gold("calibrate", export(tmp_path, rows=12), parse_schema(KEYWORD_SCHEMA), job, tmp_path / "run")
    assert fitted.path == tmp_path / "run" / "calibration.json" and json.loads(fitted.path.read_text())
    assert fitted.job.calibration == str(fitted.path) and fitted.job.model == job.model
    assert fitted.own_model is False and fitted.holdout_rows == 12  # cross-validated: every row held out once
    check_figures(fitted.before)
    check_figures(fitted.after)


@pytest.mark.full  # a minute and more on a shared CPU
def test_tune_on_the_journal(tmp_path):
    pytest.importorskip("peft")
    keyword_tune_files(tmp_path)
    job = LabelJob(model=str(tmp_path / "tiny-model"))
    fitted = fit_on_gold("tune", export(tmp_path), parse_schema(KEYWORD_SCHEMA), job, tmp_path / "run")
    assert fitted.path == tmp_path / "run" / "tuned" and fitted.path.is_dir()
    assert fitted.job.adapter == str(fitted.path) and fitted.job.model == job.model and fitted.own_model is True
    assert fitted.holdout_rows == 6  # pcd tune's default holdout: 0.2 of the 30 rows
    check_figures(fitted.before)
    check_figures(fitted.after)


# -- the readout refitted, and the gold rows' labels kept between retrains (issue #50) -------------

def _served_linear_calibration(path, schema):
    """A calibration file whose ``refund`` field holds a linear readout (its numbers are not used:
    a retrain reads which readout is served, then fits its own on the gold)."""
    import numpy as np

    from pcd_cli.quality.calibration import Calibration, FieldCalibration
    from pcd_cli.quality.readout import Readout

    readout = Readout((1,), ("true", "false"), (0, 1), np.zeros(64), np.ones(64), np.zeros((2, 64)), np.zeros(2))
    Calibration("x", "m", schema.source_sha256, "h", "marginal", {"refund": FieldCalibration(
        "refund", ("true", "false"), 1.0, (0.0, 0.0), 30, readout=readout)}).save(path)
    return path


def _numbers_close(a, b, where="calibration"):
    """``a`` and ``b`` (JSON values) equal, numbers to 1e-9."""
    if isinstance(a, dict):
        assert set(a) == set(b), where
        for k in a:
            _numbers_close(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _numbers_close(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and not isinstance(a, bool):
        assert math.isclose(a, b, rel_tol=0, abs_tol=1e-9), (where, a, b)
    else:
        assert a == b, where


@pytest.mark.full  # 30 s of CPU: four fits, a hundred rows decoded one a pass; the fast one is below
def test_a_retrain_refits_the_served_readout_and_decodes_only_new_gold_rows(tmp_path, monkeypatch):
    pytest.importorskip("sklearn")
    from pcd_cli.api import Labeler
    from pcd_cli.retrain import served_readout

    keyword_tune_files(tmp_path)
    schema = parse_schema(KEYWORD_SCHEMA)
    # one record a forward pass: a row's values do not depend on which rows share its passes
    # (packing moves them within 1e-5 otherwise), so a stored row equals a fresh decode exactly
    base = LabelJob(model=str(tmp_path / "tiny-model"), max_tokens_per_pass=24)
    job = replace(base, calibration=str(_served_linear_calibration(tmp_path / "served.json", schema)))
    assert served_readout(job) == "linear" and served_readout(base) == "logits"
    decoded = []
    real = Labeler.label_frame
    monkeypatch.setattr(Labeler, "label_frame", lambda self, df, **k: decoded.append(len(df)) or real(self, df, **k))
    store = tmp_path / "labelled-rows.npz"

    first = fit_on_gold("calibrate", export(tmp_path / "e1", rows=24), schema, job, tmp_path / "run1", store=store)
    assert decoded == [24] and store.is_file()
    assert json.loads(first.path.read_text())["fields"]["refund"]["readout"]["layers"]  # the readout, refitted
    job = first.job  # the served job now: the first retrain's calibration, with its readout
    assert served_readout(job) == "linear"
    kept = fit_on_gold("calibrate", export(tmp_path / "e2", rows=36), schema, job, tmp_path / "run2", store=store)
    assert decoded == [24, 12]  # only the 12 new gold rows
    fresh = fit_on_gold("calibrate", export(tmp_path / "e3", rows=36), schema, job, tmp_path / "run3")
    assert decoded == [24, 12, 36]
    a, b = json.loads(kept.path.read_text()), json.loads(fresh.path.read_text())
    assert a["fields"]["refund"]["readout"]["cv"]["n"] == 36
    _numbers_close(a["fields"], b["fields"])
    assert kept.before == pytest.approx(fresh.before, abs=1e-9) and kept.after == pytest.approx(fresh.after, abs=1e-9)
    # another job (the logits readout: no hidden states read) reuses nothing of the store
    fit_on_gold("calibrate", export(tmp_path / "e4", rows=24), schema, base, tmp_path / "run4", store=store)
    assert decoded[-1] == 24


def test_a_calibrate_retrain_reads_earlier_rows_from_the_store_and_fits_the_same(tmp_path, monkeypatch):
    from pcd_cli.api import Labeler

    keyword_tune_files(tmp_path)
    schema = parse_schema(KEYWORD_SCHEMA)
    job = LabelJob(model=str(tmp_path / "tiny-model"), max_tokens_per_pass=24)  # one record a pass: exact
    decoded = []
    real = Labeler.label_frame
    monkeypatch.setattr(Labeler, "label_frame", lambda self, df, **k: decoded.append(len(df)) or real(self, df, **k))
    store = tmp_path / "labelled-rows.npz"
    fit_on_gold("calibrate", export(tmp_path / "e1", rows=10), schema, job, tmp_path / "run1", store=store)
    kept = fit_on_gold("calibrate", export(tmp_path / "e2", rows=14), schema, job, tmp_path / "run2", store=store)
    fresh = fit_on_gold("calibrate", export(tmp_path / "e3", rows=14), schema, job, tmp_path / "run3")
    assert decoded == [10, 4, 14]
    _numbers_close(json.loads(kept.path.read_text())["fields"], json.loads(fresh.path.read_text())["fields"])
    assert kept.before == pytest.approx(fresh.before, abs=1e-9) and kept.after == pytest.approx(fresh.after, abs=1e-9)
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # written atomically: no temporary left
