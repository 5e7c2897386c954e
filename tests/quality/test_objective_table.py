"""One table of objectives (issue #53, item 3): ``decision.OBJECTIVES``.

A new objective is a row: a toy ``fbeta:LABEL:BETA`` registered in the table (monkeypatched)
is parsed, scored (against scikit-learn's ``fbeta_score``), listed in both ``--objective``
helps and fitted (the threshold checked against brute force), with no other edit. The parsed
``Objective`` travels whole: ``TuneConfig`` parses text where it enters and the tune card
records the name.
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import fbeta_score

from pcd_cli.errors import InputError
from pcd_cli.quality import decision as D

from .test_decision_rules import BOOL, boolean_rows, brute_threshold


def _fbeta(o, t, labels, costs):
    """F-beta of the label: (1 + b^2) P R / (b^2 P + R), 0 where undefined."""
    j, b2 = labels.index(o.label), o.number ** 2
    p, r = t.precision[:, j], t.recall[:, j]
    with np.errstate(divide="ignore", invalid="ignore"):
        value = np.where(b2 * p + r > 0, (1 + b2) * p * r / np.maximum(b2 * p + r, 1e-300), 0.0)
    return np.ones(len(value), dtype=bool), value


def _with_beta(kind, text, rest):
    label, sep, beta = rest.rpartition(":")
    if not sep or not label:
        raise InputError(f"--objective {text!r}: expected {kind}:LABEL:BETA, e.g. {kind}:true:2")
    return D.Objective(kind, text, label=label, number=float(beta))


FBETA = D.ObjectiveKind("fbeta", "fbeta:LABEL:BETA", _with_beta, _fbeta, "F-beta of {label!r}",
                        arguments="LABEL:BETA", needs_label=True)


@pytest.fixture
def fbeta(monkeypatch):
    monkeypatch.setitem(D.OBJECTIVES, "fbeta", FBETA)
    return FBETA


def test_a_new_objective_is_one_row_parsed_scored_helped_and_fitted(fbeta):
    objective = D.parse_objective("fbeta:true:2")
    assert (objective.kind, objective.label, objective.number, objective.fits_rule) == ("fbeta", "true", 2.0, True)
    with pytest.raises(InputError, match="expected fbeta:LABEL:BETA"):
        D.parse_objective("fbeta:2")
    with pytest.raises(InputError, match=r"expected likelihood .* or fbeta:LABEL:BETA"):
        D.parse_objective("fbeta")  # a row with arguments, written without
    assert D.objective_forms().endswith("recall:LABEL>=R, cost:FILE or fbeta:LABEL:BETA")
    assert "cost:FILE or fbeta:LABEL:BETA (docs/quality.md)" in D.calibrate_objective_help()

    probs, gold = boolean_rows(seed=2)
    pred = np.where(probs[:, 0] >= 0.7, 0, 1)
    want = fbeta_score(gold, pred, beta=2, pos_label=0, average="binary", zero_division=0)
    cms = D._confusions(gold, pred[None], 2)
    assert D.scores(objective, cms, BOOL)[1][0] == pytest.approx(want, abs=1e-12)
    assert D.metric_name(objective) == "F-beta of 'true'"
    assert D.held_out_figures(objective, "is_spam", gold, pred, BOOL)["value"] == pytest.approx(want, abs=1e-12)
    assert D.applies_to(objective, "tone", ("calm", "angry")).startswith("field 'tone' has no label 'true'")

    rule, ok = D.fit_once(objective, "is_spam", probs, gold, BOOL)
    best = brute_threshold(probs, gold, lambda g, p: fbeta_score(g, p, beta=2, pos_label=0, zero_division=0))
    assert ok and fbeta_score(gold, rule.decide(probs), beta=2, pos_label=0, zero_division=0) == \
        pytest.approx(best, abs=1e-12)
    # beta 2 weighs recall: the rule writes ``true`` on more rows than the F1 rule does
    f1_rule, _ = D.fit_once(D.parse_objective("f1:true"), "is_spam", probs, gold, BOOL)
    assert rule.threshold < f1_rule.threshold
    held = D.fit_rule(objective, "is_spam", probs, gold, BOOL, np.array_split(np.arange(len(gold)), 5), force=True)
    assert held.objective == "fbeta:true:2" and held.cv["metric"] == "F-beta of 'true'"
    assert held.cv["argmax"]["value"] == pytest.approx(fbeta_score(gold, np.argmax(probs, axis=1), beta=2,
                                                                   pos_label=0, zero_division=0), abs=1e-12)


def test_every_objective_in_the_table_reads_back_from_its_recorded_name(tmp_path):
    (tmp_path / "costs.yaml").write_text("f:\n  A:\n    B: 5\n")
    for text in ("likelihood", "macro-f1", "balanced-accuracy", "f1:spam", "precision:a>=b>=0.9", "recall:x>=0.5",
                 f"cost:{tmp_path / 'costs.yaml'}"):
        parsed = D.parse_objective(text)
        assert parsed.kind in D.OBJECTIVES
        back = D.recorded_objective(parsed.name)
        assert back == parsed and back.costs == {}  # a recorded cost: the file's name only, no file read
    assert D.parse_objective(f"cost:{tmp_path / 'costs.yaml'}").costs == {"f": {"A": {"B": 5.0}}}
    with pytest.raises(Exception, match="calibration 'c.json': objective 'accuracy': --objective 'accuracy'"):
        D.recorded_objective("accuracy", "calibration 'c.json'")


def test_both_cli_helps_read_the_table_and_tune_carries_the_parsed_objective():
    from pcd_cli import cli
    from pcd_cli.tune import TuneConfig

    assert cli.OBJECTIVE_OPT.help == D.calibrate_objective_help()
    assert D.objective_forms() in D.calibrate_objective_help()
    assert f"below {D.MIN_GOLD_PER_LABEL} holdout rows" in D.tune_objective_help()
    config = TuneConfig(objective="precision:spam>=0.9")
    assert config.objective == D.Objective("precision", "precision:spam>=0.9", label="spam", number=0.9)
    assert TuneConfig().objective == D.LIKELIHOOD and not TuneConfig().objective.fits_rule
    with pytest.raises(InputError, match="expected likelihood"):
        TuneConfig(objective="accuracy")
