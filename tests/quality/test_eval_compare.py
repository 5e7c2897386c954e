"""``pcd eval --compare``: outputs over different rows are compared on the gold rows both have, and
the table says so (the README tour's 4-row before and 120-row after).

From issue 28 item 7, "the first hour tells the truth" (formerly tests/test_first_hour.py);
hand-made pcd outputs, no model.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from pcd_cli.quality import evaluate, read_gold, read_predictions
from pcd_cli.quality.compare import compare

from ..helpers import SENTIMENTS, flat, pcd, sentiment_probs, write_sentiment_output

pytestmark = pytest.mark.usefixtures("fewer_resamples")  # no figure checked here is an interval


def test_compare_of_a_4_row_before_and_a_120_row_after_is_on_the_4_shared_rows(tmp_path):
    """The README tour's showcase: "before" labelled 4 tweets (2 right), "after" all 120 (97 right,
    the 4 shared ones all right): the table is 0.500 -> 1.000 on 4 rows, never 0.500 -> 0.808."""
    rng = np.random.default_rng(0)
    gold = [int(g) for g in rng.integers(0, 3, 120)]
    gold_file = tmp_path / "gold.jsonl"
    gold_file.write_text("".join(json.dumps({"id": f"t{i}", "sentiment": SENTIMENTS[g]}) + "\n"
                                 for i, g in enumerate(gold)))
    before_rows = [(f"t{i}", gold[i] if i < 2 else (gold[i] + 1) % 3, sentiment_probs(gold[i] if i < 2 else (gold[i] + 1) % 3,
                                                                              0.6)) for i in range(4)]
    wrong = set(range(4, 27))  # 23 wrong of 120: accuracy 97 / 120 = 0.808
    after_rows = [(f"t{i}", (g + 1) % 3 if i in wrong else g, sentiment_probs((g + 1) % 3 if i in wrong else g, 0.7))
                  for i, g in enumerate(gold)]
    before = write_sentiment_output(tmp_path / "tweets.parquet", before_rows)
    after = write_sentiment_output(tmp_path / "tuned.parquet", after_rows)

    after_frame, _ = read_predictions(after)
    before_frame, _ = read_predictions(before)
    gold_frame = read_gold(gold_file)
    report = evaluate(after_frame, gold_frame)
    assert report.fields[0].accuracy == pytest.approx(97 / 120)
    got = compare(before_frame, report, after_frame, gold_frame)
    assert (got.rows, got.before_matched, got.after_matched, got.same_rows) == (4, 4, 120, False)
    assert got.before.fields[0].n == got.after.fields[0].n == 4
    assert got.before.fields[0].accuracy == 0.5 and got.after.fields[0].accuracy == 1.0

    result = pcd("eval", after, gold_file, "--compare", before, env={"COLUMNS": "200"})
    text = flat(result.stdout)
    assert "tweets.parquet -> tuned.parquet (only the 4 gold rows both have)" in text
    assert "warning: tweets.parquet has a prediction for 4 gold rows, tuned.parquet for 120: both are compared " \
           "on the 4 gold rows both have" in text
    assert "│ sentiment │ 4 │ 0.500 -> 1.000 │" in text
    assert "0.808" in text and "0.500 -> 0.808" not in text  # the 120-row figure only in the eval above
    assert "2 / 0 rows right only before / only after" not in text and "0 / 2 rows right only before" in text

    same = pcd("eval", after, gold_file, "--compare", after, env={"COLUMNS": "200"})
    assert "tuned.parquet -> tuned.parquet (the same 120 gold rows)" in flat(same.stdout)
    assert "warning: tuned.parquet has a prediction" not in flat(same.stdout)
