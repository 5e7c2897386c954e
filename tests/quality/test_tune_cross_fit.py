"""``pcd tune --cross-fit K`` (issue 29 item 2): K fold runs give every gold row an out-of-fold
prediction, the calibration is fitted on all of them, and the written model is trained on all
rows, from the adapter's initial weights, for the median of the folds' kept epochs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from pcd_cli.results import Record
from pcd_cli.schema.load import parse_schema
from pcd_cli.tune import TuneConfig, cross_fit_folds, tune

from ..helpers import KEYWORD_SCHEMA, keyword_rows, keyword_tune_files, pcd, tiny_backend


def test_cross_fit_folds_are_stratified_seeded_and_cover_every_row_once():
    labels = [0] * 30 + [1] * 10 + [2] * 2 + [None] * 3
    folds = cross_fit_folds(labels, 3, seed=4)
    assert folds.tolist() == cross_fit_folds(labels, 3, seed=4).tolist()
    assert folds.tolist() != cross_fit_folds(labels, 3, seed=5).tolist()
    assert sorted(set(folds.tolist())) == [0, 1, 2] and len(folds) == len(labels)
    for label, per_fold in ((0, 10), (1, None)):
        counts = np.bincount(folds[[i for i, lab in enumerate(labels) if lab == label]], minlength=3)
        assert counts.tolist() == [per_fold] * 3 if per_fold else sorted(counts.tolist()) == [3, 3, 4]
    two = folds[[i for i, lab in enumerate(labels) if lab == 2]]  # two rows of a label: two folds
    assert len(set(two.tolist())) == 2
    with pytest.raises(Exception, match="--cross-fit 5: 4 gold rows, fewer than the folds"):
        cross_fit_folds([0, 1, 0, 1], 5, seed=0)


def test_cross_fit_pools_every_row_and_trains_the_written_model_on_all_rows_from_scratch():
    """Every gold row is predicted once, by a fold run that did not train on it; the written
    adapter is bit-identical to a plain tune on all rows (no holdout) for the folds' median
    epoch: each run starts from the initial adapter with a fresh optimiser."""
    schema = parse_schema(KEYWORD_SCHEMA)
    rows = keyword_rows(24)
    records = [Record(r["id"], r["text"]) for r in rows]
    labels = [[0 if r["refund"] else 1] for r in rows]
    config = TuneConfig(epochs=3, lr=1e-2, rank=4, mass_weight=0.0, cross_fit=2, seed=3)
    folds_seen = []
    result, trainer = tune(tiny_backend(seed=6), schema, records, labels, config,
                           on_fold=lambda *a: folds_seen.append(a))
    cross = result.cross_fit
    assert cross["folds"] == 2 and len(cross["per_fold"]) == 2
    assert [f["train_rows"] + f["holdout_rows"] for f in cross["per_fold"]] == [24, 24]
    assert sum(f["holdout_rows"] for f in cross["per_fold"]) == 24
    assert folds_seen[:2] == [(1, 3, 12, 12, 3), (2, 3, 12, 12, 3)]
    assert folds_seen[2] == (3, 3, 24, 0, cross["final_epochs"])
    assert cross["final_epochs"] == int(np.floor(np.median(cross["kept_epochs"]) + 0.5))
    assert cross["kept_epochs"] == [f["best_epoch"] for f in cross["per_fold"]]
    probs, gold = result.holdout_predictions[0]
    assert probs.shape == (24, 2) and sorted(gold.tolist()) == sorted(lab[0] for lab in labels)
    assert result.holdout_rows == 24 and result.train_rows == 24 and result.best_epoch == cross["final_epochs"]
    assert result.holdout_masses[0].shape == (24,) and result.base_predictions[0][0].shape == (24, 2)
    # the before -> after table reads the pooled predictions: epoch 0 (base) and the folds' kept epochs
    before, after = result.epochs[0].holdout["refund"], result.epochs[-1].holdout["refund"]
    assert before.n == after.n == 24
    assert after.nll == pytest.approx(-np.mean(np.log(probs[np.arange(24), gold])), rel=1e-6)
    assert after.nll < before.nll
    plain_result, plain = tune(tiny_backend(seed=6), schema, records, labels,
                               TuneConfig(epochs=cross["final_epochs"], lr=1e-2, rank=4, mass_weight=0.0,
                                          holdout=0.0, seed=3))
    written, expected = trainer.adapter_state(), plain.adapter_state()
    assert cross["final_epochs"] >= 1 and all(torch.equal(written[k], expected[k]) for k in expected)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return keyword_tune_files(tmp_path_factory.mktemp("crossfit"))


def test_pcd_tune_cross_fit_writes_a_calibration_fitted_on_every_gold_row(files, tmp_path):
    from pcd_cli.quality.calibration import Calibration

    base = ("tune", files / "gold.jsonl", "-s", files / "keyword.json", "--model", files / "tiny-model",
            "--device", "cpu", "--rank", "4", "--lr", "5e-3", "--epochs", "2", "--no-progress")
    run = pcd(*base, "-o", tmp_path / "cf", "--cross-fit", "3", code=0)
    card = json.loads((tmp_path / "cf" / "pcd-tune.json").read_text())
    assert card["cross_fit"]["folds"] == 3 and card["hyperparameters"]["cross_fit"] == 3
    assert [f["holdout_rows"] for f in card["cross_fit"]["per_fold"]] == [10, 10, 10]
    assert card["calibration"]["fitted_on"].startswith("out-of-fold predictions of all 30 gold rows (3 fold runs")
    assert Calibration.load(tmp_path / "cf" / "pcd-calibration.json").fields["refund"].n == 30
    assert "3-fold cross-fit, out-of-fold predictions of 30 rows" in run.output
    assert card["train_rows"] == 30 and card["best_epoch"] == card["cross_fit"]["final_epochs"]
    refused = pcd(*base, "-o", tmp_path / "one", "--cross-fit", "1", code=2)
    assert "--cross-fit 1" in refused.output and not (tmp_path / "one").exists()


def test_ctrl_c_in_a_fold_run_writes_nothing_and_names_the_fold(monkeypatch):
    """Before the final run there is no model to write: a KeyboardInterrupt in fold 1 ends the
    tune with TuneInterrupted (exit 130), naming the fold, not with a half-trained fold model."""
    from pcd_cli.backends.torch_tune import LoraTrainer
    from pcd_cli.errors import TuneInterrupted, exit_code

    def interrupted(self, losses, max_grad_norm=1.0):
        raise KeyboardInterrupt

    monkeypatch.setattr(LoraTrainer, "step", interrupted)
    schema = parse_schema(KEYWORD_SCHEMA)
    rows = keyword_rows(12)
    with pytest.raises(TuneInterrupted, match="interrupted in cross-fit fold 1 of 2: nothing is written") as caught:
        tune(tiny_backend(seed=6), schema, [Record(r["id"], r["text"]) for r in rows],
             [[0 if r["refund"] else 1] for r in rows], TuneConfig(epochs=1, rank=4, cross_fit=2))
    assert exit_code(caught.value) == 130
