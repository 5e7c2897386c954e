"""Decision rules fitted for the user's objective (issue #44): ``pcd calibrate --objective``.

The threshold of a boolean field is checked against brute force (every cut point between two
distinct probabilities, scored with scikit-learn's metrics); the per-label offsets of an enum
against argmax and against exhaustive one-offset searches; the floor and the refusals by their
messages; the rule is carried by the calibration file and applied by ``FieldCalibration.decide``.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import balanced_accuracy_score, f1_score, precision_score, recall_score

from pcd_cli.errors import CalibrationError, InputError
from pcd_cli.quality.calibration import Calibration, fit_calibration
from pcd_cli.quality.decision import (MIN_GOLD_PER_LABEL, DecisionRule, budget_floor_problem, fit_once, fit_rule,
                                      floor_problem, parse_objective)

from ..helpers import flat
from .test_quality import LABELS, SCHEMA, frame, metadata, synthetic

BOOL = ("true", "false")


def boolean_rows(n=240, seed=1, share=0.15):
    """P(true) that ranks a rare ``true`` well but sits above 0.5 for most rows (SMS's shape)."""
    rng = np.random.default_rng(seed)
    gold = np.where(rng.random(n) < share, 0, 1)
    score = rng.normal(0, 1, n) + (gold == 0) * 1.4
    p = 1 / (1 + np.exp(-(score + 2.0)))
    return np.stack([p, 1 - p], axis=1), gold


def brute_threshold(probs, gold, metric):
    """The best value of ``metric(gold, pred)`` over every cut of P(true) (exhaustive)."""
    p = probs[:, 0]
    values = [metric(gold, np.where(p >= t, 0, 1)) for t in np.concatenate([np.unique(p), [2.0]])]
    return max(values)


SKLEARN = {
    "macro-f1": lambda g, p: f1_score(g, p, average="macro", zero_division=0),
    "balanced-accuracy": lambda g, p: balanced_accuracy_score(g, p),
    "f1:true": lambda g, p: f1_score(g, p, pos_label=0, average="binary", zero_division=0),
}


@pytest.mark.parametrize("objective", list(SKLEARN))
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_threshold_is_the_best_cut_point_that_brute_force_finds(objective, seed):
    probs, gold = boolean_rows(seed=seed)
    rule, ok = fit_once(parse_objective(objective), "is_spam", probs, gold, BOOL)
    assert ok and rule.threshold is not None
    pred = rule.decide(probs)
    best = brute_threshold(probs, gold, SKLEARN[objective])
    assert SKLEARN[objective](gold, pred) == pytest.approx(best, abs=1e-12)
    assert best > SKLEARN[objective](gold, probs.argmax(axis=1)) + 0.05  # argmax is far from it here


def test_a_cost_matrix_rule_has_the_lowest_mean_cost_of_any_cut(tmp_path):
    probs, gold = boolean_rows(seed=4)
    path = tmp_path / "costs.yaml"
    path.write_text("is_spam:\n  true:\n    false: 5\n  false:\n    true: 1\n")  # a missed spam costs 5
    objective = parse_objective(f"cost:{path}")
    assert objective.name == "cost:costs.yaml" and objective.costs == {"is_spam": {"true": {"false": 5.0},
                                                                                    "false": {"true": 1.0}}}
    rule, _ = fit_once(objective, "is_spam", probs, gold, BOOL)
    cost = np.array([[0, 5], [1, 0]])

    def mean_cost(g, p):
        return -cost[g, p].mean()

    assert mean_cost(gold, rule.decide(probs)) == pytest.approx(brute_threshold(probs, gold, mean_cost))


def test_precision_floor_takes_the_highest_recall_that_meets_it_and_refuses_with_the_best_reached():
    probs, gold = boolean_rows(n=400, seed=5)
    p = probs[:, 0]
    feasible = []
    for t in np.unique(p):
        pred = np.where(p >= t, 0, 1)
        if (pred == 0).sum() >= MIN_GOLD_PER_LABEL and precision_score(gold, pred, pos_label=0) >= 0.5:
            feasible.append(recall_score(gold, pred, pos_label=0))
    rule, ok = fit_once(parse_objective("precision:true>=0.5"), "is_spam", probs, gold, BOOL)
    pred = rule.decide(probs)
    assert ok and precision_score(gold, pred, pos_label=0) >= 0.5
    assert recall_score(gold, pred, pos_label=0) == pytest.approx(max(feasible))
    # the best precision of any cut writing 'true' on at least 10 rows, brute force
    best = max(precision_score(gold, np.where(p >= t, 0, 1), pos_label=0) for t in np.unique(p)
               if (p >= t).sum() >= MIN_GOLD_PER_LABEL)
    assert best < 0.99
    parts = np.array_split(np.arange(len(gold)), 5)
    with pytest.raises(CalibrationError) as info:
        fit_rule(parse_objective("precision:true>=0.99"), "is_spam", probs, gold, BOOL, parts)
    message = str(info.value)
    assert f"field 'is_spam': no decision rule reaches precision >= 0.99 for 'true' on its 400 gold rows; the best " \
           f"precision reached is {best:.3f}" in message


def test_recall_floor_takes_the_highest_precision_that_meets_it():
    probs, gold = boolean_rows(n=300, seed=6)
    p = probs[:, 0]
    best = max(precision_score(gold, np.where(p >= t, 0, 1), pos_label=0, zero_division=0) for t in np.unique(p)
               if recall_score(gold, np.where(p >= t, 0, 1), pos_label=0) >= 0.9)
    rule, ok = fit_once(parse_objective("recall:true>=0.9"), "is_spam", probs, gold, BOOL)
    pred = rule.decide(probs)
    assert ok and recall_score(gold, pred, pos_label=0) >= 0.9
    assert precision_score(gold, pred, pos_label=0) == pytest.approx(best)


def test_enum_offsets_beat_argmax_and_every_single_offset_move():
    probs, gold = synthetic(300, 2.5, np.array([1.5, -0.3, -1.2]), seed=2)
    objective = parse_objective("macro-f1")
    rule, _ = fit_once(objective, "f", probs, gold, LABELS)
    assert rule.threshold is None and len(rule.offsets) == 3

    def macro(pred):
        return f1_score(gold, pred, average="macro", zero_division=0)

    got = macro(rule.decide(probs))
    assert got > macro(probs.argmax(axis=1)) + 0.1
    logp = np.log(probs)
    for j in range(3):  # no move of one offset alone does better (coordinate-wise optimum), on a fine grid
        for delta in np.linspace(-4, 4, 161):
            o = np.array(rule.offsets)
            o[j] += delta
            assert macro(np.argmax(logp + o, axis=1)) <= got + 1e-12
    # two labels not spelt true/false: the offsets reach the brute-force best cut
    two = probs[:, :2] / probs[:, :2].sum(axis=1, keepdims=True)
    g2 = np.where(gold == 0, 0, 1)
    rule2, _ = fit_once(objective, "g", two, g2, ("A", "B"))
    best = brute_threshold(two, g2, lambda g, p: f1_score(g, p, average="macro", zero_division=0))
    assert f1_score(g2, rule2.decide(two), average="macro", zero_division=0) == pytest.approx(best)


def test_the_floor_names_the_field_and_the_counts():
    gold = np.array([0] * 12 + [1] * 3 + [2] * 25)
    assert floor_problem("sentiment", gold, ("NEGATIVE", "NEUTRAL", "POSITIVE")) == (
        "field 'sentiment': too few gold rows of 'NEUTRAL' (3) to fit on: at least 10 gold rows of each label in "
        "play (counts: 'NEGATIVE' 12, 'NEUTRAL' 3, 'POSITIVE' 25)")
    assert floor_problem("sentiment", np.array([0, 0, 0]), ("NEGATIVE", "NEUTRAL")) == (
        "field 'sentiment': only 3 gold rows, all of one class ('NEGATIVE'); too few to fit on (at least 10 gold "
        "rows of each label in play, two labels or more)")
    assert floor_problem("s", np.array([0] * 10 + [2] * 10), ("A", "B", "C")) is None  # B is not in play
    assert budget_floor_problem("s", np.array([0] * 10 + [1] * 9), ("A", "B"), 0.05).endswith(
        "a 5.0% error budget also needs at least 1/E = 20 rows")
    assert budget_floor_problem("s", np.array([0] * 10 + [1] * 10), ("A", "B"), 0.01) == (
        "field 's': only 20 gold rows, too few to show a 1.0% error rate (at least 1/E = 100 rows)")
    assert budget_floor_problem("s", np.array([0] * 10 + [1] * 10), ("A", "B"), 0.05) is None


def test_objectives_parse_or_are_refused_naming_the_forms(tmp_path):
    assert parse_objective("precision:spam>=0.9").number == 0.9
    assert parse_objective("recall:a>=b>=0.5").label == "a>=b"
    for bad, words in (("accuracy", "expected likelihood"), ("precision:spam", "expected precision:LABEL>=P"),
                       ("recall:x>=1.5", "the floor must be in (0, 1]"), ("f1:", "expected likelihood"),
                       (f"cost:{tmp_path / 'none.yaml'}", "cannot read")):
        with pytest.raises(InputError, match=words.replace("(", r"\(").replace(")", r"\)")):
            parse_objective(bad)
    (tmp_path / "c.yaml").write_text("f:\n  A:\n    B: -1\n")
    with pytest.raises(InputError, match="field 'f', gold 'A', written 'B': the cost must be a number >= 0"):
        parse_objective(f"cost:{tmp_path / 'c.yaml'}")


def fitted(objective, n=300, seed=0, gold_idx=None, force_rule=False):
    probs, gold_idx0 = synthetic(n, 2.5, np.array([1.5, -0.3, -1.2]), seed=seed)
    gold_idx = gold_idx0 if gold_idx is None else gold_idx
    df = frame(range(n), f_probs=probs, flag=[True] * n, flag_prob=np.full(n, 0.7))
    gold = pd.DataFrame({"id": [str(i) for i in range(n)], "f": [LABELS[g] for g in gold_idx]})
    return fit_calibration(df, gold, SCHEMA, metadata(), folds=5, objective=objective, force_rule=force_rule)


def test_fit_calibration_stores_the_rule_with_held_out_figures_and_the_file_names_the_objective(tmp_path):
    calibration, report = fitted("macro-f1")
    rule = calibration.fields["f"].rule
    assert calibration.objective == "macro-f1" and report.objective == "macro-f1"
    cv = rule.cv
    assert cv["metric"] == "macro-F1" and cv["folds"] == 5 and cv["n"] == 300
    assert cv["rule"]["value"] > cv["argmax"]["value"] + 0.1
    assert cv["rule"]["low"] <= cv["rule"]["value"] <= cv["rule"]["high"]
    saved = calibration.save(tmp_path / "cal.json")
    doc = json.loads((tmp_path / "cal.json").read_text())
    assert doc["objective"] == "macro-f1" and set(doc["fields"]["f"]["rule"]["offsets"]) == set(LABELS)
    loaded = Calibration.load(tmp_path / "cal.json")
    assert loaded.fields["f"].rule == rule and loaded.sha256 == saved.sha256
    probs, _ = synthetic(50, 1.0, np.zeros(3), seed=9)
    fc = loaded.fields["f"]
    assert [fc.decide(fc.apply(p)) for p in probs] == list(rule.decide(fc.apply(probs)))
    assert calibration.rules() == {"f": {"objective": "macro-f1", "offsets": dict(zip(LABELS, rule.offsets))}}
    plain, _ = fitted(None)
    assert plain.objective == "likelihood" and plain.fields["f"].rule is None
    assert json.loads(plain.to_json())["objective"] == "likelihood"


def test_fit_calibration_refuses_below_the_floor_and_an_objective_no_field_has():
    gold = np.array([0] * 280 + [1] * 15 + [2] * 5)
    with pytest.raises(CalibrationError) as info:
        fitted("macro-f1", gold_idx=gold)
    assert flat(str(info.value)) == (
        "--objective macro-f1: field 'f': too few gold rows of 'C' (5) to fit on: at least 10 gold rows of each "
        "label in play (counts: 'A' 280, 'B' 15, 'C' 5); add gold rows or use --objective likelihood")
    with pytest.raises(CalibrationError, match="--objective f1:Z: it applies to no field with gold labels "
                                               r"\(field 'f' has no label 'Z'"):
        fitted("f1:Z")


def test_a_rule_entry_is_checked_when_the_file_is_read():
    with pytest.raises(CalibrationError, match="needs a boolean field"):
        DecisionRule.from_dict({"objective": "macro-f1", "threshold": 0.3}, LABELS, "x")
    with pytest.raises(CalibrationError, match=r"finite 'offsets' for every label \(A, B, C\)"):
        DecisionRule.from_dict({"objective": "macro-f1", "offsets": {"A": 1}}, LABELS, "x")
    rule = DecisionRule.from_dict({"objective": "f1:true", "threshold": 0.8}, BOOL, "x")
    assert list(rule.decide(np.array([[0.81, 0.19], [0.79, 0.21]]))) == [0, 1]


def test_pcd_calibrate_objective_prints_the_rule_beside_argmax_and_refuses_an_unmeetable_precision(tmp_path):
    from .test_quality_cli import pcd, write_predictions

    n = 300
    probs, gold_idx = synthetic(n, 2.5, np.array([1.5, -0.3, -1.2]), seed=0)
    df = frame(range(n), f_probs=probs, flag=[True] * n, flag_prob=np.full(n, 0.7))
    preds = write_predictions(tmp_path / "p.parquet", df, metadata())
    gold = tmp_path / "gold.jsonl"
    gold.write_text("".join(json.dumps({"id": str(i), "f": LABELS[g]}) + "\n" for i, g in enumerate(gold_idx)))
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"name": "hand", "fields": {
        "f": {"type": "enum", "description": "a field", "labels": list(LABELS)},
        "flag": {"type": "boolean", "description": "a flag"}}}))
    result = pcd("calibrate", gold, "--schema", schema, "--predictions", preds, "-o", tmp_path / "cal.json",
                 "--objective", "macro-f1")
    calibration = Calibration.load(tmp_path / "cal.json")
    assert calibration.objective == "macro-f1"
    cv = calibration.fields["f"].rule.cv
    text = flat(result.stdout)
    a, r = cv["argmax"], cv["rule"]
    assert (f"│ macro-F1 │ {a['value']:.3f} [{a['low']:.3f}, {a['high']:.3f}] │ "
            f"{r['value']:.3f} [{r['low']:.3f}, {r['high']:.3f}] │") in text
    assert f"│ accuracy │ {a['accuracy']:.3f} │ {r['accuracy']:.3f} │" in text
    assert "f: rule for macro-f1: log-prob offsets A " in text
    result = pcd("calibrate", gold, "--schema", schema, "--predictions", preds, "-o", tmp_path / "cal2.json",
                 "--objective", "precision:C>=0.95", code=2)
    assert "no decision rule reaches precision >= 0.95 for 'C' on its 300 gold rows; the best precision reached " \
           "is " in flat(result.stderr)
    assert not (tmp_path / "cal2.json").exists()
    result = pcd("calibrate", gold, "--schema", schema, "--predictions", preds, "-o", tmp_path / "cal2.json",
                 "--objective", "accuracy", code=2)
    assert "--objective 'accuracy': expected likelihood" in flat(result.stderr)


