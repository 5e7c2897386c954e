"""``pcd tune`` keeps what it did not write and never calls a collapse "best" (issue #28 item 1).

The case ../shared/cases-round4/tune-diverged-epoch-and-existing-output-folder runs here on a
tiny model folder with the case's own files (``test_case_tune_diverged_epoch_and_existing_output_folder``;
as written, on the embedded model, in the ``full`` variant), then one test per kind: a NaN
loss, an exploding loss, a collapsed candidate mass, flat probabilities, a holdout too small
to choose an epoch; an earlier pcd tune folder replaced file by file, a folder of others'
files refused, the written adapter config free of this machine's paths, an adapter refused on
the folder it is already merged into.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pcd_cli.results import Record
from pcd_cli.schema.load import parse_schema
from pcd_cli.tune import FieldScores, TrainingDiverged, TuneConfig, divergence, tune

from ..helpers import KEYWORD_SCHEMA, flat, keyword_rows, pcd, save_tiny_model, tiny_backend

CASE = Path(__file__).resolve().parents[3] / "shared" / "cases-round4" / "tune-diverged-epoch-and-existing-output-folder"
GOLD = [
    {"id": "g01", "text": "The parcel arrived broken and support never answered.", "sentiment": "NEGATIVE"},
    {"id": "g02", "text": "Quick delivery, lovely packaging, thank you!", "sentiment": "POSITIVE"},
    {"id": "g03", "text": "It works. Nothing special.", "sentiment": "NEUTRAL"},
    {"id": "g04", "text": "Refund took three weeks, I will not order again.", "sentiment": "NEGATIVE"},
    {"id": "g05", "text": "Five stars, would buy again.", "sentiment": "POSITIVE"},
    {"id": "g06", "text": "Item matches the description.", "sentiment": "NEUTRAL"},
]
SCHEMA = "name: reviews\nfields:\n  sentiment: {type: enum, labels: [NEGATIVE, NEUTRAL, POSITIVE]}\n"


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A tiny model folder, the case's gold rows and schema."""
    root = tmp_path_factory.mktemp("tune-safety")
    save_tiny_model(root / "tiny-model", seed=6)
    (root / "gold.jsonl").write_text("".join(json.dumps(r) + "\n" for r in GOLD))
    (root / "schema.yaml").write_text(SCHEMA)
    return root


def _tune(work: Path, out: Path, *extra, code=None):
    return pcd("tune", work / "gold.jsonl", "-s", work / "schema.yaml", "-o", out, "--model", work / "tiny-model",
               "--device", "cpu", "--epochs", "1", "--rank", "4", "--no-progress", *extra, code=code)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_case_tune_diverged_epoch_and_existing_output_folder(work, tmp_path):
    # (B) the team's models/current: an earlier pcd tune card, their notes and eval report
    current = tmp_path / "models" / "current"
    (current / "eval").mkdir(parents=True)
    (current / "pcd-tune.json").write_text('{"kind": "merged", "best_epoch": 2, "note": "last month\'s model"}\n')
    (current / "NOTES.md").write_text("Model notes: trained 2026-04 on 3,000 rows; approved by QA.\n")
    (current / "eval" / "report.json").write_text('{"accuracy": 0.91}\n')
    before = _snapshot(current)
    refused = _tune(work, current, "--epochs", "2", "--lr", "1e6", "--holdout", "0.34")
    assert refused.exit_code == 2, refused.output
    assert "-o '" + str(current) + "' is an earlier pcd tune folder that also holds files pcd did not write " \
           "(NOTES.md, eval/report.json)" in flat(refused.output)
    assert "before training" not in refused.output  # refused before the model loads
    assert _snapshot(current) == before
    # (A) --lr 1e6 on a new folder: the collapse fails the run, nothing is written
    fresh = tmp_path / "models" / "fresh"
    diverged = _tune(work, fresh, "--epochs", "2", "--lr", "1e6", "--holdout", "0.34")
    assert diverged.exit_code == 2, diverged.output
    assert "error: training diverged in epoch 1: field 'sentiment': the probabilities went flat (every label 1/3 " \
           "on every holdout row). --lr 1e+06 is probably too high (the default is 0.0005); nothing was written" \
           in flat(diverged.output)
    assert not fresh.exists() and sorted(p.name for p in fresh.parent.iterdir()) == ["current"]


