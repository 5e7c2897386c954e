"""``pcd eval`` and ``pcd calibrate`` end to end, in process (hand-written outputs; one embedded-model run)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pcd_cli.backends
import pcd_cli.backends.torch_backend
from pcd_cli.errors import CalibrationError
from pcd_cli.io.output import output_schema
from pcd_cli.quality import Calibration
from pcd_cli.schema.load import load_schema

from .. import helpers
from ..helpers import SENTIMENTS, flat, sentiment_probs, write_sentiment_output
from .test_quality import LABELS, SCHEMA, hand_gold, hand_predictions, metadata, synthetic

ROOT = Path(__file__).resolve().parents[2]


def pcd(*args, code: int = 0):
    return helpers.pcd(*args, code=code, env={"COLUMNS": "100"})


@pytest.fixture
def no_model(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(pcd_cli.backends, "load_backend", refuse)
    monkeypatch.setattr(pcd_cli.backends.torch_backend, "load_backend", refuse)


def write_predictions(path: Path, df, meta: dict[str, str]) -> Path:
    """A Parquet file shaped exactly like ``pcd label --all-probs`` output (flag without __probs)."""
    arrow = output_schema(SCHEMA, "id", pa.string(), all_probs=True)
    arrow = arrow.remove(arrow.get_field_index("flag__probs")).with_metadata(meta)
    cols = {name: df[name].tolist() for name in arrow.names}
    pq.write_table(pa.Table.from_pydict(cols, schema=arrow), path)
    return path


@pytest.fixture
def hand_files(tmp_path):
    preds = write_predictions(tmp_path / "preds.parquet", hand_predictions(), metadata())
    gold = tmp_path / "gold.jsonl"
    rows = hand_gold().to_dict("records")
    gold.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return preds, gold


def test_eval_tables_json_and_plots(hand_files, tmp_path, no_model):
    preds, gold = hand_files
    result = pcd("eval", preds, gold, "--target-accuracy", "0.8", "--json", tmp_path / "r.json",
                 "--plot", tmp_path / "plots")
    text = flat(result.stdout)
    assert "6 of 8 gold rows matched a prediction (7 predictions; 2 gold rows without prediction, 1 " \
           "predictions without gold)" in text
    # 4 of 6 and 4 of 4 right: Wilson 95 % intervals (hand-computed: centre (p + z²/2n) / (1 + z²/n))
    assert "│ accuracy │ 0.667 [0.300, 0.903] │ 1.000 [0.510, 1.000] │" in text
    assert "[low, high]: 95 % intervals (Wilson for the accuracy; a percentile bootstrap" in text
    assert "│ majority baseline │ 0.500 A │ 0.500 true │" in text
    assert "│ gold null / not a label │ 0 / 0 │ 1 / 1 │" in text
    assert "│ __prob │ 1.000 │ 0.800 │ 0.667 │ 0.7100 │ 83.3% │" in text
    assert "warning: field 'flag': 1 gold values are not labels: 'yes' (1)" in text
    report = json.loads((tmp_path / "r.json").read_text())
    assert set(report) == {"id_field", "id_column", "gold_rows", "prediction_rows", "matched",
                           "gold_rows_with_answer", "matched_with_answer", "agreement",
                           "gold_without_prediction", "predictions_without_gold", "fields", "multi_fields",
                           "fields_without_gold", "metadata", "warnings"}
    assert (report["gold_rows_with_answer"], report["matched_with_answer"], report["agreement"]) == (8, 6, {})
    f = report["fields"]["f"]
    assert f["accuracy"] == pytest.approx(4 / 6) and f["confusion"] == [[2, 1, 0], [1, 1, 0], [0, 0, 1]]
    assert f["by_prob"]["target"] == {"target": 0.8, "threshold": pytest.approx(0.71), "coverage": pytest.approx(5 / 6),
                                      "n": 5, "accuracy": 0.8, "reason": None}
    assert report["metadata"]["pcd.model"] == "fake-model"
    # what a perfectly calibrated model shows on these 6 rows by chance: far above 0 on so few
    floor = f["ece_floor"]
    assert 0.05 < floor[0] < floor[1] <= 1 and f"│ ECE if calibrated (chance) │ {floor[0]:.3f} (95 % <= " \
        f"{floor[1]:.3f}) │" in text
    assert "an ECE under its 95 % bound cannot be told from calibrated on so few rows" in text
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == ["preds.vs.gold.f.reliability.png",
                                                                        "preds.vs.gold.flag.reliability.png"]
    assert (tmp_path / "plots" / "preds.vs.gold.f.reliability.png").read_bytes()[:4] == b"\x89PNG"
    assert "reliability diagrams to " in text and "preds.vs.gold.f.reliability.png, preds.vs.gold.flag" in text
    assert f"scored {preds} against {gold}" in " ".join(text.split())
    assert "field 'f': only 6 rows: the accuracy is somewhere in [0.30, 0.90] (95 %, Wilson)" in " ".join(text.split())


def test_eval_gold_csv_and_parquet_and_schema(hand_files, tmp_path, no_model):
    preds, _ = hand_files
    gold = hand_gold()
    gold["flag"] = gold["flag"].map(lambda v: "" if v is None else str(v))  # CSV: True -> 'True', None -> ''
    gold.to_csv(tmp_path / "gold.csv", index=False)
    assert "missing.yaml" in pcd("eval", preds, tmp_path / "gold.csv", "--schema", tmp_path / "missing.yaml",
                                 code=2).stderr
    pcd("eval", preds, tmp_path / "gold.csv", "--json", tmp_path / "csv.json")
    csv_report = json.loads((tmp_path / "csv.json").read_text())
    assert csv_report["fields"]["flag"]["n"] == 4 and csv_report["fields"]["flag"]["gold_null"] == 1
    gold["flag"] = gold["flag"].astype(str)
    gold["id"] = gold["id"].astype(str)
    gold.to_parquet(tmp_path / "gold.parquet")
    pcd("eval", preds, tmp_path / "gold.parquet", "--json", tmp_path / "pq.json")
    assert json.loads((tmp_path / "pq.json").read_text())["fields"] == csv_report["fields"]


def test_eval_bad_files_exit_2(hand_files, tmp_path, no_model):
    preds, gold = hand_files
    assert "no such gold file" in flat(pcd("eval", preds, tmp_path / "nope.jsonl", code=2).stderr)
    (tmp_path / "bad.jsonl").write_text('{"id": 1, "f": "A"}\n{"id": 2, "f": \n')
    assert "line 2: not valid JSON" in flat(pcd("eval", preds, tmp_path / "bad.jsonl", code=2).stderr)
    assert "not a readable Parquet file" in flat(pcd("eval", gold, gold, code=2).stderr)
    assert "no id column 'key'" in flat(pcd("eval", preds, gold, "--id-field", "key", code=2).stderr)
    assert "--target-accuracy" in flat(pcd("eval", preds, gold, "--target-accuracy", "0", code=2).stderr)


def test_plot_without_matplotlib_exits_3(hand_files, tmp_path, monkeypatch, no_model):
    preds, gold = hand_files
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    result = pcd("eval", preds, gold, "--plot", tmp_path / "plots", code=3)
    assert "--plot needs matplotlib: pip install 'pcd-cli[plot]'" in flat(result.stderr)
    assert not (tmp_path / "plots").exists()


def test_calibrate_from_predictions(tmp_path, no_model):
    n = 300
    probs, gold_idx = synthetic(n, 2.5, np.array([0.8, -0.3, -0.5]))
    from .test_quality import frame

    df = frame(range(n), f_probs=probs, flag=[True] * n, flag_prob=np.full(n, 0.7))
    preds = write_predictions(tmp_path / "p.parquet", df, metadata())
    gold = tmp_path / "gold.jsonl"
    gold.write_text("".join(json.dumps({"id": str(i), "f": LABELS[g]}) + "\n" for i, g in enumerate(gold_idx)))
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"name": "hand", "fields": {
        "f": {"type": "enum", "description": "a field", "labels": list(LABELS)},
        "flag": {"type": "boolean", "description": "a flag"}}}))
    assert load_schema(schema).source_sha256 == SCHEMA.source_sha256
    result = pcd("calibrate", gold, "--schema", schema, "--predictions", preds, "-o", tmp_path / "cal.json",
                 "--folds", "3", "--plot", tmp_path / "plots")
    text = flat(result.stdout)
    calibration = Calibration.load(tmp_path / "cal.json")
    cv = calibration.fields["f"].cv
    assert cv["folds"] == 3 and cv["after"]["ece"] < cv["before"]["ece"]
    assert f"│ ECE (15 bins) │ {cv['before']['ece']:.3f} │ {cv['after']['ece']:.3f} │" in text
    assert f"f: temperature {calibration.fields['f'].temperature:.3f}; biases A " in text
    assert "not calibrated (no gold column): flag" in text
    assert f"wrote {tmp_path / 'cal.json'} (sha256 {calibration.sha256[:12]}...)" in text
    assert [p.name for p in (tmp_path / "plots").iterdir()] == ["cal.f.calibration.png"]
    calibration.check(metadata())
    # predictions made with a calibration: refused, exit 2
    write_predictions(tmp_path / "c.parquet", df, metadata(**{"pcd.calibration_sha256": calibration.sha256}))
    result = pcd("calibrate", gold, "--schema", schema, "--predictions", tmp_path / "c.parquet", "-o",
                 tmp_path / "cal2.json", code=2)
    assert "made with a calibration already" in flat(result.stderr)
    result = pcd("calibrate", gold, "--schema", schema, "--predictions", preds, "-o", tmp_path / "cal2.json",
                 "--examples", gold, code=2)
    assert "--examples and --predictions: the examples act when the gold rows are labelled" in flat(result.stderr)
    result = pcd("calibrate", gold, "--schema", schema, "--predictions", preds, "-o", tmp_path, code=2)
    assert f"-o {str(tmp_path)!r} is a folder" in flat(result.stderr)
    assert not (tmp_path / "cal2.json").exists()


@pytest.mark.parametrize("command,words", [
    ("eval", ["--id-field", "--target-accuracy", "--json", "--plot", "--schema"]),
    ("calibrate", ["--schema", "--output", "--predictions", "--folds", "--seed", "--plot", "--id-field", "--model",
                   "--scoring", "--text-field", "--template"]),
])
def test_help(command, words, no_model):
    result = pcd(command, "--help")
    for word in words:
        assert word in result.stdout, word


def test_calibrate_labels_gold_with_embedded_model(tmp_path, embedded_backend):
    lines = (ROOT / "sample_data" / "airline_tweets.jsonl").read_text().splitlines()[:20]
    gold = tmp_path / "gold.jsonl"
    gold.write_text("\n".join(lines) + "\n")
    schema = ROOT / "schemas" / "airline_sentiment.yaml"
    # few-shot examples drawn from the gold file itself: those rows are left out of the fit
    result = pcd("calibrate", gold, "--schema", schema, "-o", tmp_path / "cal.json", "--folds", "2",
                 "--examples", gold, "--shots", "2")
    calibration = Calibration.load(tmp_path / "cal.json")
    assert calibration.model == "smollm2-135m-instruct"
    assert calibration.schema_sha256 == load_schema(schema).source_sha256
    assert calibration.scoring == "marginal"
    fc = calibration.fields["sentiment"]
    assert fc.n == 18 and fc.labels == ("NEGATIVE", "NEUTRAL", "POSITIVE") and fc.cv["folds"] == 2
    text = flat(result.stdout)
    assert "2 gold rows are a few-shot example in the prompt; left out of the fit" in text
    assert "sentiment (18 rows, 2-fold CV)" in text
    # the head with those examples is the one the calibration is for
    from pcd_cli.api import Labeler
    from pcd_cli.api import build_labeler
    from pcd_cli.job import LabelJob

    parsed = load_schema(schema)
    labeler = build_labeler(parsed, LabelJob(examples=gold, shots=2, seed=0, id_field="id"), backend=embedded_backend)
    calibration.check(labeler.metadata())
    with pytest.raises(CalibrationError, match="fitted on another prompt.*refit"):
        calibration.check(Labeler(parsed, backend=embedded_backend, examples=()).metadata())
    # the notebook path: label_frame -> evaluate, no schema needed (labels from the frame's metadata)
    from pcd_cli.quality import evaluate, read_gold

    gold_frame = read_gold(gold)
    frame = labeler.label_frame(gold_frame.head(4), id_field="id")
    report = evaluate(frame, gold_frame)
    (f,) = report.fields
    assert (report.matched, report.gold_without_prediction, f.n) == (4, 16, 4)
    assert f.labels == ("NEGATIVE", "NEUTRAL", "POSITIVE") and f.brier_form == "multiclass"
    assert f.accuracy == pytest.approx(np.mean(frame["sentiment"].to_numpy() == gold_frame["sentiment"].head(4)
                                               .to_numpy()))


# -- plots named after their two files, never overwritten; from issue 28 item 7, "the first hour
# tells the truth" (formerly tests/test_first_hour.py)
@pytest.mark.usefixtures("fewer_resamples")
def test_evals_into_one_plot_folder_never_overwrite_each_other(tmp_path):
    """make demo's evals: the zero-shot and the tuned output against the same gold, then the tuned
    one against the review export: three diagrams, each named after its two files and said."""
    gold = tmp_path / "airline_tweets.jsonl"
    gold.write_text("".join(json.dumps({"id": f"t{i}", "sentiment": SENTIMENTS[i % 3]}) + "\n" for i in range(12)))
    export = tmp_path / "airline.review.export.jsonl"
    export.write_text("".join(json.dumps({"id": f"t{i}", "sentiment": SENTIMENTS[i % 3]}) + "\n" for i in range(6)))
    zero = write_sentiment_output(tmp_path / "airline.zero.parquet", [(f"t{i}", 0, sentiment_probs(0, 0.6)) for i in range(12)])
    tuned = write_sentiment_output(tmp_path / "airline.tuned.parquet", [(f"t{i}", i % 3, sentiment_probs(i % 3, 0.8)) for i in range(12)])
    plots = tmp_path / "plots"
    said = [flat(helpers.pcd("eval", out, g, "--plot", plots, env={"COLUMNS": "200"}).stdout)
            for out, g in ((zero, gold), (tuned, gold), (tuned, export))]
    names = ["airline.zero.vs.airline_tweets.sentiment.reliability.png",
             "airline.tuned.vs.airline_tweets.sentiment.reliability.png",
             "airline.tuned.vs.airline.review.export.sentiment.reliability.png"]
    assert sorted(p.name for p in plots.iterdir()) == sorted(names)
    for text, name in zip(said, names):
        assert f"wrote 1 reliability diagram to {plots}: {name}" in text


def test_error_budget_gives_the_share_decided_automatically_and_its_threshold(tmp_path):
    """``pcd eval --error-budget E`` (issue #35 item 6): the largest share of rows whose label is
    kept above one probability threshold with at most E error on the gold rows."""
    from ..helpers import SENTIMENTS, sentiment_probs, write_sentiment_output

    # 20 rows (10 gold NEGATIVE, 10 NEUTRAL: the floor of decision.budget_floor_problem), ranked by
    # probability: the top 12 are right, then a wrong one, then 7 more right
    probs = [0.95 - 0.02 * i for i in range(20)]
    rows, gold = [], []
    for i, p in enumerate(probs):
        label = 0 if i == 12 else (i + (i > 12)) % 2  # row 12: NEGATIVE written, NEUTRAL the gold
        rows.append((f"r{i}", label, sentiment_probs(label, p)))
        gold.append({"id": f"r{i}", "sentiment": SENTIMENTS[1 if i == 12 else label]})
    out = write_sentiment_output(tmp_path / "out.parquet", rows)
    (tmp_path / "gold.jsonl").write_text("".join(json.dumps(g) + "\n" for g in gold))
    report = tmp_path / "report.json"
    result = pcd("eval", out, tmp_path / "gold.jsonl", "--error-budget", "0.1", "--json", report)
    # at most 10 % error: all 20 rows (19 right, 1 wrong: 5.0 %); at 0 %: the top 12 only
    text = flat(result.stdout)
    assert "100.0% of rows (20) can be decided automatically with an error of at most 10.0%" in text
    assert "__prob >= 0.5700" in text
    target = json.loads(report.read_text())["fields"]["sentiment"]["by_prob"]["target"]
    assert target["threshold"] == pytest.approx(0.57, abs=1e-6) and target["coverage"] == 1.0
    strict = flat(pcd("eval", out, tmp_path / "gold.jsonl", "--error-budget", "0").stdout)
    assert "60.0% of rows (12) can be decided automatically with an error of at most 0.0%" in strict
    assert "__prob >= 0.7300" in strict
    # 5 %: 20 rows are enough (1/E); 4 %: they are not, and no threshold is fitted
    few = flat(pcd("eval", out, tmp_path / "gold.jsonl", "--error-budget", "0.04").stdout)
    assert "warning: field 'sentiment': only 20 gold rows, too few to show a 4.0% error rate (at least 1/E = 25 " \
           "rows): no threshold is fitted for a 4.0% error budget, every row of this field goes to review" in few
    assert "can be decided automatically" not in few
    both = pcd("eval", out, tmp_path / "gold.jsonl", "--error-budget", "0.1", "--target-accuracy", "0.9", code=2)
    assert "not both" in flat(both.output)
