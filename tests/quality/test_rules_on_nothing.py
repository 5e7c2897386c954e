"""Rules that refuse to be fitted on nothing (issue 51 item 4; round-7 cases objective-degenerate-gold
and objective-rule-no-better-than-argmax).

* an objective whose figure is the same whatever label is written (its label has no gold row, a
  cost file that charges each gold label one cost) is refused, naming the field and the label,
  before anything is fitted (and, in ``pcd calibrate``, before the model loads);
* copies of one text are one group in the folds and the bootstrap (``pcd_cli.quality.folds``):
  gold given three times under new ids gives the interval it gives once;
* a rule whose held-out gain over argmax has a 95 % interval holding zero is not used: argmax is
  kept with a note naming the field and the figures, unless ``--force-rule``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from pcd_cli.errors import CalibrationError
from pcd_cli.quality.calibration import check_objective_gold, fit_calibration, rule_fit_warnings
from pcd_cli.quality.decision import constant_problem, parse_objective
from pcd_cli.quality.folds import bootstrap_weights, group_index, grouped_folds, grouped_split
from pcd_cli.results import INPUT_KEY_COLUMN, input_key
from pcd_cli.schema.load import parse_schema

from ..helpers import flat
from .test_quality import LABELS, SCHEMA, frame, metadata, synthetic

ROOT = Path(__file__).resolve().parents[2]
FLAG = parse_schema({"name": "flag", "fields": {"flag": {"type": "boolean", "description": "a flag"}}})


def enum_rows(n=120, seed=0, gold=None):
    """Predictions of field ``f`` (labels A, B, C) and their gold rows; ``gold``: the labels to use."""
    probs, drawn = synthetic(n, 1.0, np.array([0.0, 0.0, 0.0]), seed=seed)
    gold = drawn if gold is None else np.asarray(gold)
    df = frame(range(n), f_probs=probs, flag=[True] * n, flag_prob=np.full(n, 0.7))
    return df, pd.DataFrame({"id": [str(i) for i in range(n)], "f": [LABELS[g] for g in gold]})


# --- 1. an objective whose figure is constant on the gold ---------------------------------------

@pytest.mark.parametrize("objective", ["f1:C", "precision:C>=0.5", "recall:C>=0.5"])
def test_a_label_objective_whose_label_has_no_gold_row_is_refused_naming_the_field_and_the_label(objective):
    df, gold = enum_rows(gold=[0, 1] * 60)  # A and B, 60 each: no C
    with pytest.raises(CalibrationError) as caught:
        fit_calibration(df, gold, SCHEMA, metadata(), objective=objective)
    metric = {"f1": "F1", "precision": "precision", "recall": "recall"}[objective.split(":")[0]]
    assert str(caught.value) == (
        f"--objective {objective}: field 'f': no gold row has the label 'C' (gold counts: 'A' 60, 'B' 60), so its "
        f"{metric} of 'C' is 0.000 whatever label is written: no rule can be chosen for it; add gold rows of 'C' or "
        "choose another objective")
    # the same gold with the label present is fitted (the check is not a refusal of the kind)
    df, gold = enum_rows(gold=[0, 1, 2] * 40)
    calibration, _ = fit_calibration(df, gold, SCHEMA, metadata(), objective=objective.replace("C>=0.5", "C>=0.05"))
    assert calibration.fields["f"].rule is not None


def test_a_cost_file_charging_each_gold_label_one_cost_is_refused_and_one_that_does_not_is_fitted(tmp_path):
    df, gold = enum_rows(gold=[0, 1, 2] * 40)
    flat_costs = tmp_path / "flat.yaml"
    flat_costs.write_text("f:\n  A: {A: 1, B: 1, C: 1}\n  B: {A: 2, B: 2, C: 2}\n  C: {A: 0, B: 0, C: 0}\n")
    with pytest.raises(CalibrationError) as caught:
        fit_calibration(df, gold, SCHEMA, metadata(), objective=f"cost:{flat_costs}")
    assert "field 'f': the mean cost is 1.000 whatever label is written on these 120 gold rows" in str(caught.value)
    moving = tmp_path / "moving.yaml"
    moving.write_text("f:\n  A: {B: 5}\n")
    assert constant_problem(parse_objective(f"cost:{moving}"), "f", gold_index := np.array([0, 1, 2] * 40),
                            LABELS) is None
    assert constant_problem(parse_objective("balanced-accuracy"), "f", gold_index[gold_index < 2], LABELS) is None


def test_a_multi_select_option_without_a_yes_is_refused_before_the_model_loads_and_tune_checks_the_label():
    schema = parse_schema({"name": "m", "fields": {"topics": {"type": "multi", "labels": ["a", "b"]},
                                                  "tone": {"type": "enum", "labels": ["X", "Y", "Z"]}}})
    gold = pd.DataFrame({"id": [str(i) for i in range(40)], "topics": [["a"], []] * 20, "tone": ["X", "Y"] * 20})
    with pytest.raises(CalibrationError) as caught:
        check_objective_gold(gold, schema, parse_objective("macro-f1"))
    assert "field 'topics.b': only 40 gold rows, all of one class ('false')" in str(caught.value)
    with pytest.raises(CalibrationError) as caught:  # pcd tune: no floor (its holdout is a part), the label still
        check_objective_gold(gold, schema, parse_objective("f1:Z"), floor=False)
    assert str(caught.value).startswith("--objective f1:Z: field 'tone': no gold row has the label 'Z' (gold "
                                        "counts: 'X' 20, 'Y' 20)")
    check_objective_gold(gold, schema, parse_objective("f1:X"), floor=False)  # X has gold rows


def test_pcd_calibrate_refuses_a_label_without_gold_rows_before_the_model_loads(monkeypatch, tmp_path):
    import pcd_cli.fitting
    from pcd_cli.cli import app

    def no_model(*_args, **_kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(pcd_cli.fitting, "build_labeler", no_model)
    rows = [json.loads(line) for line in (ROOT / "sample_data" / "airline_tweets.dev.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["sentiment"] != "POSITIVE"][:40]
    gold = tmp_path / "gold.jsonl"
    gold.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = CliRunner().invoke(app, ["calibrate", str(gold), "-s", str(ROOT / "schemas" / "airline_sentiment.yaml"),
                                      "--objective", "f1:POSITIVE", "-o", str(tmp_path / "cal.json")])
    assert result.exit_code == 2, result.output
    assert "field 'sentiment': no gold row has the label 'POSITIVE'" in " ".join(result.output.split())
    assert not (tmp_path / "cal.json").exists()


# --- 2. folds and intervals grouped by model input ------------------------------------------------

def test_grouped_folds_keep_copies_together_and_equal_the_ungrouped_folds_on_distinct_texts():
    keys = [f"t{i % 7}" for i in range(30)]
    groups = group_index(keys)
    parts = grouped_folds(groups, 5, seed=3)
    assert sorted(np.concatenate(parts).tolist()) == list(range(30))
    for part in parts:
        inside = set(groups[part].tolist())
        assert all(set(groups[other].tolist()).isdisjoint(inside) for other in parts if other is not part)
    distinct = grouped_folds(group_index(None, 23), 4, seed=9)  # every row its own: the old split, exactly
    old = np.array_split(np.random.default_rng(9).permutation(23), 4)
    assert all(np.array_equal(a, b) for a, b in zip(distinct, old))
    kept, held = grouped_split(groups, 0.5, seed=1)
    assert set(groups[kept].tolist()).isdisjoint(groups[held].tolist()) and len(kept) + len(held) == 30
    weights = bootstrap_weights(groups, 50, seed=0)
    assert all(len(set(w[groups == g].tolist())) == 1 for w in weights for g in range(7))  # copies move together
    with pytest.raises(CalibrationError, match=r"field 'f': 30 rows with gold labels \(7 distinct texts\), fewer "
                                               r"than --folds 8"):
        grouped_folds(groups, 8, seed=0, name="f")


def boolean_frame(probs, gold_true, ids, keys=None):
    df = pd.DataFrame({"id": ids, "flag": probs[:, 0] >= 0.5, "flag__prob": probs.max(axis=1),
                       "flag__probs": [[("true", p), ("false", 1 - p)] for p in probs[:, 0]]})
    if keys is not None:
        df[INPUT_KEY_COLUMN] = keys
    return df, pd.DataFrame({"id": ids, "flag": gold_true})


def test_gold_given_three_times_under_new_ids_gives_the_interval_it_gives_once():
    rng = np.random.default_rng(5)
    n = 40
    p = 1 / (1 + np.exp(-rng.normal(0, 1.5, n)))
    gold = rng.random(n) < p
    probs = np.stack([p, 1 - p], axis=1)
    texts = [f"text {i}" for i in range(n)]
    keys = [input_key(t) for t in texts]
    once = fit_calibration(*boolean_frame(probs, gold, [str(i) for i in range(n)], keys), FLAG, metadata(FLAG),
                           objective="macro-f1", force_rule=True)[0].fields["flag"]
    ids3 = [f"{i}-c{k}" for k in range(3) for i in range(n)]
    thrice = fit_calibration(*boolean_frame(np.tile(probs, (3, 1)), np.tile(gold, 3), ids3, keys * 3), FLAG,
                             metadata(FLAG), objective="macro-f1", force_rule=True)[0].fields["flag"]
    blind = fit_calibration(*boolean_frame(np.tile(probs, (3, 1)), np.tile(gold, 3), ids3), FLAG, metadata(FLAG),
                            objective="macro-f1", force_rule=True)[0].fields["flag"]  # no key: rows independent

    def width(fc, which):
        return fc.rule.cv[which]["high"] - fc.rule.cv[which]["low"]

    assert thrice.cv["texts"] == 40 and thrice.rule.cv["texts"] == 40 and "texts" not in once.cv
    for which in ("argmax", "rule"):
        assert width(thrice, which) == pytest.approx(width(once, which), rel=0.1)
        assert width(blind, which) < 0.75 * width(once, which)  # what copies did before: a narrower interval
    gain_once, gain_thrice = once.rule.cv["gain"], thrice.rule.cv["gain"]
    assert gain_thrice["high"] - gain_thrice["low"] == pytest.approx(gain_once["high"] - gain_once["low"], rel=0.1)


# --- 3. argmax kept where the rule shows no held-out gain -----------------------------------------

def rare_true(n, seed, shuffle=False):
    """P(true) that ranks a rare ``true`` well but sits above 0.5 for most rows: a macro-F1 rule gains."""
    rng = np.random.default_rng(seed)
    gold = rng.random(n) < 0.15
    score = rng.normal(0, 1, n) + gold * 1.4
    p = 1 / (1 + np.exp(-(score + 2.0)))
    if shuffle:
        gold = rng.permutation(gold)
    return np.stack([p, 1 - p], axis=1), gold


def test_shuffled_gold_keeps_argmax_with_a_note_unless_the_rule_is_forced():
    probs, gold = rare_true(400, seed=7)
    ids = [str(i) for i in range(400)]
    real = fit_calibration(*boolean_frame(probs, gold, ids), FLAG, metadata(FLAG), objective="macro-f1")[0]
    assert real.fields["flag"].by_rule and real.fields["flag"].rule.cv["gain"]["low"] > 0  # a real gain is kept
    assert rule_fit_warnings(real) == []

    probs, gold = rare_true(400, seed=7, shuffle=True)
    calibration, report = fit_calibration(*boolean_frame(probs, gold, ids), FLAG, metadata(FLAG), objective="macro-f1")
    fc = calibration.fields["flag"]
    gain = fc.rule.cv["gain"]
    assert fc.rule.kept_argmax and not fc.by_rule and gain["low"] <= 0 and calibration.rules() == {}
    calibrated = fc.apply(probs)
    assert [fc.decide(row) for row in calibrated] == calibrated.argmax(axis=1).tolist()
    assert rule_fit_warnings(calibration) == [
        f"field 'flag': the decision rule is no better than argmax on held-out folds (gain in macro-F1 "
        f"{gain['value']:+.3f}, 95 % interval [{gain['low']:+.3f}, {gain['high']:+.3f}] (5 folds, 400 gold rows)): "
        "argmax kept; add gold rows, or pass --force-rule to write the rule anyway"]
    forced, _ = fit_calibration(*boolean_frame(probs, gold, ids), FLAG, metadata(FLAG), objective="macro-f1",
                                force_rule=True)
    rule = forced.fields["flag"].rule
    assert forced.fields["flag"].by_rule and rule.cv["forced"] and rule.threshold == fc.rule.cv["fitted"]["threshold"]
    assert "written as --force-rule asks" in rule_fit_warnings(forced)[0]


def test_a_kept_argmax_survives_the_file_and_says_what_was_fitted(tmp_path):
    probs, gold = rare_true(400, seed=7, shuffle=True)
    calibration, report = fit_calibration(*boolean_frame(probs, gold, [str(i) for i in range(400)]), FLAG,
                                          metadata(FLAG), objective="macro-f1")
    calibration.save(tmp_path / "c.json")
    loaded = type(calibration).load(tmp_path / "c.json").fields["flag"]
    assert loaded.rule.kept_argmax and not loaded.by_rule
    assert loaded.rule.fitted().threshold == calibration.fields["flag"].rule.cv["fitted"]["threshold"]
    from rich.console import Console

    from pcd_cli.quality.render import render_calibration

    console = Console(record=True, width=160)
    render_calibration(report, console)
    text = flat(console.export_text())
    assert f"flag: argmax kept for macro-f1: the rule fitted (true when P(true) >= " \
           f"{loaded.rule.fitted().threshold:.4f}) showed no held-out gain" in text
    assert "gain in macro-F1" in text


def test_each_multi_select_option_keeps_argmax_or_its_rule_by_its_own_held_out_gain():
    """Option ``plain``: P(yes) calibrated and balanced, argmax is as good as any cut (kept);
    option ``rare``: a rare yes ranked well but under 0.5, a macro-F1 rule gains (written)."""
    rng = np.random.default_rng(11)
    n = 400
    p_plain = rng.random(n)
    yes_plain = rng.random(n) < p_plain
    p_rare, yes_rare = rare_true(n, seed=7)
    schema = parse_schema({"name": "m", "fields": {"topics": {"type": "multi", "labels": ["plain", "rare"]}}})
    p_yes = np.stack([p_plain, p_rare[:, 0]], axis=1)
    df = pd.DataFrame({"id": [str(i) for i in range(n)],
                       "topics": [[o for o, p in zip(("plain", "rare"), row) if p >= 0.5] for row in p_yes],
                       "topics__prob": np.full(n, 0.5), "topics__mass": np.full(n, 0.9),
                       "topics__probs": [list(zip(("plain", "rare"), row)) for row in p_yes]})
    gold = pd.DataFrame({"id": df["id"], "topics": [[o for o, y in zip(("plain", "rare"), ys) if y]
                                                    for ys in zip(yes_plain, yes_rare)]})
    calibration, _ = fit_calibration(df, gold, schema, metadata(schema), objective="macro-f1")
    plain, rare = calibration.fields["topics.plain"], calibration.fields["topics.rare"]
    assert plain.rule.kept_argmax and plain.rule.cv["gain"]["low"] <= 0
    assert rare.by_rule and rare.rule.cv["gain"]["low"] > 0
    assert [line.split(":")[0] for line in rule_fit_warnings(calibration)] == ["field 'topics.plain'"]


def test_force_rule_is_named_in_the_help_of_calibrate_and_tune():
    from pcd_cli.cli import app

    for command in ("calibrate", "tune"):
        result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"})
        assert "--force-rule" in result.output, command


def test_tune_holdout_and_cross_fit_folds_keep_copies_of_a_text_on_one_side():
    from pcd_cli.tune import cross_fit_folds, stratified_holdout

    labels = [i % 2 for i in range(60)]
    groups = group_index([f"t{i % 20}" for i in range(60)])  # 20 texts, each three times (same label)
    held = stratified_holdout(labels, 0.2, seed=4, groups=groups)
    inside = set(groups[held].tolist())
    assert len(inside) == 4 and len(held) == 12  # 20 % of the texts, each with its three copies
    assert inside.isdisjoint(np.delete(groups, held).tolist())
    folds = cross_fit_folds(labels, 5, seed=4, groups=groups)
    assert all(len(set(folds[groups == g].tolist())) == 1 for g in range(20))
    # every row its own group: the ungrouped split, exactly
    assert np.array_equal(stratified_holdout(labels, 0.2, 4, group_index(None, 60)), stratified_holdout(labels, 0.2, 4))
    assert np.array_equal(cross_fit_folds(labels, 5, 4, group_index(None, 60)), cross_fit_folds(labels, 5, 4))
