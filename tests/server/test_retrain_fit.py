"""The retrain's trainer (``pcd_cli.retrain.fit_on_gold``) on a gold journal's export, with
the tiny random model: ``pcd calibrate`` and ``pcd tune`` (the library functions behind the
commands) run, and their holdout figures, fitted files and the served job's new options come back.
The tune run is in ``make test-full`` only."""

from __future__ import annotations

import json
import math

import pytest

from pcd_cli.job import LabelJob
from pcd_cli.schema.load import parse_schema
from pcd_cli.io.gold_journal import GoldJournal
from pcd_cli.retrain import fit_on_gold

from ..helpers import KEYWORD_SCHEMA, keyword_rows, keyword_tune_files


def export(tmp_path, rows=30):
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
