"""``pcd tune --patience P`` (issue 29 item 3, early stopping on the holdout NLL): training ends
once P epochs in a row did not beat the best holdout NLL, the best epoch's adapter is the one
kept, and the card records where it stopped."""

from __future__ import annotations

import json

import pytest
import torch
from pcd_cli.results import Record
from pcd_cli.schema.load import parse_schema
from pcd_cli.tune import TuneConfig, tune

from ..helpers import KEYWORD_SCHEMA, keyword_rows, keyword_tune_files, pcd, tiny_backend


def _scripted_nll(monkeypatch, values):
    """The holdout NLL the epoch loop reads (``tune._mean_nll``), epoch 0 first, from ``values``."""
    import pcd_cli.tune as tune_module

    calls = iter(values)
    monkeypatch.setattr(tune_module, "_mean_nll", lambda scores: next(calls))


def _data():
    rows = keyword_rows(24)
    return (parse_schema(KEYWORD_SCHEMA), [Record(r["id"], r["text"]) for r in rows],
            [[0 if r["refund"] else 1] for r in rows])


def test_patience_stops_after_p_epochs_without_a_better_holdout_and_keeps_the_best(monkeypatch):
    schema, records, labels = _data()
    config = TuneConfig(epochs=6, lr=1e-2, rank=4, mass_weight=0.0, seed=2, patience=2)
    # best at epoch 1; epochs 2 and 3 are worse: stop after 3, though epoch 4 would have been better
    _scripted_nll(monkeypatch, [5.0, 4.0, 4.5, 4.6, 3.0, 2.0, 1.0])
    result, trainer = tune(tiny_backend(seed=6), schema, records, labels, config)
    assert result.stopped_early == 3 and result.best_epoch == 1
    assert [e.epoch for e in result.epochs] == [0, 1, 2, 3]
    # the kept adapter is epoch 1's: bit-identical to a 1-epoch run on the same split and seed
    # (whose epoch 1 is kept too: the same scripted NLL)
    _scripted_nll(monkeypatch, [5.0, 4.0])
    _, one = tune(tiny_backend(seed=6), schema, records, labels,
                  TuneConfig(epochs=1, lr=1e-2, rank=4, mass_weight=0.0, seed=2))
    kept, expected = trainer.adapter_state(), one.adapter_state()
    assert all(torch.equal(kept[k], expected[k]) for k in expected)


def test_without_patience_or_with_improving_epochs_every_epoch_runs(monkeypatch):
    schema, records, labels = _data()
    _scripted_nll(monkeypatch, [5.0, 4.0, 4.5, 4.6, 3.0])
    result, _ = tune(tiny_backend(seed=6), schema, records, labels,
                     TuneConfig(epochs=4, lr=1e-2, rank=4, mass_weight=0.0, seed=2, patience=0))
    assert result.stopped_early is None and result.best_epoch == 4 and len(result.epochs) == 5
    # patience 3 is never reached (two worse epochs, then a better one); the last epoch is no "stop"
    _scripted_nll(monkeypatch, [5.0, 4.0, 4.5, 4.6, 3.0])
    result, _ = tune(tiny_backend(seed=6), schema, records, labels,
                     TuneConfig(epochs=4, lr=1e-2, rank=4, mass_weight=0.0, seed=2, patience=3))
    assert result.stopped_early is None and result.best_epoch == 4


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return keyword_tune_files(tmp_path_factory.mktemp("patience"))


def test_pcd_tune_patience_is_in_the_card(files, tmp_path):
    out = tmp_path / "tuned"
    run = pcd("tune", files / "gold.jsonl", "--schema", files / "keyword.json", "--model", files / "tiny-model",
              "-o", out, "--device", "cpu", "--epochs", "8", "--patience", "1", "--lr", "0.05", "--rank", "4",
              "--no-progress", code=0)
    card = json.loads((out / "pcd-tune.json").read_text())
    assert card["hyperparameters"]["patience"] == 1
    logged = [e["epoch"] for e in card["epochs"]]
    nll = [e["holdout"]["refund"]["nll"] for e in card["epochs"]]
    # lr 0.05 overshoots on the tiny model: an epoch no better than the best ends it at once
    assert logged[-1] == card["stopped_early"] == card["best_epoch"] + 1 < 8
    assert nll[-1] >= nll[card["best_epoch"]] and "stopped early after epoch" in run.output