def test_a_nan_loss_stops_training_at_that_step():
    schema = parse_schema(KEYWORD_SCHEMA)
    rows = keyword_rows(24)
    records, labels = [Record(r["id"], r["text"]) for r in rows], [[0 if r["refund"] else 1] for r in rows]
    epochs = []
    with pytest.raises(TrainingDiverged, match=r"^training diverged in epoch 1: the training loss is nan at step 2\. "
                                                r"--lr inf is probably too high"):
        tune(tiny_backend(seed=6), schema, records, labels,
             TuneConfig(epochs=2, lr=float("inf"), rank=4, holdout=0.5, max_tokens_per_pass=64), on_epoch=epochs.append)
    assert [e.epoch for e in epochs] == [0]  # stopped inside the first epoch


def _loss_reports(monkeypatch, scale):
    """Patch ``LoraTrainer.step``: the real step runs; step ``k`` (1-based) reports
    ``scale(k) * loss``. Returns the list of real losses seen."""
    from pcd_cli.backends.torch_tune import LoraTrainer

    real, seen = LoraTrainer.step, []

    def step(self, losses, max_grad_norm=1.0):
        loss = real(self, losses, max_grad_norm)
        seen.append(loss)
        return loss * scale(len(seen))

    monkeypatch.setattr(LoraTrainer, "step", step)
    return seen


def _keyword_tune(epochs):
    schema = parse_schema(KEYWORD_SCHEMA)
    rows = keyword_rows(24)
    records, labels = [Record(r["id"], r["text"]) for r in rows], [[0 if r["refund"] else 1] for r in rows]
    return tune(tiny_backend(seed=6), schema, records, labels,
                TuneConfig(epochs=epochs, lr=1e-3, rank=4, holdout=0.5, max_tokens_per_pass=64, mass_weight=0.0))


def test_an_exploding_loss_stops_training(monkeypatch):
    seen = _loss_reports(monkeypatch, lambda k: 50.0 if k >= 3 else 1.0)  # from step 3 on, 50x
    with pytest.raises(TrainingDiverged, match=r"the training loss exploded to [\d.]+ at step \d+ \(the median of "
                                               r"the last \d steps; the first step's: "):
        _keyword_tune(epochs=3)
    # one exploded step moves no median: it fires at step 4 (median of 4 steps, two exploded) or
    # step 5 (three of five), and the real losses never were over the limit
    assert 3 <= len(seen) <= 5 and max(seen) < 10 * max(seen[0], 1.0)


@pytest.mark.full  # 18 s of training; test_an_exploding_loss_stops_training stays in make test
def test_one_hard_step_does_not_stop_training(monkeypatch):
    # a one-row step on a hard long text can cost 10+ nats while the holdout improves (BBC):
    # one step reported at 200x the rest must not read as an explosion
    seen = _loss_reports(monkeypatch, lambda k: 200.0 if k == 3 else 1.0)
    result, _ = _keyword_tune(epochs=2)
    assert len(seen) == result.steps > 3 and len(result.epochs) == 3


def _scores(mass, nll=1.0):
    return {"sentiment": FieldScores(n=3, accuracy=0.3, macro_f1=0.2, nll=nll, ece=0.1, mass=mass)}