def test_pcd_eval_shows_argmax_and_the_rule_side_by_side(tmp_path):
    from .test_quality_cli import pcd, write_predictions

    n = 300
    probs, gold_idx = synthetic(n, 2.5, np.array([1.5, -0.3, -1.2]), seed=3)
    df = frame(range(n), f_probs=probs, flag=[True] * n, flag_prob=np.full(n, 0.7))
    preds = write_predictions(tmp_path / "p.parquet", df, metadata())
    gold = tmp_path / "gold.jsonl"
    gold.write_text("".join(json.dumps({"id": str(i), "f": LABELS[g]}) + "\n" for i, g in enumerate(gold_idx)))
    calibration, _ = fitted("macro-f1", seed=3, force_rule=True)  # its held-out gain's interval holds 0
    assert calibration.fields["f"].rule.cv["forced"] and calibration.fields["f"].rule.cv["gain"]["low"] < 0
    calibration.save(tmp_path / "cal.json")
    result = pcd("eval", preds, gold, "--calibration", tmp_path / "cal.json", "--json", tmp_path / "e.json")
    fc = calibration.fields["f"]
    stored = np.array([[p for _, p in row] for row in df["f__probs"]], dtype=np.float32).astype(np.float64)
    cal = fc.apply(stored / stored.sum(axis=1, keepdims=True))
    argmax_f1 = f1_score(gold_idx, cal.argmax(axis=1), average="macro", zero_division=0)
    rule_f1 = f1_score(gold_idx, fc.rule.decide(cal), average="macro", zero_division=0)
    assert rule_f1 > argmax_f1 + 0.1
    text = flat(result.stdout)
    assert "f: argmax vs the decision rule for macro-f1" in text
    assert f"│ macro-F1 │ {argmax_f1:.3f} [" in text and f"│ {rule_f1:.3f} [" in text
    compared = json.loads((tmp_path / "e.json").read_text())["fields"]["f"]["decision_rule"]
    assert compared["argmax"]["value"] == pytest.approx(argmax_f1, abs=1e-3)
    assert compared["rule"]["value"] == pytest.approx(rule_f1, abs=1e-3)


