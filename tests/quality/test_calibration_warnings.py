"""A calibration that makes held-out figures worse is said: by ``pcd calibrate`` when it fits one,
and by ``pcd label`` when it is given one (also one at the temperature bound, whose labels follow
the label priors); one that fixes over-confident probabilities is not warned about.

From issue 28 item 7, "the first hour tells the truth" (formerly tests/test_first_hour.py);
hand-made pcd outputs and the tiny random model.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

import pcd_cli.backends
from pcd_cli.quality import Calibration, fit_calibration, read_gold, read_predictions
from pcd_cli.quality.calibration import held_out_worse, worse_calibration_warnings

from ..helpers import AIRLINE, SENTIMENTS, airline_schema, flat, pcd, write_sentiment_output

SCHEMA = airline_schema()
pytestmark = pytest.mark.usefixtures("fewer_resamples")  # no figure checked here is an interval


def test_held_out_worse_names_the_figures_the_demo_measured():
    cv = {"before": {"accuracy": 0.85, "macro_f1": 0.844, "nll": 0.387, "ece": 0.1},
          "after": {"accuracy": 0.85, "macro_f1": 0.802, "nll": 0.464, "ece": 0.08}}
    assert held_out_worse(cv) == ["NLL 0.387 -> 0.464", "macro-F1 0.844 -> 0.802"]
    better = {"before": cv["after"], "after": cv["before"] | {"macro_f1": 0.85, "nll": 0.3}}
    assert held_out_worse(better) == []
    assert held_out_worse({"before": {"nll": 0.4}, "after": {"nll": 0.403}}) == []  # within 1 %: noise


def test_accuracy_traded_for_macro_f1_is_not_called_worse():
    """A calibration that undoes a collapse onto the majority label loses accuracy and gains
    macro-F1 (50 airline rows: accuracy 0.600 -> 0.540, macro-F1 0.250 -> 0.378): a trade-off the
    user's objective settles, not "worse" (the warning once told that user to label without it).
    A fall with no rise, or a risen NLL, is still named."""
    trade = {"before": {"accuracy": 0.600, "macro_f1": 0.250, "nll": 0.95},
             "after": {"accuracy": 0.540, "macro_f1": 0.378, "nll": 0.90}}
    assert held_out_worse(trade) == []
    mirrored = {"before": trade["after"] | {"nll": 0.90}, "after": trade["before"] | {"nll": 0.89}}
    assert held_out_worse(mirrored) == []  # macro-F1 traded for accuracy: the same rule
    small_rise = {"before": trade["before"], "after": trade["after"] | {"macro_f1": 0.255}}
    assert held_out_worse(small_rise) == ["accuracy 0.600 -> 0.540"]  # a rise within noise trades nothing
    nll_up = {"before": trade["before"], "after": trade["after"] | {"nll": 1.2}}
    assert held_out_worse(nll_up) == ["NLL 0.950 -> 1.200"]


def _calibrated_gold(tmp_path, n: int, seed: int, sharpen: float = 1.0):
    """``n`` rows whose gold is drawn from probabilities ``p``; the output holds ``p`` (already
    calibrated) or, with ``sharpen`` > 1, ``p ** sharpen`` renormalised (over-confident)."""
    rng = np.random.default_rng(seed)
    rows, golds = [], []
    for i in range(n):
        p = rng.dirichlet(np.ones(3) * 0.7)
        written = p ** sharpen / np.sum(p ** sharpen)
        rows.append((f"r{i}", int(p.argmax()), written))
        golds.append({"id": f"r{i}", "sentiment": SENTIMENTS[int(rng.choice(3, p=p))]})
    gold = tmp_path / "gold.jsonl"
    gold.write_text("".join(json.dumps(g) + "\n" for g in golds))
    return write_sentiment_output(tmp_path / "preds.parquet", rows), gold


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
                fields={"sentiment": FieldCalibration("sentiment", SENTIMENTS, 1.5, (0.0, 0.0, 0.0), 40, cv)}
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
        "sentiment": FieldCalibration("sentiment", SENTIMENTS, MAX_TEMPERATURE, (0.4, -0.1, -0.3), 280, cv)})
    lines = worse_calibration_warnings(calibration, "--calibration")
    assert lines == ["field 'sentiment': --calibration has its temperature at the bound (1000): the model's "
                     "probabilities carried no signal on its gold rows, so the labels follow the label priors, not "
                     "the texts; train the model (pcd tune) or pass a larger --model instead"]
    assert worse_calibration_warnings(calibration, bound=False) == []  # NLL better, macro-F1 within 0.01


def _with_readout(temperature: float, argmax: dict, readout: dict):
    from pcd_cli.quality.calibration import FieldCalibration
    from pcd_cli.quality.readout import Readout

    d = 4
    fitted = Readout(layers=(10,), labels=tuple(SENTIMENTS), classes=(0, 1, 2), mean=np.zeros(d),
                     scale=np.ones(d), coef=np.zeros((3, d)), intercept=np.zeros(3), C=0.1,
                     cv={"folds": 5, "n": 40, "argmax": argmax, "readout": readout})
    fc = FieldCalibration("sentiment", tuple(SENTIMENTS), temperature, (0.0, 0.0, 0.0), 40,
                          cv={"before": {"nll": 0.5}, "after": {"nll": 0.9}}, readout=fitted)
    return Calibration("test", "m", "", "", "logprob", {"sentiment": fc})


def test_a_field_with_a_readout_is_judged_by_the_readout_not_by_its_logits_calibration():
    """The readout writes the field's labels: a logits calibration at the temperature bound, or one
    that made its own held-out NLL worse, is not the labels' problem (the warning once told a user
    whose readout scored 0.75 macro-F1 that the labels "follow the label priors")."""
    from pcd_cli.quality.calibration import MAX_TEMPERATURE

    good = _with_readout(MAX_TEMPERATURE, {"macro_f1": 0.25, "accuracy": 0.4, "nll": 1.2},
                         {"macro_f1": 0.75, "accuracy": 0.8, "nll": 0.6})
    assert worse_calibration_warnings(good) == []
    bad = _with_readout(1.0, {"macro_f1": 0.60, "accuracy": 0.7, "nll": 0.7},
                        {"macro_f1": 0.40, "accuracy": 0.5, "nll": 0.9})
    (line,) = worse_calibration_warnings(bad)
    assert "field 'sentiment'" in line and "linear readout makes it worse" in line
    assert "macro-F1 0.600 -> 0.400" in line and "NLL 0.700 -> 0.900" in line and "40 rows" in line