def test_divergence_names_a_collapsed_mass_flat_probabilities_and_a_nan_nll():
    schema = parse_schema({"name": "r", "fields": {"sentiment": {"type": "enum", "labels": ["A", "B", "C"]}}})
    sharp = {0: (np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.2, 0.2, 0.6]]), np.array([0, 1, 2]))}
    flat_probs = {0: (np.full((3, 3), 1 / 3), np.array([0, 1, 2]))}
    # the case's numbers on the embedded model: mass 0.563 before, 6.1e-05 after --lr 1e6
    assert divergence(_scores(0.563), _scores(6.1e-05), sharp, {0: False}, schema) == (
        "field 'sentiment': the candidate mass collapsed from 0.563 to 6.1e-05 on the holdout (the model no longer "
        "writes any label)")
    assert divergence(_scores(0.563), _scores(0.01), sharp, {0: False}, schema) is None  # a fall, not 100-fold
    assert divergence(_scores(0.5), _scores(0.5, nll=1.0986), flat_probs, {0: False}, schema) == (
        "field 'sentiment': the probabilities went flat (every label 1/3 on every holdout row)")
    assert divergence(_scores(0.5), _scores(0.5), flat_probs, {0: True}, schema) is None  # flat from the start
    assert divergence(_scores(0.5), _scores(0.5, nll=float("nan")), sharp, {0: False}, schema) == (
        "field 'sentiment': the holdout NLL is nan (NaN or infinite probabilities)")


def test_a_holdout_too_small_to_choose_an_epoch_is_named(work, tmp_path):
    out = tmp_path / "small"
    result = _tune(work, out, "--holdout", "0.34", "--lr", "1e-3")
    assert result.exit_code == 0, result.output
    said = "the holdout has 3 rows, too few to choose an epoch (fewer than 10"
    assert "warning: " + said in flat(result.output)
    card = json.loads((out / "pcd-tune.json").read_text())
    assert card["holdout_rows"] == 3 and any(w.startswith(said) for w in card["warnings"])
    none = _tune(work, tmp_path / "none", "--holdout", "0")
    assert none.exit_code == 0, none.output
    assert "no holdout (--holdout 0): the last epoch is kept, unchecked against held-out rows" in flat(none.output)


def test_an_earlier_tune_folder_is_replaced_file_by_file_and_others_are_refused(work, tmp_path):
    out = tmp_path / "models" / "current"
    _tune(work, out, "--holdout", "0", code=0)
    card = json.loads((out / "pcd-tune.json").read_text())
    assert card["kind"] == "merged" and "model.safetensors" in card["files"] and "pcd-tune.json" in card["files"]
    assert card["files"] == sorted(p.name for p in out.iterdir())
    # the same folder again, now as an adapter: pcd's merged files are gone, its adapter files written
    _tune(work, out, "--holdout", "0", "--adapter-only", code=0)
    again = json.loads((out / "pcd-tune.json").read_text())
    assert again["kind"] == "adapter" and sorted(p.name for p in out.iterdir()) == again["files"]
    assert not (out / "model.safetensors").exists() and (out / "adapter_model.safetensors").is_file()
    assert sorted(p.name for p in out.parent.iterdir()) == ["current"]  # no folder left aside
    # a file of someone else's in it: refused, named, nothing touched
    (out / "NOTES.md").write_text("ours\n")
    before = _snapshot(out)
    refused = _tune(work, out, "--holdout", "0")
    assert refused.exit_code == 2 and "holds files pcd did not write (NOTES.md)" in flat(refused.output)
    assert _snapshot(out) == before
    # a folder that is not a pcd tune folder at all, and a file
    other = tmp_path / "reports"
    (other / "q1").mkdir(parents=True)
    (other / "q1" / "summary.csv").write_text("a,b\n")
    refused = _tune(work, other, "--holdout", "0")
    assert refused.exit_code == 2
    assert "is not empty and is not a pcd tune folder (no pcd-tune.json); it holds q1/summary.csv" in flat(refused.output)
    refused = _tune(work, other / "q1" / "summary.csv", "--holdout", "0")
    assert refused.exit_code == 2 and "is a file; give a folder" in flat(refused.output)