def test_a_tune_holdout_fits_the_rule_or_says_why_not():
    from pcd_cli.quality.calibration import fit_trusted

    probs, gold = boolean_rows(n=400, seed=7)
    notes = []
    fc = fit_trusted("is_spam", BOOL, probs, gold, objective=parse_objective("macro-f1"), notes=notes)
    assert fc.rule is not None and fc.rule.threshold is not None and notes == []
    assert fc.rule.cv["rule"]["value"] > fc.rule.cv["argmax"]["value"] and fc.rule.cv["gain"]["low"] > 0
    # on 200 rows the gain's interval holds zero: argmax is kept and said, unless the rule is forced
    probs, gold = boolean_rows(n=200, seed=7)
    fc = fit_trusted("is_spam", BOOL, probs, gold, objective=parse_objective("macro-f1"), notes=notes)
    gain = fc.rule.cv["gain"]
    assert fc.rule.kept_argmax and gain["low"] <= 0 < gain["high"] and "threshold" in fc.rule.cv["fitted"]
    assert np.array_equal(fc.rule.decide(probs), probs.argmax(axis=1))
    assert notes == [f"field 'is_spam': the decision rule is no better than argmax on held-out folds (gain in "
                     f"macro-F1 {gain['value']:+.3f}, 95 % interval [{gain['low']:+.3f}, {gain['high']:+.3f}] (5 "
                     "folds, 200 gold rows)): argmax kept; add gold rows, or pass --force-rule to write the rule "
                     "anyway"]
    notes.clear()
    forced = fit_trusted("is_spam", BOOL, probs, gold, objective=parse_objective("macro-f1"), force_rule=True)
    assert forced.rule.threshold == fc.rule.cv["fitted"]["threshold"] and forced.rule.cv["forced"]
    few = np.array([0] * 4 + [1] * 36)
    fc = fit_trusted("is_spam", BOOL, probs[:40], few, objective=parse_objective("macro-f1"), notes=notes)
    assert fc.rule is None and notes == [
        "no decision rule: --objective macro-f1: field 'is_spam': too few gold rows of 'true' (4) to fit on: at least "
        "10 gold rows of each label in play (counts: 'true' 4, 'false' 36); add gold rows or use --objective "
        "likelihood"]


