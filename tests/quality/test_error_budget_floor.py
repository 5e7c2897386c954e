"""An error budget is fitted only on enough gold rows (issue #45 kind 2, issue #44's floor:
``decision.budget_floor_problem``): below it ``pcd eval --error-budget`` and ``pcd review
--error-budget`` fit no threshold, say why naming the field and the counts, and send every row to
review; never "100 % automatic" from 1-3 gold rows of one class.

Case: cases-round6/error-budget-few-gold-one-class (the script copied unchanged under tests/data,
replayed against this checkout's pcd)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ..helpers import SENTIMENTS, flat, pcd, sentiment_probs, write_sentiment_output

ROOT = Path(__file__).resolve().parents[2]
CASE = Path(__file__).parents[1] / "data" / "cases-round6" / "error-budget-few-gold-one-class.py"


def _one_class(tmp_path, n):
    """An output of 6 rows all written NEGATIVE and a gold file of its first ``n`` rows, all NEGATIVE."""
    rows = [(f"r{i}", 0, sentiment_probs(0, 0.9 - 0.05 * i)) for i in range(6)]
    out = write_sentiment_output(tmp_path / "out.parquet", rows)
    gold = tmp_path / f"gold{n}.jsonl"
    gold.write_text("".join(json.dumps({"id": f"r{i}", "sentiment": SENTIMENTS[0]}) + "\n" for i in range(n)))
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"id": f"r{i}", "text": f"tweet {i}"}) + "\n"
                                               for i in range(6)))
    return out, gold


def test_eval_and_review_below_the_floor_fit_no_threshold_and_send_every_row_to_review(tmp_path):
    out, gold = _one_class(tmp_path, 3)
    text = flat(pcd("eval", out, gold, "--error-budget", "0.05", env={"COLUMNS": "300"}).stdout)
    reason = ("field 'sentiment': only 3 gold rows, all of one class ('NEGATIVE'); too few to fit on (at least 10 "
              "gold rows of each label in play, two labels or more); a 5.0% error budget also needs at least 1/E = "
              "20 rows")
    assert f"warning: {reason}: no threshold is fitted for a 5.0% error budget, every row of this field goes to " \
           "review" in text
    assert "can be decided automatically" not in text
    said = flat(pcd("review", out, tmp_path / "in.jsonl", "--to", "csv", "--error-budget", "0.05", "--gold", gold,
                    "-o", tmp_path / "r.csv", env={"COLUMNS": "300"}).stdout)
    assert f"warning: {reason}: no threshold is fitted, every row of this field goes to review" in said
    assert "error budget 0.05: 0 of 6 rows (0.0%) can be decided automatically; 6 go to review" in said
    assert len((tmp_path / "r.csv").read_text().splitlines()) == 7  # the header and every row


@pytest.mark.full  # five pcd processes on the embedded model (30 s and more); the test above is the same rule in process
def test_case_error_budget_few_gold_one_class_passes_unchanged():
    done = subprocess.run([sys.executable, str(CASE), str(Path(sys.executable).with_name("pcd")), str(ROOT)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("PASS: ") and "1 gold row(s), one class: eval exit 0" in done.stdout
