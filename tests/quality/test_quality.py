"""Metrics (hand-computed cases and scikit-learn to 1e-9), gold handling, and calibration."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from sklearn import metrics as skm

from pcd_cli.errors import CalibrationError, InputError
from pcd_cli.quality import Calibration, FieldCalibration, evaluate, fit_calibration
from pcd_cli.quality import metrics as M
from pcd_cli.quality.calibration import fit_temperature_biases, softmax
from pcd_cli.schema.load import parse_schema

LABELS = ("A", "B", "C")
SCHEMA = parse_schema({"name": "hand", "fields": {
    "f": {"type": "enum", "description": "a field", "labels": list(LABELS)},
    "flag": {"type": "boolean", "description": "a flag"}}})

# The hand case: 6 rows, 3 labels. correct = [1, 0, 1, 1, 0, 1].
GOLD = np.array([0, 0, 1, 2, 1, 0])
PRED = np.array([0, 1, 1, 2, 0, 0])
CONF = np.array([0.91, 0.82, 0.83, 0.71, 0.55, 0.95])
CORRECT = (GOLD == PRED).astype(float)


def metadata(schema=SCHEMA, **extra) -> dict[str, str]:
    return {"pcd.version": "0.1.0", "pcd.model": "fake-model", "pcd.schema_sha256": schema.source_sha256,
            "pcd.prompt_head_sha256": "h" * 64, "pcd.scoring": "marginal",
            "pcd.schema_json": json.dumps({f.name: list(f.labels) for f in schema.fields})} | extra


def frame(ids, f=None, f_probs=None, flag=None, flag_prob=None, *, mass=None, attrs=True) -> pd.DataFrame:
    """A predictions frame shaped like a pcd output read with pandas."""
    n = len(ids)
    data = {"id": [str(i) for i in ids]}
    if f_probs is not None:
        f_probs = np.asarray(f_probs, dtype=float)
        data["f"] = [LABELS[j] for j in f_probs.argmax(1)] if f is None else f
        data["f__prob"] = f_probs.max(1)
        data["f__mass"] = np.full(n, 0.9) if mass is None else mass
        data["f__probs"] = [list(zip(LABELS, row)) for row in f_probs]
    if flag is not None:
        data["flag"] = flag
        data["flag__prob"] = flag_prob
        data["flag__mass"] = np.full(n, 0.8)
    df = pd.DataFrame(data)
    df["__truncated"] = False
    if attrs:
        df.attrs["metadata"] = metadata()
    return df


# -- metrics: the hand case ----------------------------------------------------------------------

def test_hand_case_classification():
    scores = M.label_scores(GOLD, PRED, LABELS)
    assert [(s.precision, s.recall, s.f1, s.support, s.predicted) for s in scores] == [
        pytest.approx((2 / 3, 2 / 3, 2 / 3, 3, 3)), pytest.approx((0.5, 0.5, 0.5, 2, 2)), (1.0, 1.0, 1.0, 1, 1)]
    assert M.macro_f1(scores) == pytest.approx(13 / 18, abs=1e-12)
    assert M.accuracy(GOLD, PRED) == pytest.approx(4 / 6)
    assert M.confusion_matrix(GOLD, PRED, 3).tolist() == [[2, 1, 0], [1, 1, 0], [0, 0, 1]]
    assert M.majority(GOLD, 3) == (0, 0.5)


def test_hand_case_calibration_metrics():
    # bins ((m-1)/15, m/15]: 0.82 and 0.83 share bin 12 (acc 0.5, conf 0.825); the others are alone
    assert M.ece(CONF, CORRECT) == pytest.approx((2 * 0.325 + 0.09 + 0.29 + 0.55 + 0.05) / 6, abs=1e-12)
    bins = M.reliability_bins(CONF, CORRECT)
    assert [(i, b.count) for i, b in enumerate(bins) if b.count] == [(8, 1), (10, 1), (12, 2), (13, 1), (14, 1)]
    assert bins[12].accuracy == 0.5 and bins[12].confidence == pytest.approx(0.825)
    assert M.brier_top_label(CONF, CORRECT) == pytest.approx(1.0985 / 6, abs=1e-12)
    assert M.auroc(CONF, CORRECT.astype(bool)) == pytest.approx(7 / 8)  # 7 of 8 (correct, wrong) pairs ordered
    probs = np.array([[0.7, 0.2, 0.1], [0.3, 0.3, 0.4]])
    assert M.brier_multiclass(probs, np.array([0, 1])) == pytest.approx(0.44, abs=1e-12)
    assert M.nll(probs, np.array([0, 1])) == pytest.approx((-math.log(0.7) - math.log(0.3)) / 2, abs=1e-12)
    assert M.nll(np.array([[1.0, 0.0]]), np.array([1])) == pytest.approx(-math.log(1e-12))  # floored


def test_hand_case_selective():
    assert [M.selective_accuracy(CONF, CORRECT, c).accuracy for c in (0.5, 0.8, 1.0)] == \
        pytest.approx([1.0, 0.8, 4 / 6])
    assert [M.selective_accuracy(CONF, CORRECT, c).n for c in (0.5, 0.8, 1.0)] == [3, 5, 6]
    target = M.threshold_for_accuracy(CONF, CORRECT, 0.8)
    assert (target.threshold, target.coverage, target.n, target.accuracy) == (0.71, pytest.approx(5 / 6), 5, 0.8)
    assert M.threshold_for_accuracy(CONF, CORRECT, 1.0).threshold == 0.83
    none = M.threshold_for_accuracy(np.array([0.9, 0.8]), np.array([0.0, 1.0]), 0.9)
    assert (none.threshold, none.coverage, none.n, none.accuracy) == (None, 0.0, 0, None)


def test_selective_ties_are_shared():
    # keep 2 of 4; three rows tie at 0.5 for the last place, one of them correct: 1 + 1/3 hits of 2
    point = M.selective_accuracy(np.array([0.9, 0.5, 0.5, 0.5]), np.array([1.0, 1.0, 0.0, 0.0]), 0.5)
    assert (point.n, point.accuracy) == (2, pytest.approx(2 / 3))
    # a threshold keeps a whole run of equal scores
    target = M.threshold_for_accuracy(np.array([0.9, 0.5, 0.5, 0.5]), np.array([1.0, 1.0, 0.0, 0.0]), 0.5)
    assert (target.threshold, target.n, target.accuracy) == (0.5, 4, 0.5)


def test_edge_cases_one_class_all_correct_empty():
    conf = np.array([0.6, 0.7, 0.95])
    ones = np.ones(3)
    assert M.auroc(conf, ones.astype(bool)) is None
    assert M.auroc(conf, np.zeros(3, dtype=bool)) is None
    assert M.ece(conf, ones) == pytest.approx(np.mean(1 - conf))  # all correct: ECE = mean under-confidence
    assert M.ece(np.ones(4), np.ones(4)) == 0.0
    assert M.ece(np.zeros(2), np.zeros(2)) == 0.0  # probability 0 lands in the first bin
    assert M.reliability_bins(np.zeros(1), np.zeros(1))[0].count == 1
    empty = np.zeros(0)
    assert M.ece(empty, empty) is None and M.accuracy(empty, empty) is None and M.auroc(empty, empty) is None
    assert M.selective_accuracy(empty, empty, 0.5).accuracy is None
    one_label = M.label_scores(np.zeros(3, dtype=int), np.zeros(3, dtype=int), LABELS)
    assert M.macro_f1(one_label) == 1.0  # labels nobody used are left out of the mean


# -- metrics against scikit-learn on random data ---------------------------------------------------

@pytest.mark.parametrize("seed,k", [(0, 2), (1, 3), (2, 5)])
def test_against_sklearn(seed, k):
    rng = np.random.default_rng(seed)
    n = 400
    probs = rng.dirichlet(np.ones(k) * 0.7, size=n)
    gold = rng.integers(0, k, n)
    pred = probs.argmax(1)
    noise = rng.random(n) < 0.2
    pred[noise] = rng.integers(0, k, int(noise.sum()))  # some labels off the argmax
    conf = np.round(probs[np.arange(n), pred], 2)  # rounded: ties for AUROC
    correct = gold == pred
    labels = tuple(f"L{j}" for j in range(k))
    scores = M.label_scores(gold, pred, labels)
    p, r, f1, support = skm.precision_recall_fscore_support(gold, pred, labels=list(range(k)), zero_division=0)
    assert np.allclose([s.precision for s in scores], p, atol=1e-9, rtol=0)
    assert np.allclose([s.recall for s in scores], r, atol=1e-9, rtol=0)
    assert np.allclose([s.f1 for s in scores], f1, atol=1e-9, rtol=0)
    assert [s.support for s in scores] == support.tolist()
    assert M.macro_f1(scores) == pytest.approx(skm.f1_score(gold, pred, average="macro", zero_division=0), abs=1e-9)
    assert M.accuracy(gold, pred) == pytest.approx(skm.accuracy_score(gold, pred), abs=1e-9)
    assert M.confusion_matrix(gold, pred, k).tolist() == skm.confusion_matrix(gold, pred, labels=list(range(k))).tolist()
    assert M.nll(probs, gold) == pytest.approx(skm.log_loss(gold, probs, labels=list(range(k))), abs=1e-9)
    assert M.brier_multiclass(probs, gold) == pytest.approx(
        skm.brier_score_loss(gold, probs, labels=list(range(k)), scale_by_half=False), abs=1e-9)
    assert M.brier_top_label(conf, correct.astype(float)) == pytest.approx(
        skm.brier_score_loss(correct, conf), abs=1e-9)
    assert M.auroc(conf, correct) == pytest.approx(skm.roc_auc_score(correct, conf), abs=1e-9)
    assert M.ece(conf, correct.astype(float)) == pytest.approx(ece_reference(conf, correct), abs=1e-9)


def ece_reference(conf, correct, bins=15):
    """Guo et al. (2017) eq. 3, written as a plain loop over rows."""
    total = 0.0
    for m in range(1, bins + 1):
        rows = [i for i, c in enumerate(conf) if (m - 1) / bins < c <= m / bins or (m == 1 and c == 0)]
        if rows:
            total += len(rows) / len(conf) * abs(np.mean(correct[rows]) - np.mean(conf[rows]))
    return total


# -- evaluate: matching, gold values, counts -------------------------------------------------------

def hand_predictions():
    probs = np.array([[0.91, 0.05, 0.04], [0.10, 0.82, 0.08], [0.10, 0.83, 0.07], [0.2, 0.09, 0.71],
                      [0.55, 0.25, 0.20], [0.95, 0.03, 0.02], [0.5, 0.3, 0.2]])
    flags = [True, False, True, True, False, False, True]
    return frame(range(7), f_probs=probs, flag=flags, flag_prob=[0.6, 0.7, 0.9, 0.8, 0.55, 0.65, 0.99])


def hand_gold():
    return pd.DataFrame({
        "id": [0, 1, 2, 3, 4, 5, 42, "x"],  # ids match as strings; 6 has no gold; 42 and x no prediction
        "f": ["A", "A", "B", "C", "B", "A", "A", "B"],
        "flag": [True, "false", "TRUE", "yes", None, "False", True, False],
        "text": ["..."] * 8})


def test_evaluate_hand_case():
    report = evaluate(hand_predictions(), hand_gold(), SCHEMA, target_accuracy=0.8)
    assert (report.gold_rows, report.prediction_rows, report.matched) == (8, 7, 6)
    assert (report.gold_without_prediction, report.predictions_without_gold) == (2, 1)
    f = report.field("f")
    assert (f.n, f.accuracy, f.majority_label, f.majority_accuracy) == (6, pytest.approx(4 / 6), "A", 0.5)
    assert f.macro_f1 == pytest.approx(13 / 18)
    assert f.ece == pytest.approx(1.63 / 6)
    assert f.auroc == pytest.approx(7 / 8)
    assert f.brier_form == "multiclass" and f.nll is not None
    assert f.confusion == ((2, 1, 0), (1, 1, 0), (0, 0, 1))
    assert [p.accuracy for p in f.by_prob.points] == pytest.approx([1.0, 0.8, 4 / 6])
    assert (f.by_prob.target.threshold, f.by_prob.target.coverage) == (pytest.approx(0.71), pytest.approx(5 / 6))
    assert f.by_mass.points[-1].accuracy == pytest.approx(4 / 6)
    flag = report.field("flag")
    # rows 0..5 matched; 'yes' is not a label, None is null: 4 evaluated (gold T, F, T, F; predicted T, F, T, F)
    assert (flag.n, flag.gold_null, flag.gold_invalid, flag.invalid_values) == (4, 1, 1, (("yes", 1),))
    assert flag.accuracy == 1.0 and flag.auroc is None and flag.labels == ("true", "false")
    assert flag.mean_prob == pytest.approx((0.6 + 0.7 + 0.9 + 0.65) / 4)
    assert flag.brier_form == "top_label" and flag.nll is None  # no flag__probs column
    assert any("'yes' (1)" in w for w in report.warnings)
    assert any("2 gold rows have no prediction" in w for w in report.warnings)
    d = report.to_dict()
    json.dumps(d, allow_nan=False)  # strict JSON
    assert d["fields"]["f"]["per_label"]["A"] == {"precision": pytest.approx(2 / 3), "recall": pytest.approx(2 / 3),
                                                  "f1": pytest.approx(2 / 3), "support": 3, "predicted": 3}
    assert d["fields"]["flag"]["invalid_values"] == [{"value": "yes", "count": 1}]
    assert d["fields"]["flag"]["auroc"] is None
    assert len(d["fields"]["f"]["bins"]) == 15


def test_evaluate_reports_mean_mass_and_the_share_below_min_mass():
    preds = frame(range(4), f_probs=[[0.8, 0.1, 0.1], [0.1, 0.8, 0.1], [0.7, 0.2, 0.1], [0.2, 0.2, 0.6]],
                  mass=np.array([0.9, 0.3, 0.45, 0.7]), flag=[True, False, True, False],
                  flag_prob=[0.9, 0.8, 0.7, 0.6])
    gold = pd.DataFrame({"id": ["0", "1", "2", "3"], "f": ["A", "B", "A", "C"], "flag": [True, False, True, True]})
    f = evaluate(preds, gold, SCHEMA).field("f")
    assert f.mean_mass == pytest.approx(0.5875)
    assert (f.min_mass, f.below_min_mass) == (0.5, 0.5)  # 0.3 and 0.45
    f = evaluate(preds, gold, SCHEMA, min_mass=0.4).field("f")
    assert (f.min_mass, f.below_min_mass) == (0.4, 0.25)
    assert f.to_dict()["below_min_mass"] == 0.25


def test_evaluate_without_schema_reads_labels_from_metadata_or_probs():
    with_meta = evaluate(hand_predictions(), hand_gold())
    assert [f.field for f in with_meta.fields] == ["f", "flag"]
    assert with_meta.field("f").labels == LABELS and with_meta.field("flag").labels == ("true", "false")
    bare = hand_predictions()
    bare.attrs.clear()  # no metadata: labels from f__probs, booleans from the column type
    report = evaluate(bare, hand_gold())
    assert report.field("f").labels == LABELS and report.field("f").accuracy == pytest.approx(4 / 6)
    no_probs = bare.drop(columns=["f__probs"])
    with pytest.raises(InputError, match="field 'f': the labels are not recorded"):
        evaluate(no_probs, hand_gold())


def test_evaluate_row_ids_and_errors():
    preds = hand_predictions().rename(columns={"id": "row"})
    assert evaluate(preds, hand_gold(), SCHEMA).matched == 6  # outputs without --id-field: 'row' column
    with pytest.raises(InputError, match="no id column 'key'"):
        evaluate(hand_predictions(), hand_gold(), SCHEMA, id_field="key")
    dup = hand_gold()
    dup.loc[1, "id"] = 0
    repeated = evaluate(hand_predictions(), dup, SCHEMA)  # the second '0' is '0 (repeat 1)': no prediction
    assert "gold, column 'id': 1 row repeats an id seen earlier ('0'); each is a row of its own" in \
        " ".join(repeated.warnings)
    assert repeated.gold_without_prediction == evaluate(hand_predictions(), hand_gold(), SCHEMA).gold_without_prediction + 1
    with pytest.raises(InputError, match=r"no gold id matches a prediction id \(gold ids e.g. 'a0' in column 'id'; "
                       r"prediction ids e.g. '0' in column 'id'\)"):
        evaluate(hand_predictions(), hand_gold().assign(id=[f"a{i}" for i in range(8)]), SCHEMA)
    with pytest.raises(InputError, match="the gold file has no rows"):
        evaluate(hand_predictions(), hand_gold().head(0), SCHEMA)
    with pytest.raises(InputError, match="no field has a gold column"):
        evaluate(hand_predictions(), hand_gold()[["id", "text"]], SCHEMA)
    bad = hand_predictions()
    bad.loc[2, "f"] = "Z"
    with pytest.raises(InputError, match="predictions row 2: field 'f' holds 'Z'"):
        evaluate(bad, hand_gold(), SCHEMA)
    other = parse_schema({"name": "other", "fields": {"g": {"type": "boolean"}}})
    with pytest.raises(InputError, match="no column of schema 'other'"):
        evaluate(hand_predictions(), hand_gold(), other)


def test_enum_gold_must_be_exact_label():
    gold = hand_gold()
    gold["f"] = ["a", "A", "B", 3, "C ", "A", "A", "B"]
    f = evaluate(hand_predictions(), gold, SCHEMA).field("f")
    assert (f.n, f.gold_invalid) == (3, 3)
    assert dict(f.invalid_values) == {"a": 1, "3": 1, "C ": 1}


# -- calibration -----------------------------------------------------------------------------------

def synthetic(n, temperature, biases, seed=0):
    """Raw probabilities and gold labels drawn from softmax(log p / T + b)."""
    rng = np.random.default_rng(seed)
    probs = softmax(rng.normal(0, 2, (n, len(biases))))
    true = softmax(np.log(probs) / temperature + np.asarray(biases))
    gold = (rng.random(n)[:, None] > np.cumsum(true, axis=1)).sum(axis=1)
    return probs, gold


def test_fit_recovers_temperature_and_biases():
    biases = np.array([1.0, -0.4, -0.6])  # sum 0: the penalty picks this representative
    probs, gold = synthetic(100_000, 2.0, biases)
    t, b = fit_temperature_biases(probs, gold)
    assert t == pytest.approx(2.0, rel=0.05)
    assert b == pytest.approx(biases, rel=0.05)
    assert b.sum() == pytest.approx(0.0, abs=1e-6)
    t_sharp, _ = fit_temperature_biases(*synthetic(50_000, 0.5, np.zeros(3), seed=1))
    assert t_sharp == pytest.approx(0.5, rel=0.05)


def test_apply_gives_calibrated_probabilities_and_argmax():
    fc = FieldCalibration("f", LABELS, 2.0, (0.0, 1.0, 0.0), 10, {})
    p = np.array([0.6, 0.3, 0.1])
    expected = np.array([0.6 ** 0.5, 0.3 ** 0.5 * math.e, 0.1 ** 0.5])
    expected /= expected.sum()
    assert fc.apply(p) == pytest.approx(expected, abs=1e-12)
    batch = fc.apply(np.array([p, [0.1, 0.1, 0.8], [1.0, 0.0, 0.0]]))
    assert batch.sum(axis=1) == pytest.approx(np.ones(3))
    assert batch.argmax(axis=1).tolist() == [1, 2, 0]  # the bias moved row 0 from A to B
    assert batch[2, 1] > 0  # a zero is floored at 1e-12 before the log
    with pytest.raises(ValueError, match="k = 3"):
        fc.apply(np.ones(4) / 4)


def calibration_frame(n=300, seed=0):
    probs, gold = synthetic(n, 2.5, np.array([0.8, -0.3, -0.5]), seed=seed)
    preds = frame(range(n), f_probs=probs, flag=[True] * n, flag_prob=np.full(n, 0.7))
    return preds, pd.DataFrame({"id": [str(i) for i in range(n)], "f": [LABELS[g] for g in gold]})


def test_fit_calibration_cross_validated_and_saved(tmp_path):
    preds, gold = calibration_frame()
    calibration, report = fit_calibration(preds, gold, SCHEMA, metadata(), folds=5)
    (r,) = report.fields
    assert (r.field, r.n, r.folds) == ("f", 300, 5)
    assert r.after.ece < r.before.ece and r.after.nll < r.before.nll  # data drawn from the calibrated model
    assert report.fields_without_gold == ("flag",)
    d = report.to_dict()
    assert d["fields"]["f"]["after"] == {"accuracy": r.after.accuracy, "macro_f1": r.after.macro_f1,
                                         "ece": r.after.ece, "nll": r.after.nll}
    assert list(d["fields"]["f"]["biases"]) == list(LABELS) and d["skipped"] == {"f": {"gold_null": 0,
                                                                                        "gold_invalid": 0}}
    fc = calibration.fields["f"]
    assert fc.n == 300 and fc.labels == LABELS and fc.temperature == pytest.approx(r.temperature)
    assert fc.cv["before"]["ece"] == r.before.ece and fc.cv["folds"] == 5
    assert calibration.model == "fake-model" and calibration.sha256 == ""
    saved = calibration.save(tmp_path / "cal.json")
    loaded = Calibration.load(tmp_path / "cal.json")
    assert loaded == saved and len(loaded.sha256) == 64
    assert loaded.fields["f"].biases == fc.biases and loaded.fields["f"].cv == fc.cv
    doc = json.loads((tmp_path / "cal.json").read_text())
    assert set(doc) == {"format", "format_version", "pcd_version", "model", "schema_sha256", "prompt_head_sha256",
                        "scoring", "objective", "fields"} and doc["objective"] == "likelihood"
    assert list(doc["fields"]["f"]["biases"]) == list(LABELS)
    # same folds and seed: the same numbers
    again, _ = fit_calibration(preds, gold, SCHEMA, metadata(), folds=5)
    assert again.fields["f"].cv == fc.cv


def test_check_names_every_key_that_differs():
    preds, gold = calibration_frame(60)
    calibration, _ = fit_calibration(preds, gold, SCHEMA, metadata(), folds=3)
    calibration.check(metadata() | {"pcd.created_utc": "other"})  # only the four keys count
    with pytest.raises(CalibrationError, match=r"pcd.model: calibration has 'fake-model', this run has 'other'") as exc:
        calibration.check(metadata() | {"pcd.model": "other", "pcd.scoring": "exact"})
    assert "pcd.scoring: calibration has 'marginal', this run has 'exact'" in str(exc.value)
    assert "pcd.schema_sha256" not in str(exc.value)
    with pytest.raises(CalibrationError, match=r"pcd.prompt_head_sha256: .* this run has '\(missing\)'"):
        calibration.check({k: v for k, v in metadata().items() if k != "pcd.prompt_head_sha256"})


def test_fit_refuses_unusable_predictions():
    preds, gold = calibration_frame(60)
    with pytest.raises(CalibrationError, match="made with a calibration already") as info:
        fit_calibration(preds, gold, SCHEMA, metadata(**{"pcd.calibration_sha256": "x"}))
    # a tuned folder's pcd-calibration.json is applied without --calibration: the way out is named
    assert "unless given --no-calibration" in str(info.value)
    with pytest.raises(CalibrationError, match="made with a calibration already"):
        fit_calibration(preds.assign(f__raw_prob=0.5), gold, SCHEMA, metadata())
    with pytest.raises(CalibrationError, match="no f__probs column; label with --all-probs"):
        fit_calibration(preds.drop(columns=["f__probs"]), gold, SCHEMA, metadata())
    with pytest.raises(CalibrationError, match="field 'f': 4 rows with gold labels, fewer than --folds 5"):
        fit_calibration(preds, gold.head(4), SCHEMA, metadata())
    with pytest.raises(CalibrationError, match="labelled with another schema than 'hand'"):
        fit_calibration(preds, gold, SCHEMA, metadata(**{"pcd.schema_sha256": "0" * 64}))
    with pytest.raises(CalibrationError, match="lacks pcd.prompt_head_sha256"):
        fit_calibration(preds, gold, SCHEMA, {k: v for k, v in metadata().items() if k != "pcd.prompt_head_sha256"})
    # prior-corrected probabilities: a calibration fitted on them would be applied to raw ones
    with pytest.raises(CalibrationError, match="made with --prior-correction"):
        fit_calibration(preds, gold, SCHEMA, metadata(**{"pcd.prior_correction": '{"f": [0.5, 0.5]}'}))


@pytest.mark.parametrize("content,message", [
    (b"not json", "not JSON"),
    (b"{}", "not a calibration file"),
    (b'{"format": "pcd-calibration", "format_version": 3}', "format_version 3"),
    (b'{"format": "pcd-calibration", "format_version": 1, "pcd_version": "x", "model": "m", "schema_sha256": "s",'
     b' "prompt_head_sha256": "h"}', "key 'scoring' is missing"),
    (b'{"format": "pcd-calibration", "format_version": 1, "pcd_version": "x", "model": "m", "schema_sha256": "s",'
     b' "prompt_head_sha256": "h", "scoring": "marginal", "fields": {"f": {"labels": ["A", "B"], "temperature": 0,'
     b' "biases": {"A": 0, "B": 0}, "n": 3}}}', "field 'f': 'temperature' must be a number > 0"),
    (b'{"format": "pcd-calibration", "format_version": 1, "pcd_version": "x", "model": "m", "schema_sha256": "s",'
     b' "prompt_head_sha256": "h", "scoring": "marginal", "fields": {"f": {"labels": ["A", "B"], "temperature": 1,'
     b' "biases": {"A": 0}, "n": 3}}}', "field 'f': 'biases' must map every label"),
])
def test_load_rejects_bad_files(tmp_path, content, message):
    path = tmp_path / "cal.json"
    path.write_bytes(content)
    with pytest.raises(CalibrationError, match=message):
        Calibration.load(path)
    with pytest.raises(CalibrationError, match="cannot read"):
        Calibration.load(tmp_path / "missing.json")


def test_field_with_only_null_gold_reports_nothing_but_counts():
    gold = hand_gold()
    gold["flag"] = None
    report = evaluate(hand_predictions(), gold, SCHEMA, target_accuracy=0.9)
    flag = report.field("flag")
    assert (flag.n, flag.gold_null, flag.accuracy, flag.ece, flag.auroc, flag.majority_label) == (0, 6, None, None,
                                                                                              None, None)
    assert flag.by_prob.target.threshold is None and flag.by_prob.points[0].accuracy is None
    json.dumps(report.to_dict(), allow_nan=False)


def test_drop_example_rows_by_rendered_text():
    from pcd_cli.io.readers import InputSpec
    from pcd_cli.quality.data import drop_example_rows
    from pcd_cli.schema.model import Example

    gold = pd.DataFrame({"id": ["a", "b", "c"], "subject": ["Hi", "Refund", None], "body": ["x", "y", "z"],
                         "text": ["  one ", "two", "three"]})
    kept, dropped = drop_example_rows(gold, [Example(labels=(0,), text="one"), Example(labels=(1,), text="zzz")],
                                      InputSpec(id_field="id"))
    assert (kept["id"].tolist(), dropped) == (["b", "c"], 1)
    spec = InputSpec(template="{subject}: {body}", id_field="id")
    kept, dropped = drop_example_rows(gold, [Example(labels=(0,), columns=(("subject", "Refund"), ("body", "y")))],
                                      spec)
    assert (kept["id"].tolist(), dropped) == (["a", "c"], 1)  # row c has no subject: no text, kept
    same, none = drop_example_rows(gold, [], spec)
    assert same is gold and none == 0


def test_warns_below_majority_and_without_signal():
    gold = hand_gold()
    gold["f"] = ["B", "A", "A", "A", "C", "B", "A", "B"]  # predicted A, B, B, C, A, A: none right
    report = evaluate(hand_predictions(), gold, SCHEMA)
    f = report.field("f")
    assert (f.accuracy, f.majority_label, f.majority_accuracy) == (0.0, "A", 0.5)
    assert "field 'f': accuracy 0.000 is below the majority-class baseline 0.500 (always 'A'); see pcd calibrate" \
        in report.warnings
    assert not any("AUROC" in w for w in report.warnings)  # all wrong: no AUROC
    gold["f"] = ["B", "B", "B", "C", "A", "B", "A", "B"]  # wrong only on the two most probable rows (0.91, 0.95)
    f = evaluate(hand_predictions(), gold, SCHEMA).field("f")
    assert (f.auroc, f.accuracy, f.majority_accuracy) == (0.0, pytest.approx(4 / 6), pytest.approx(4 / 6))
    assert any(w.startswith("field 'f': AUROC 0.000: a higher probability is not more often right")
               for w in evaluate(hand_predictions(), gold, SCHEMA).warnings)


# -- honest numbers: intervals and the paired test (issue #18 item 5) -----------------------------------------

def test_wilson_interval_against_hand_computed_values():
    from pcd_cli.quality.metrics import wilson_interval

    # Brown, Cai and DasGupta (2001), and by hand: 4 of 6 -> centre 0.6016, half-width 0.3016
    low, high = wilson_interval(4, 6)
    assert low == pytest.approx(0.29999, abs=1e-4) and high == pytest.approx(0.90323, abs=1e-4)
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(0, 10)[1] == pytest.approx(0.27754, abs=1e-4)
    assert wilson_interval(10, 10)[1] == 1.0
    assert wilson_interval(0, 0) is None


def test_wilson_coverage_on_synthetic_draws():
    from pcd_cli.quality.metrics import wilson_interval

    rng = np.random.default_rng(1)
    hits = [low <= 0.3 <= high for low, high in (wilson_interval(int(k), 50) for k in rng.binomial(50, 0.3, 2000))]
    assert 0.93 <= np.mean(hits) <= 0.97  # 95 % nominal; Wilson stays close at n = 50


def test_mcnemar_exact_and_chi_square():
    from pcd_cli.quality.metrics import mcnemar

    before = np.array([True] * 10 + [False] * 5 + [True] * 1 + [False] * 4)
    after = np.array([True] * 10 + [True] * 5 + [False] * 1 + [False] * 4)
    test = mcnemar(before, after)  # 1 right only before, 5 right only after: exact, 2 * P(X <= 1 | 6, 1/2)
    assert (test.only_before, test.only_after, test.method) == (1, 5, "exact")
    assert test.p_value == pytest.approx(2 * 7 / 64)
    big_b = np.array([True] * 10 + [False] * 30)
    big_a = np.array([False] * 10 + [True] * 30)
    test = mcnemar(big_b, big_a)  # 10 vs 30: chi2 = (|10 - 30| - 1)^2 / 40 = 9.025
    assert test.method == "chi2"
    from scipy.stats import chi2

    assert test.p_value == pytest.approx(chi2.sf(9.025, 1))
    assert mcnemar(big_b, big_b).p_value == 1.0


def test_bootstrap_interval_is_seeded_and_covers_the_statistic():
    from pcd_cli.quality.metrics import accuracy, bootstrap_interval

    rng = np.random.default_rng(0)
    gold = rng.integers(0, 3, 400)
    pred = np.where(rng.random(400) < 0.7, gold, (gold + 1) % 3)
    first = bootstrap_interval(accuracy, (gold, pred))
    assert first == bootstrap_interval(accuracy, (gold, pred))
    assert first[0] < accuracy(gold, pred) < first[1]
    assert 0.06 < first[1] - first[0] < 0.12  # about 2 * 1.96 * sqrt(0.7 * 0.3 / 400) = 0.090


def test_ece_noise_floor_is_the_ece_of_calibrated_draws_and_separates_miscalibration():
    rng = np.random.default_rng(3)
    confidence = rng.uniform(0.4, 1.0, 120)
    mean, upper = M.ece_noise_floor(confidence, resamples=400, seed=5)
    # the vectorised form is the plain ECE of each seeded draw
    draws = (np.random.default_rng(5).random((400, 120)) < confidence[None, :]).astype(np.float64)
    plain = [M.ece(confidence, d) for d in draws]
    assert mean == pytest.approx(np.mean(plain), abs=1e-12)
    assert upper == pytest.approx(np.quantile(plain, 0.95), abs=1e-12)
    assert 0.05 < mean < upper < 0.2  # 120 rows: a calibrated model is rarely within 0.05
    # independent calibrated samples fall under the bound ~95 % of the time
    fresh = np.random.default_rng(11)
    under = [M.ece(confidence, (fresh.random(120) < confidence).astype(np.float64)) <= upper for _ in range(300)]
    assert 0.9 <= np.mean(under) <= 0.99
    # an overconfident model (0.95 sure, right 60 % of the time) is far above it
    sure = np.full(300, 0.95)
    wrong_often = (np.arange(300) % 5 < 3).astype(np.float64)
    assert M.ece(sure, wrong_often) == pytest.approx(0.35) and M.ece_noise_floor(sure)[1] < 0.05
    # the floor falls as 1/sqrt(n): 16x the rows, about a quarter of the ECE
    big = rng.uniform(0.4, 1.0, 1920)
    ratio = M.ece_noise_floor(big)[0] / mean
    assert 0.2 < ratio < 0.35
    assert M.ece_noise_floor(np.zeros(0)) is None


def test_a_holdout_the_model_got_all_right_does_not_sharpen_the_temperature_to_its_bound():
    """Platt's smoothed targets (``(N_c + 1) / (N_c + 2)`` on the gold): without them
    a fit on rows that are all right sharpens without limit (T at 1e-3: a later error costs 27
    nats). The fitted T is the minimum of the smoothed NLL (checked on a grid), the calibrated
    probabilities stay finite, and fit_trusted's own cross-validation calls it worse."""
    from pcd_cli.quality.calibration import MIN_TEMPERATURE, calibrate_logits, fit_trusted, held_out_worse

    probs = np.array([[0.99, 0.01]] * 17 + [[0.02, 0.98]] * 3)
    gold = np.array([0] * 17 + [1] * 3)
    t, _ = fit_temperature_biases(probs, gold, biases=False)
    target = np.where(gold[:, None] == np.arange(2), (np.where(gold == 0, 17, 3) + 1.0)[:, None],
                      1.0) / (np.where(gold == 0, 17, 3) + 2.0)[:, None]  # 18/19 and 4/5 on the gold (k = 2)

    def smoothed_nll(temperature):
        logq = np.log(softmax(calibrate_logits(probs, temperature, np.zeros(2))))
        return -np.mean((target * logq).sum(axis=1))

    grid = np.exp(np.linspace(np.log(0.05), np.log(20), 4001))
    assert t == pytest.approx(grid[np.argmin([smoothed_nll(g) for g in grid])], rel=5e-3)
    assert 1.0 < t < 5 and t > 100 * MIN_TEMPERATURE
    wrong = softmax(calibrate_logits(np.array([[0.99, 0.01]]), t, np.zeros(2)))[0, 1]
    assert -np.log(wrong) < 5  # a test error costs a few nats, not 27
    assert held_out_worse(fit_trusted("f", ("a", "b"), probs, gold).cv)  # pcd tune then writes none
    # three labels: (N_c + 1) / (N_c + 2) on the gold, the rest split between the other two
    probs3 = np.array([[0.97, 0.02, 0.01]] * 6 + [[0.03, 0.95, 0.02]] * 4 + [[0.01, 0.01, 0.98]] * 2)
    gold3 = np.array([0] * 6 + [1] * 4 + [2] * 2)
    n_c = np.bincount(gold3)[gold3].astype(float)
    target3 = np.repeat((1 / (2 * (n_c + 2)))[:, None], 3, axis=1)
    target3[np.arange(12), gold3] = (n_c + 1) / (n_c + 2)
    t3, _ = fit_temperature_biases(probs3, gold3, biases=False)
    nll3 = [-np.mean((target3 * np.log(softmax(calibrate_logits(probs3, g, np.zeros(3))))).sum(axis=1)) for g in grid]
    assert t3 == pytest.approx(grid[np.argmin(nll3)], rel=5e-3) and 1.0 < t3 < 5
