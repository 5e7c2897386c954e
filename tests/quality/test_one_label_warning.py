"""One label on (nearly) every row: ``pcd label`` and ``pcd eval`` warn by one rule
(``metrics.one_label``).

From issue 28 item 7, "the first hour tells the truth" (formerly tests/test_first_hour.py);
hand-made pcd outputs and the tiny random model.
"""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

import pcd_cli.backends
from pcd_cli.quality import evaluate, read_gold, read_predictions
from pcd_cli.quality import metrics as M

from ..helpers import AIRLINE, SENTIMENTS, flat, pcd, sentiment_probs, write_sentiment_output

pytestmark = pytest.mark.usefixtures("fewer_resamples")  # no figure checked here is an interval


def test_one_label_rule():
    assert M.one_label({"NEGATIVE": 20}, 3) == ("NEGATIVE", 20, 20)
    assert M.one_label({"NEGATIVE": 19, "NEUTRAL": 1}, 3) == ("NEGATIVE", 19, 20)  # 95 %
    assert M.one_label({"NEGATIVE": 18, "NEUTRAL": 2}, 3) is None  # 90 %
    assert M.one_label({"NEGATIVE": 9}, 3) is None  # too few rows to tell
    assert M.one_label({"false": 50}, 2) is None  # a yes/no field answered "no": often the truth


def test_eval_warns_by_the_same_rule(tmp_path):
    gold = tmp_path / "gold.jsonl"
    gold.write_text("".join(json.dumps({"id": f"t{i}", "sentiment": SENTIMENTS[i % 3]}) + "\n" for i in range(20)))
    preds = write_sentiment_output(tmp_path / "p.parquet", [(f"t{i}", 0 if i else 1, sentiment_probs(0 if i else 1, 0.9))
                                                     for i in range(20)])
    frame, _ = read_predictions(preds)
    report = evaluate(frame, read_gold(gold))
    assert any(w.startswith("field 'sentiment': 19 of 20 rows were labelled 'NEGATIVE'; the accuracy 0.300 is near "
                            "the share of 'NEGATIVE' in the gold labels (0.350)") for w in report.warnings)


def test_pcd_label_warns_when_every_row_gets_one_label(tiny_chat_backend, tmp_path, monkeypatch):
    """The same text 12 times through the tiny model: one label on every row, said at the end."""
    monkeypatch.setattr(pcd_cli.backends, "load_backend", lambda *a, **k: tiny_chat_backend)
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"r{i}", "text": "the flight was late"}) + "\n" for i in range(12)))
    result = pcd("label", src, "-s", AIRLINE, "--id-field", "id", "-o", tmp_path / "o.parquet", "--no-progress",
                 env={"COLUMNS": "200"})
    label = pq.read_table(tmp_path / "o.parquet").column("sentiment").to_pylist()[0]
    assert f"warning: field 'sentiment': every row labelled '{label}' (mean probability of the chosen label" \
           in flat(result.output)
    assert "the model may not tell the labels apart" in flat(result.output)
    few = pcd("label", src, "-s", AIRLINE, "--id-field", "id", "--limit", "9", "-o", tmp_path / "p.parquet",
              "--no-progress")
    assert "may not tell the labels apart" not in flat(few.output)