def test_files_that_appear_during_training_are_kept(tmp_path):
    from pcd_cli.backends.torch_tune import _replace_folder

    old = tmp_path / "out"
    old.mkdir()
    (old / "pcd-tune.json").write_text(json.dumps({"files": ["config.json", "old-only.bin", "pcd-tune.json"]}))
    (old / "config.json").write_text("old")
    (old / "old-only.bin").write_text("old")
    (old / "NOTES.md").write_text("written while pcd trained")
    new = tmp_path / ".out.tmp"
    new.mkdir()
    (new / "config.json").write_text("new")
    (new / "pcd-tune.json").write_text(json.dumps({"files": ["config.json", "pcd-tune.json"]}))
    _replace_folder(new, old)
    assert _snapshot(old) == {"NOTES.md": b"written while pcd trained", "config.json": b"new",
                              "pcd-tune.json": b'{"files": ["config.json", "pcd-tune.json"]}'}
    assert not new.exists()


def test_the_written_adapter_names_its_base_not_a_path_and_is_refused_on_its_merged_folder(work, tmp_path):
    adapter, merged = tmp_path / "adapter", tmp_path / "merged"
    _tune(work, adapter, "--holdout", "0", "--lr", "1e-2", "--adapter-only", code=0)
    _tune(work, merged, "--holdout", "0", "--lr", "1e-2", code=0)
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "tiny-model"
    assert not (adapter / "README.md").exists()  # peft's card repeats the path
    for path in adapter.iterdir():
        assert str(work) not in path.read_bytes().decode("utf-8", "replace"), path.name
    cards = [json.loads((p / "pcd-tune.json").read_text()) for p in (adapter, merged)]
    assert cards[0]["adapter_sha256"] == cards[1]["adapter_sha256"]  # one seed, one adapter
    (work / "in.jsonl").write_text('{"id": "n1", "text": "The box was grey."}\n')
    twice = pcd("label", work / "in.jsonl", "-s", work / "schema.yaml", "--model", merged, "--adapter", adapter,
                "--device", "cpu", "-o", tmp_path / "twice.parquet", "--no-progress", code=None)
    assert twice.exit_code == 3
    assert f"--adapter '{adapter}' is already merged into --model '{merged}'" in flat(twice.output)
    on_base = pcd("label", work / "in.jsonl", "-s", work / "schema.yaml", "--model", work / "tiny-model",
                  "--adapter", adapter, "--device", "cpu", "-o", tmp_path / "ok.parquet", "--no-progress", code=None)
    assert on_base.exit_code == 0 and "warning" not in on_base.output.lower(), on_base.output


@pytest.mark.full  # the case as written, on the embedded model (about 3 min here)
def test_case_tune_diverged_on_the_embedded_model(tmp_path):
    if not CASE.is_dir():
        pytest.skip("the case folder ../shared/cases-round4 is not here")
    env = dict(os.environ, PCD=str(Path(sys.executable).with_name("pcd")), PY=sys.executable)
    run = subprocess.run(["bash", str(CASE / "run.sh")], capture_output=True, text=True, env=env, timeout=900)
    text = flat(run.stdout)
    assert "tune exit=2" in text and "holds files pcd did not write (NOTES.md, eval/report.json)" in text
    after = run.stdout.split("--- after: models/current holds")[1].split("card:")[0].split()
    assert after == ["./NOTES.md", "./eval/report.json", "./pcd-tune.json"]  # untouched
    # (A) on a new folder: the embedded model's collapse (mass 0.583 -> 6e-05 in epoch 1 on the quoted prompt) fails the run
    out = tmp_path / "fresh"
    diverged = pcd("tune", CASE / "gold.jsonl", "-s", CASE / "schema.yaml", "-o", out, "--epochs", "2", "--lr", "1e6",
                   "--holdout", "0.34", "--no-progress", code=None)
    assert diverged.exit_code == 2, diverged.output
    collapsed = re.search(r"error: training diverged in epoch 1: field 'sentiment': the candidate mass collapsed "
                          r"from (0\.\d+) to ([0-9.e+-]+) on the holdout", flat(diverged.output))
    assert collapsed and float(collapsed[1]) > 0.5 and float(collapsed[2]) < 1e-3, diverged.output
    assert not out.exists()


