"""Issue 28, item 7: the first hour tells the truth. ``pcd eval --compare`` of outputs over
different rows compares them on the rows both have; a JSONL input without the text, id or
template key is refused before the model loads (exit 2, as CSV and Parquet); ``pcd calibrate``
says when its calibration makes held-out figures worse (and ``pcd label`` when it is given one);
``pcd label`` and ``pcd eval`` warn, by one rule, when one label takes (nearly) every row.
Hand-made pcd outputs (``output.output_schema``/``results_table``) and the tiny random model;
no real model is loaded."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pcd_cli.backends
from pcd_cli.io.output import output_schema, results_table
from pcd_cli.quality import Calibration, evaluate, fit_calibration, read_gold, read_predictions
from pcd_cli.quality import metrics as M
from pcd_cli.quality.calibration import held_out_worse, worse_calibration_warnings
from pcd_cli.quality.compare import compare
from pcd_cli.results import FieldResult, RecordResult
from pcd_cli.schema.load import load_schema
from pcd_cli.schema.model import schema_metadata

from .helpers import flat, pcd

AIRLINE = "schemas/airline_sentiment.yaml"
TWEETS = "sample_data/airline_tweets.jsonl"
LABELS = ("NEGATIVE", "NEUTRAL", "POSITIVE")
SCHEMA = load_schema(AIRLINE)


@pytest.fixture(autouse=True)
def fewer_resamples(monkeypatch):
    """Bootstrap intervals with 100 resamples (no figure checked here is an interval)."""
    full = M.bootstrap_interval
    monkeypatch.setattr(M, "bootstrap_interval", lambda *a, **k: full(*a, **(k | {"resamples": 100})))


def _write_output(path, rows: list[tuple[str, int, np.ndarray]], schema=SCHEMA):
    """A pcd output of ``(id, label index, probabilities)`` rows of the one-field schema."""
    results = [RecordResult(id=rid, fields=(FieldResult(label, LABELS[label], float(p[label]), 0.8,
                                                        tuple(map(float, p))),)) for rid, label, p in rows]
    metadata = {"pcd.version": "0.1.0", "pcd.model": "fake-model", "pcd.prompt_head_sha256": "h" * 64,
                "pcd.scoring": "marginal", **schema_metadata(schema)}
    arrow = output_schema(schema, "id", pa.string(), all_probs=True).with_metadata(metadata)
    pq.write_table(results_table(results, schema, arrow), path)
    return path


def _probs(label: int, p: float) -> np.ndarray:
    out = np.full(3, (1 - p) / 2)
    out[label] = p
    return out


# -- pcd eval --compare on outputs of different rows --------------------------------------------------------

def test_compare_of_a_4_row_before_and_a_120_row_after_is_on_the_4_shared_rows(tmp_path):
    """The README tour's showcase: "before" labelled 4 tweets (2 right), "after" all 120 (97 right,
    the 4 shared ones all right): the table is 0.500 -> 1.000 on 4 rows, never 0.500 -> 0.808."""
    rng = np.random.default_rng(0)
    gold = [int(g) for g in rng.integers(0, 3, 120)]
    gold_file = tmp_path / "gold.jsonl"
    gold_file.write_text("".join(json.dumps({"id": f"t{i}", "sentiment": LABELS[g]}) + "\n"
                                 for i, g in enumerate(gold)))
    before_rows = [(f"t{i}", gold[i] if i < 2 else (gold[i] + 1) % 3, _probs(gold[i] if i < 2 else (gold[i] + 1) % 3,
                                                                              0.6)) for i in range(4)]
    wrong = set(range(4, 27))  # 23 wrong of 120: accuracy 97 / 120 = 0.808
    after_rows = [(f"t{i}", (g + 1) % 3 if i in wrong else g, _probs((g + 1) % 3 if i in wrong else g, 0.7))
                  for i, g in enumerate(gold)]
    before = _write_output(tmp_path / "tweets.parquet", before_rows)
    after = _write_output(tmp_path / "tuned.parquet", after_rows)

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


# -- a JSONL input refused before the model loads --------------------------------------------------------------

@pytest.mark.parametrize("option, value, message", [
    ("--text-field", "body", "no key 'body' (the text field) in any of its first 3 JSON objects (keys: id, text, "
                             "sentiment)"),
    ("--id-field", "tweet_id", "no key 'tweet_id' (the id field) in any of its first 3 JSON objects"),
    ("--template", "Tweet: {tweet}", "no key 'tweet' (the template column) in any of its first 3 JSON objects"),
])
def test_jsonl_without_the_text_id_or_template_key_exits_2_before_the_model(tmp_path, option, value, message):
    """A nonexistent --model proves it: the input error (exit 2) comes first; with the right keys
    the same command reaches the model (exit 3)."""
    src = tmp_path / "tweets.jsonl"
    src.write_text("".join(json.dumps({"id": f"a{i}", "text": f"tweet {i}", "sentiment": "NEGATIVE"}) + "\n"
                           for i in range(3)))
    result = pcd("label", src, "-s", AIRLINE, option, value, "--model", tmp_path / "no-such-model",
                 "-o", tmp_path / "o.parquet", code=2)
    assert message in flat(result.stderr)
    assert not (tmp_path / "o.parquet").exists() and not (tmp_path / "o.errors.jsonl").exists()
    pcd("label", src, "-s", AIRLINE, "--id-field", "id", "--model", tmp_path / "no-such-model",
        "-o", tmp_path / "o.parquet", code=3)


def test_jsonl_key_in_a_later_first_row_passes_and_limit_bounds_the_rows_read(tmp_path):
    """A key present in any of the first rows passes (a row without it fails on its own, to the
    errors file); ``--limit 1`` reads one row, so a key only in row 2 is refused."""
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "a", "note": "no text here"}\nnot json\n{"id": "b", "text": "hello"}\n')
    pcd("label", src, "-s", AIRLINE, "--id-field", "id", "--model", tmp_path / "none", "-o", tmp_path / "o.parquet",
        code=3)
    result = pcd("label", src, "-s", AIRLINE, "--id-field", "id", "--limit", "1", "--model", tmp_path / "none",
                 "-o", tmp_path / "o.parquet", code=2)
    assert "no key 'text' (the text field) in its only JSON object (keys: id, note)" in flat(result.stderr)


# -- pcd calibrate that makes held-out figures worse --------------------------------------------------------

def test_held_out_worse_names_the_figures_the_demo_measured():
    cv = {"before": {"accuracy": 0.85, "macro_f1": 0.844, "nll": 0.387, "ece": 0.1},
          "after": {"accuracy": 0.85, "macro_f1": 0.802, "nll": 0.464, "ece": 0.08}}
    assert held_out_worse(cv) == ["NLL 0.387 -> 0.464", "macro-F1 0.844 -> 0.802"]
    better = {"before": cv["after"], "after": cv["before"] | {"macro_f1": 0.85, "nll": 0.3}}
    assert held_out_worse(better) == []
    assert held_out_worse({"before": {"nll": 0.4}, "after": {"nll": 0.403}}) == []  # within 1 %: noise


def _calibrated_gold(tmp_path, n: int, seed: int, sharpen: float = 1.0):
    """``n`` rows whose gold is drawn from probabilities ``p``; the output holds ``p`` (already
    calibrated) or, with ``sharpen`` > 1, ``p ** sharpen`` renormalised (over-confident)."""
    rng = np.random.default_rng(seed)
    rows, golds = [], []
    for i in range(n):
        p = rng.dirichlet(np.ones(3) * 0.7)
        written = p ** sharpen / np.sum(p ** sharpen)
        rows.append((f"r{i}", int(p.argmax()), written))
        golds.append({"id": f"r{i}", "sentiment": LABELS[int(rng.choice(3, p=p))]})
    gold = tmp_path / "gold.jsonl"
    gold.write_text("".join(json.dumps(g) + "\n" for g in golds))
    return _write_output(tmp_path / "preds.parquet", rows), gold


def test_calibrate_that_worsens_the_held_out_nll_warns_and_says_what_to_do(tmp_path):
    preds, gold = _calibrated_gold(tmp_path, 15, seed=3)
    frame, metadata = read_predictions(preds)
    calibration, report = fit_calibration(frame, read_gold(gold), SCHEMA, metadata, folds=5)
    f = report.fields[0]
    assert f.after.nll > f.before.nll * 1.01  # the fit on 12 rows learns their noise
    result = pcd("calibrate", gold, "-s", AIRLINE, "--predictions", preds, "-o", tmp_path / "c.json",
                 env={"COLUMNS": "200"}, code=None)
    assert result.exit_code == 0, result.output
    text = flat(result.stdout)
    assert (f"warning: field 'sentiment': this calibration makes it worse on gold rows its fit did not see "
            f"(NLL {f.before.nll:.3f} -> {f.after.nll:.3f}") in text
    assert "label without it (the raw probabilities scored better), or fit it again on more gold rows" in text
    assert (tmp_path / "c.json").exists()  # still written: the user decides
    lines = worse_calibration_warnings(Calibration.load(tmp_path / "c.json"), "--calibration")  # pcd label's
    assert len(lines) == 1 and lines[0].startswith("field 'sentiment': --calibration makes it worse on gold rows "
                                                   f"its fit did not see (NLL {f.before.nll:.3f} -> ")


def test_calibrate_that_fixes_over_confident_probabilities_does_not_warn(tmp_path):
    preds, gold = _calibrated_gold(tmp_path, 300, seed=1, sharpen=3.0)
    frame, metadata = read_predictions(preds)
    calibration, report = fit_calibration(frame, read_gold(gold), SCHEMA, metadata, folds=5)
    f = report.fields[0]
    assert f.after.nll < 0.9 * f.before.nll and calibration.fields["sentiment"].temperature > 2
    assert worse_calibration_warnings(calibration) == []


# -- one label on (nearly) every row: one rule for pcd label and pcd eval ----------------------------------

def test_one_label_rule():
    assert M.one_label({"NEGATIVE": 20}, 3) == ("NEGATIVE", 20, 20)
    assert M.one_label({"NEGATIVE": 19, "NEUTRAL": 1}, 3) == ("NEGATIVE", 19, 20)  # 95 %
    assert M.one_label({"NEGATIVE": 18, "NEUTRAL": 2}, 3) is None  # 90 %
    assert M.one_label({"NEGATIVE": 9}, 3) is None  # too few rows to tell
    assert M.one_label({"false": 50}, 2) is None  # a yes/no field answered "no": often the truth


def test_eval_warns_by_the_same_rule(tmp_path):
    gold = tmp_path / "gold.jsonl"
    gold.write_text("".join(json.dumps({"id": f"t{i}", "sentiment": LABELS[i % 3]}) + "\n" for i in range(20)))
    preds = _write_output(tmp_path / "p.parquet", [(f"t{i}", 0 if i else 1, _probs(0 if i else 1, 0.9))
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


# -- plots: named, and never overwritten by another evaluation -------------------------------------------

def test_evals_into_one_plot_folder_never_overwrite_each_other(tmp_path):
    """make demo's evals: the zero-shot and the tuned output against the same gold, then the tuned
    one against the review export: three diagrams, each named after its two files and said."""
    gold = tmp_path / "airline_tweets.jsonl"
    gold.write_text("".join(json.dumps({"id": f"t{i}", "sentiment": LABELS[i % 3]}) + "\n" for i in range(12)))
    export = tmp_path / "airline.review.export.jsonl"
    export.write_text("".join(json.dumps({"id": f"t{i}", "sentiment": LABELS[i % 3]}) + "\n" for i in range(6)))
    zero = _write_output(tmp_path / "airline.zero.parquet", [(f"t{i}", 0, _probs(0, 0.6)) for i in range(12)])
    tuned = _write_output(tmp_path / "airline.tuned.parquet", [(f"t{i}", i % 3, _probs(i % 3, 0.8)) for i in range(12)])
    plots = tmp_path / "plots"
    said = [flat(pcd("eval", out, g, "--plot", plots, env={"COLUMNS": "200"}).stdout)
            for out, g in ((zero, gold), (tuned, gold), (tuned, export))]
    names = ["airline.zero.vs.airline_tweets.sentiment.reliability.png",
             "airline.tuned.vs.airline_tweets.sentiment.reliability.png",
             "airline.tuned.vs.airline.review.export.sentiment.reliability.png"]
    assert sorted(p.name for p in plots.iterdir()) == sorted(names)
    for text, name in zip(said, names):
        assert f"wrote 1 reliability diagram to {plots}: {name}" in text


def test_ray_engine_refuses_a_jsonl_without_the_text_key_before_ray_starts(tmp_path):
    """The same preflight for every file of an --engine ray input (a folder here), before Ray."""
    from pcd_cli.engines.ray_engine import label_files
    from pcd_cli.errors import InputError
    from pcd_cli.io.readers import InputSpec

    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.jsonl").write_text('{"id": "a", "text": "fine"}\n')
    (folder / "b.jsonl").write_text('{"id": "b", "message": "the key is another"}\n')
    with pytest.raises(InputError, match=r"b\.jsonl': no key 'text' \(the text field\) in its only JSON object "
                                         r"\(keys: id, message\)"):
        label_files(folder, SCHEMA, InputSpec(id_field="id"), {}, output=tmp_path / "out", errors_path=tmp_path / "e")


def test_pcd_label_with_a_calibration_that_was_worse_held_out_says_so(tiny_chat_backend, tmp_path, monkeypatch):
    """The calibration file keeps its cross-validated figures; pcd label repeats the warning
    before using one whose held-out NLL and macro-F1 got worse (the demo's review loop)."""
    from pcd_cli.api import Labeler
    from pcd_cli.quality.calibration import FieldCalibration

    monkeypatch.setattr(pcd_cli.backends, "load_backend", lambda *a, **k: tiny_chat_backend)
    meta = Labeler(SCHEMA).metadata()
    cv = {"folds": 5, "seed": 0, "n": 40, "before": {"accuracy": 0.85, "macro_f1": 0.844, "ece": 0.1, "nll": 0.387},
          "after": {"accuracy": 0.85, "macro_f1": 0.802, "ece": 0.09, "nll": 0.464}}
    Calibration(pcd_version="0", model=meta["pcd.model"], schema_sha256=meta["pcd.schema_sha256"],
                prompt_head_sha256=meta["pcd.prompt_head_sha256"], scoring=meta["pcd.scoring"],
                fields={"sentiment": FieldCalibration("sentiment", LABELS, 1.5, (0.0, 0.0, 0.0), 40, cv)}
                ).save(tmp_path / "c.json")
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"r{i}", "text": f"tweet number {i}"}) + "\n" for i in range(3)))
    result = pcd("label", src, "-s", AIRLINE, "--id-field", "id", "--calibration", tmp_path / "c.json",
                 "-o", tmp_path / "o.parquet", "--no-progress", env={"COLUMNS": "200"})
    assert "warning: field 'sentiment': --calibration makes it worse on gold rows its fit did not see (NLL 0.387 " \
           "-> 0.464, macro-F1 0.844 -> 0.802; 5-fold cross-validation on 40 rows): label without it" \
           in flat(result.output)
    assert pq.read_table(tmp_path / "o.parquet").num_rows == 3  # used all the same: the user decides


def test_a_calibration_at_the_temperature_bound_is_named_when_used():
    """Temperature 1000 (the zero-shot model's probabilities carry no signal): every row gets the
    label priors. pcd label says so; pcd calibrate has its own line in its table (bound=False)."""
    from pcd_cli.quality.calibration import MAX_TEMPERATURE, FieldCalibration

    cv = {"folds": 5, "before": {"accuracy": 0.3, "macro_f1": 0.2, "nll": 1.3}, "after": {"accuracy": 0.4,
                                                                                       "macro_f1": 0.19, "nll": 1.09}}
    calibration = Calibration("0", "m", "s", "h", "marginal", {
        "sentiment": FieldCalibration("sentiment", LABELS, MAX_TEMPERATURE, (0.4, -0.1, -0.3), 280, cv)})
    lines = worse_calibration_warnings(calibration, "--calibration")
    assert lines == ["field 'sentiment': --calibration has its temperature at the bound (1000): the model's "
                     "probabilities carried no signal on its gold rows, so the labels follow the label priors, not "
                     "the texts; train the model (pcd tune) or pass a larger --model instead"]
    assert worse_calibration_warnings(calibration, bound=False) == []  # NLL better, macro-F1 within 0.01
