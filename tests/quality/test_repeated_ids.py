"""One policy for repeated ids across commands (issue #45 kind 5): ``pcd label`` warned about rows
that repeat an id and ``pcd review`` refused the output it had just written. Now every command
keeps each row, says the same line (``io.values.REPEATED_ID_RULE``), and where rows are matched
by id the n-th repeat of ``ID`` is ``ID (repeat n)``."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from pcd_cli.errors import InputError
from pcd_cli.io.values import REPEATED_ID_RULE, RepeatedIds, occurrence_keys
from pcd_cli.quality import evaluate, read_gold, read_predictions
from pcd_cli.quality.calibration import fit_calibration
from pcd_cli.quality.review import select_for_review

from ..helpers import SENTIMENTS, airline_schema, flat, pcd, write_sentiment_output

ROOT = Path(__file__).resolve().parents[2]
AIRLINE = ROOT / "schemas" / "airline_sentiment.yaml"
IDS = ["a", "b", "a", "c", "a"]
TEXTS = ["great crew, thanks", "lost my bag again", "the flight was fine", "delayed for five hours",
         "no comment"]


def _input(tmp_path: Path, ids=IDS, texts=TEXTS) -> Path:
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": rid, "text": text, "sentiment": SENTIMENTS[i % 3]}) + "\n"
                           for i, (rid, text) in enumerate(zip(ids, texts))))
    return src


def test_the_warning_reads_right_and_names_the_rule():
    one = RepeatedIds()
    for rid in ["x", "y", "x"]:
        one.add(rid)
    assert one.message() == f"1 row repeats an id seen earlier ('x'); {REPEATED_ID_RULE}"
    two = RepeatedIds()
    for rid in IDS:
        two.add(rid)
    assert two.message().startswith("2 rows repeat an id seen earlier ('a'); each is a row of its own")
    assert occurrence_keys(IDS)[0] == ["a", "b", "a (repeat 1)", "c", "a (repeat 2)"]
    with pytest.raises(InputError, match=r"id 'a \(repeat 1\)' names two rows"):
        occurrence_keys(["a", "a (repeat 1)", "a"])


def test_label_review_eval_and_calibrate_keep_repeated_rows_by_order(tmp_path):
    src = _input(tmp_path)
    out = tmp_path / "o.parquet"
    labelled = pcd("label", src, "-s", AIRLINE, "--id-field", "id", "-o", out, env={"COLUMNS": "300"})
    said = "2 rows repeat an id seen earlier ('a'); " + REPEATED_ID_RULE
    assert said in flat(labelled.stderr)
    # review: every row, each with its own text; repeats exported under their key
    sheet = tmp_path / "r.csv"
    reviewed = pcd("review", out, src, "--to", "csv", "-o", sheet, env={"COLUMNS": "300"})
    assert f"predictions, column 'id': {said}" in flat(reviewed.stderr)
    rows = {r["id"]: r["text"] for r in csv.DictReader(sheet.open(encoding="utf-8"))}
    assert rows == {"a": TEXTS[0], "b": TEXTS[1], "a (repeat 1)": TEXTS[2], "c": TEXTS[3], "a (repeat 2)": TEXTS[4]}
    # eval against the input's own labels: all 5 rows matched, each to its own gold
    frame, _ = read_predictions(out)
    report = evaluate(frame, read_gold(src), airline_schema())
    assert report.matched == 5 and report.field("sentiment").n == 5
    assert f"predictions, column 'id': {said}" in report.warnings and f"gold, column 'id': {said}" in report.warnings
    written = frame["sentiment"].tolist()
    assert report.field("sentiment").accuracy == pytest.approx(
        np.mean([w == SENTIMENTS[i % 3] for i, w in enumerate(written)]))
    evaluated = pcd("eval", out, src, env={"COLUMNS": "300"})
    assert said in flat(evaluated.stdout + evaluated.stderr)


def test_calibrate_matches_repeats_by_order_and_says_so(tmp_path):
    rng = np.random.default_rng(0)
    ids = [f"r{i % 20}" for i in range(30)]  # r0..r9 twice
    rows = [(rid, int(rng.integers(3)), rng.dirichlet(np.ones(3))) for rid in ids]
    preds = write_sentiment_output(tmp_path / "p.parquet", rows)
    gold = tmp_path / "gold.jsonl"
    gold.write_text("".join(json.dumps({"id": rid, "sentiment": SENTIMENTS[label]}) + "\n"
                            for rid, label, _ in rows))
    frame, metadata = read_predictions(preds)
    _, report = fit_calibration(frame, read_gold(gold), airline_schema(), metadata, folds=5)
    assert report.matched == 30 and report.fields[0].n == 30
    said = f"10 rows repeat an id seen earlier ('r0', 'r1', 'r2', 'r3', 'r4', ...); {REPEATED_ID_RULE}"
    assert f"predictions, column 'id': {said}" in report.notes and f"gold, column 'id': {said}" in report.notes


def test_review_refuses_repeats_it_cannot_match_by_order(tmp_path):
    src = _input(tmp_path)
    rows = [("a", 0, np.array([0.5, 0.3, 0.2])), ("a", 1, np.array([0.2, 0.6, 0.2]))]  # 'a' on 3 input rows
    preds = write_sentiment_output(tmp_path / "p.parquet", rows)
    with pytest.raises(InputError, match=r"id 'a' is on 2 rows of the output and 3 records of .*in.jsonl"):
        select_for_review(preds, src)
    fine = select_for_review(preds, _input(tmp_path, ids=["a", "b", "a"], texts=TEXTS[:3]))
    assert sorted((r.id, r.text) for r in fine.rows) == [("a", TEXTS[0]), ("a (repeat 1)", TEXTS[2])]