def test_a_label_studio_retrain_fits_the_served_calibrations_objective_again(tmp_path):
    from pcd_cli.job import LabelJob
    from pcd_cli.retrain import served_objective

    calibration, _ = fitted("balanced-accuracy")
    calibration.save(tmp_path / "c.json")
    assert served_objective(LabelJob(calibration=str(tmp_path / "c.json"))) == parse_objective("balanced-accuracy")
    plain, _ = fitted(None)
    plain.save(tmp_path / "p.json")
    assert served_objective(LabelJob(calibration=str(tmp_path / "p.json"))).name == "likelihood"
    assert served_objective(LabelJob()).name == "likelihood"


def test_a_multi_select_option_decided_by_its_rule_is_chosen_as_the_rule_says():
    from types import SimpleNamespace

    from pcd_cli.io.output import chosen_options, option_decisions
    from pcd_cli.results import FieldResult

    field = SimpleNamespace(threshold=0.5, min_items=0, max_items=None)
    options = [FieldResult(1, False, 0.7, 0.9, (0.3, 0.7)),  # no rule: P(yes) 0.3 < the schema's 0.5
               FieldResult(0, True, 0.3, 0.9, (0.3, 0.7), by_rule=True),  # its rule's threshold is below 0.3
               FieldResult(1, False, 0.4, 0.9, (0.6, 0.4), by_rule=True)]  # its rule's threshold is above 0.6
    assert option_decisions(options) == [None, True, False]
    assert chosen_options(field, [r.probs[0] for r in options], option_decisions(options)) == [1]
    assert chosen_options(field, [r.probs[0] for r in options]) == [2]  # without rules: the threshold alone