def test_few_gold_rows_tune_six_epochs_by_default(work, tmp_path):
    """Without --epochs, 6 gold rows (under tune.FEW_ROWS) get a budget of 6 epochs, as the
    learning curve chose, with --patience 2 (every epoch with --patience 0); --epochs still wins."""
    base = ("tune", work / "gold.jsonl", "-s", work / "schema.yaml", "--model", work / "tiny-model",
            "--device", "cpu", "--rank", "4", "--no-progress", "--holdout", "0.34")
    default = pcd(*base, "-o", tmp_path / "default", code=0)
    card = json.loads((tmp_path / "default" / "pcd-tune.json").read_text())
    assert card["hyperparameters"]["epochs"] == 6 and card["hyperparameters"]["patience"] == 2, default.output
    last = card["epochs"][-1]["epoch"]
    assert last == 6 if card["stopped_early"] is None else last == card["stopped_early"] == card["best_epoch"] + 2
    pcd(*base, "-o", tmp_path / "every", "--patience", "0", code=0)
    every = json.loads((tmp_path / "every" / "pcd-tune.json").read_text())
    assert len(every["epochs"]) == 7 and every["stopped_early"] is None  # epoch 0 (the base model) and six more
    pcd(*base, "-o", tmp_path / "two", "--epochs", "2", code=0)
    assert json.loads((tmp_path / "two" / "pcd-tune.json").read_text())["hyperparameters"]["epochs"] == 2


def test_tune_keeps_no_calibration_its_own_cross_validation_calls_worse():
    """fit_tune_calibration writes a field's calibration only when held_out_worse finds nothing
    (the demo's tune wrote one that raised the held-out NLL 0.534 -> 0.549, and pcd label then
    warned on every run): already-calibrated holdout probabilities are left raw, over-confident
    ones are calibrated."""
    from pcd_cli.quality.calibration import fit_trusted, held_out_worse
    from pcd_cli.schema.load import parse_schema
    from pcd_cli.tune import TuneResult, fit_tune_calibration

    schema = parse_schema({"name": "reviews", "fields": {"sentiment": {"type": "enum",
                                                                       "labels": ["NEGATIVE", "NEUTRAL", "POSITIVE"]}}})
    metadata = {"pcd.schema_sha256": "s", "pcd.prompt_head_sha256": "h", "pcd.scoring": "marginal"}
    outcomes = []
    for sharpen, n in ((1.0, 15), (1.0, 20), (4.0, 200)):
        rng = np.random.default_rng(3)
        p = rng.dirichlet(np.ones(3) * 0.7, size=n)
        gold = np.array([rng.choice(3, p=row) for row in p])
        written = p ** sharpen / (p ** sharpen).sum(1, keepdims=True)
        result = TuneResult(epochs=[], best_epoch=0, train_rows=100, holdout_rows=n,
                            holdout_predictions={0: (written, gold)})
        calibration, notes = fit_tune_calibration(result, schema, metadata, model="m")
        worse = held_out_worse(fit_trusted("sentiment", ("NEGATIVE", "NEUTRAL", "POSITIVE"), written, gold).cv)
        assert (calibration is None) == bool(worse), (sharpen, n, worse, notes)
        if worse:
            assert "not calibrated, the raw probabilities are kept" in notes[0] and worse[0] in notes[0]
        outcomes.append(bool(worse))
    assert outcomes[-1] is False and True in outcomes  # both paths met: over-confident rows are calibrated