def test_pcd_eval_of_an_output_labelled_with_a_rule_compares_it_with_argmax(tmp_path):
    from .test_quality_cli import pcd, write_predictions

    n = 200
    probs, gold_idx = synthetic(n, 1.0, np.array([1.5, -0.3, -1.2]), seed=4)
    rule = DecisionRule("macro-f1", LABELS, offsets=(-1.0, 0.4, 0.6))
    written = rule.decide(probs)
    df = frame(range(n), f=[LABELS[j] for j in written], f_probs=probs, flag=[True] * n, flag_prob=np.full(n, 0.7))
    meta = metadata(**{"pcd.calibration_sha256": "c" * 64, "pcd.objective": "macro-f1",
                       "pcd.decision_rules": json.dumps({"f": {"objective": "macro-f1",
                                                               "offsets": dict(zip(LABELS, rule.offsets))}})})
    preds = write_predictions(tmp_path / "p.parquet", df, meta)
    gold = tmp_path / "gold.jsonl"
    gold.write_text("".join(json.dumps({"id": str(i), "f": LABELS[g]}) + "\n" for i, g in enumerate(gold_idx)))
    text = flat(pcd("eval", preds, gold).stdout)
    stored = np.array([[p for _, p in row] for row in df["f__probs"]], dtype=np.float32)
    argmax_f1 = f1_score(gold_idx, stored.argmax(axis=1), average="macro", zero_division=0)
    rule_f1 = f1_score(gold_idx, written, average="macro", zero_division=0)
    assert argmax_f1 != pytest.approx(rule_f1, abs=0.01)
    assert "f: argmax vs the decision rule for macro-f1" in text
    assert f"│ macro-F1 │ {argmax_f1:.3f} [" in text and f"│ {rule_f1:.3f} [" in text


def test_an_objective_naming_a_label_no_field_has_is_refused_before_the_model_loads(monkeypatch, tmp_path):
    """``--objective precision:yes>=0.9`` on a schema whose labels are true/false: exit 2 at once,
    naming the labels there are (it was found only after every gold row had been labelled)."""
    from pathlib import Path

    from typer.testing import CliRunner

    import pcd_cli.fitting
    from pcd_cli.cli import app

    def no_model(*_args, **_kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(pcd_cli.fitting, "build_labeler", no_model)
    root = Path(__file__).resolve().parents[2]
    for objective in ("precision:yes>=0.9", "f1:spam", "recall:True>=0.5"):
        result = CliRunner().invoke(app, ["calibrate", str(root / "sample_data" / "sms_spam.dev.jsonl"), "-s",
                                          str(root / "schemas" / "sms_spam.yaml"), "--objective", objective,
                                          "-o", str(tmp_path / "cal.json")])
        assert result.exit_code == 2, result.output
        label = objective.split(":")[1].split(">=")[0]
        assert f"no field of the schema has the label {label!r} (the labels: true, false)" in " ".join(result.output.split())
    assert not (tmp_path / "cal.json").exists()
