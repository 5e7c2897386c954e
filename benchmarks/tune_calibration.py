"""Which calibration ``pcd tune`` can trust from a few gold rows (issue 29 item 2).

    python benchmarks/tune_calibration.py --sets airline_tweets,trec_questions --train-rows 100 --folds 3

Per set, one seeded split: ``--train-rows`` gold rows to tune on (a seeded shuffle of what the
stratified test split leaves), every other row of the set a test row (airline and SMS: 300,
TREC: 200, intents: 50). On the same training rows:

* ``tfidf_logreg``: the baseline a data scientist would try (``tune_quality.baseline_probs``);
* ``holdout``: ``pcd tune`` with its defaults: a 20 % holdout picks the epoch and its rows (about
  20 of 100) fit the calibration (``fit_tune_calibration``);
* ``cross_fit``: ``pcd tune --cross-fit K``: K fold runs give all training rows an out-of-fold
  prediction, the calibration is fitted on all of them, the written model trains on all rows
  for the folds' median kept epoch.

Each tuned model labels the test rows (never seen by training, epoch choice or calibration):
accuracy, macro-F1, NLL, ECE with its 95 % bootstrap interval and mean candidate mass, raw
(``--no-calibration``), with the calibration tune writes (``calibrated``: a field whose fit its
own cross-validation calls worse is left raw) and with the fitted calibration always applied
(``calibrated_always``), plus the base model's figures and every run's seconds. Results go to
``benchmarks/quality.json``'s ``tune`` section under ``--tag`` (default ``cross_fit``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from tune_quality import baseline_probs, ece_figures, epoch_printer, label_probs, load_set, mass_scores, save_tune_section, scores  # noqa: E402

from pcd_cli.api import Labeler  # noqa: E402
from pcd_cli.backends import load_backend  # noqa: E402
from pcd_cli.io.readers import InputSpec  # noqa: E402
from pcd_cli.quality.calibration import fit_trusted  # noqa: E402
from pcd_cli.tune import TuneConfig, default_epochs, fit_tune_calibration, gold_records, stratified_holdout, tune  # noqa: E402


def split(name: str, train_rows: int):
    rows, schema, field, f, gold_all = load_set(name)
    test_idx = stratified_holdout(gold_all.tolist(), 1 - train_rows / len(rows), 0)
    test = rows.iloc[test_idx].reset_index(drop=True)
    pool = rows.drop(index=rows.index[test_idx]).reset_index(drop=True)
    train = pool.iloc[np.random.default_rng(0).permutation(len(pool))[:train_rows]].reset_index(drop=True)
    return schema, field, f, train, test, np.array([f.label_index(v) for v in test[field]])


#: ``--save-predictions``: where ``tuned_scores`` writes each run's per-row arrays (``None``: nowhere).
SAVE_DIR: Path | None = None


def tuned_scores(schema, field, f, train, test, gold, config: TuneConfig, tag: str) -> dict:
    """Tune on ``train`` with ``config``; the tuned model's test figures raw / calibrated."""
    backend = load_backend(None, device="cpu", dtype="float32")
    records, labels, _ = gold_records(train, schema, InputSpec(text_field="text", id_field="id"))
    started = time.perf_counter()
    result, trainer = tune(backend, schema, records, labels, config,
                           on_epoch=epoch_printer(tag),
                           on_fold=lambda *a: print(f"  {tag} run {a}", file=sys.stderr, flush=True))
    out: dict = {"tune_seconds": time.perf_counter() - started, "best_epoch": result.best_epoch,
                 "stopped_early": result.stopped_early,
                 "holdout_nll": [float(np.mean([s.nll for s in e.holdout.values()])) if e.holdout else None
                                 for e in result.epochs],
                 "cross_fit": result.cross_fit, "calibration_rows": int(len(result.holdout_predictions[0][1])),
                 "warnings": list(result.warnings)}
    labeler = Labeler(schema, backend=backend)
    calibration, notes = fit_tune_calibration(result, schema, labeler.metadata(), model="tuned", seed=0)
    probs, out["seconds_per_record"], frame = label_probs(labeler, test, field)
    mass = frame[f"{field}__mass"].to_numpy()
    out["raw"] = mass_scores(probs, mass, gold, f.labels)
    held_probs, held_gold = result.holdout_predictions[0]
    fitted = fit_trusted(field, f.labels, held_probs, held_gold, seed=0)
    out["fitted"] = {"method": fitted.cv["method"], "temperature": fitted.temperature, "n": fitted.n,
                     "cv_before": fitted.cv["before"], "cv_after": fitted.cv["after"]}
    out["calibrated_always"] = mass_scores(fitted.apply(probs), mass, gold, f.labels)
    written = calibration is not None and field in calibration.fields
    out["written"] = written
    out["notes"] = notes
    out["calibrated"] = out["calibrated_always"] if written else out["raw"]
    if SAVE_DIR is not None:  # per-row arrays: calibrations can be refitted without training again
        SAVE_DIR.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(SAVE_DIR / f"{tag.replace(' ', '.')}.npz", test_probs=probs, test_gold=gold,
                            test_mass=mass, holdout_probs=held_probs, holdout_gold=held_gold)
    del trainer, labeler, backend
    return out


def run_set(name: str, train_rows: int, folds: int, runs: tuple[str, ...] = ("holdout", "cross_fit"),
            epochs: int | None = None, patience: int = 0) -> dict:
    schema, field, f, train, test, gold = split(name, train_rows)
    started = time.perf_counter()
    out: dict = {"train_rows": len(train), "test_rows": len(test)}
    probs_b, out["baseline_train_seconds"] = baseline_probs(train, test, field, f.labels)
    out["tfidf_logreg"] = scores(probs_b, gold, f.labels) | ece_figures(probs_b, gold)
    probs, seconds, frame = label_probs(Labeler(schema, backend=load_backend(None, device="cpu", dtype="float32")),
                                        test, field)
    out["base"] = mass_scores(probs, frame[f"{field}__mass"].to_numpy(), gold, f.labels) | {
        "seconds_per_record": seconds}
    epochs = epochs or default_epochs(len(train))
    configs = {"holdout": TuneConfig(epochs=epochs, seed=0, patience=patience),
               "cross_fit": TuneConfig(epochs=epochs, seed=0, cross_fit=folds, patience=patience)}
    for run in runs:
        out[run] = tuned_scores(schema, field, f, train, test, gold, configs[run], f"{name} {run}")
    out["wall_seconds"] = time.perf_counter() - started
    return out


def _f(v) -> str:
    return "  -  " if v is None else f"{v:.3f}"


def render(results: dict) -> str:
    lines = [f"{'set':16} {'run':22} {'acc':>6} {'F1':>6} {'NLL':>6} {'ECE':>6} {'ECE 95% CI':>14} {'chance':>13} "
             f"{'mass':>6} {'cal rows':>8} {'s':>6}",
             "(chance: the ECE a perfectly calibrated model with these probabilities shows on these test rows, "
             "mean/95th percentile)"]
    for name, r in results.items():
        def row(label, m, rows="", secs=None):
            ci = m.get("ece_ci") or [None, None]
            floor = m.get("ece_floor") or [None, None]
            lines.append(f"{name:16} {label:22} {_f(m['accuracy'])} {_f(m['macro_f1'])} {_f(m['nll'])} "
                         f"{_f(m['ece'])} [{_f(ci[0])},{_f(ci[1])}] {_f(floor[0])}/{_f(floor[1])} "
                         f"{_f(m.get('mean_mass'))} {rows:>8} "
                         f"{'' if secs is None else f'{secs:.0f}':>6}")
        row("tfidf_logreg", r["tfidf_logreg"])
        row("base", r["base"])
        for run in ("holdout", "cross_fit"):
            if run not in r:
                continue
            t = r[run]
            row(f"{run} raw", t["raw"], str(t["calibration_rows"]), t["tune_seconds"])
            row(f"{run} calibrated" + ("" if t["written"] else " (raw)"), t["calibrated"])
            row(f"{run} cal. always", t["calibrated_always"])
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", default="airline_tweets,trec_questions,sms_spam,intents")
    parser.add_argument("--train-rows", type=int, default=100)
    parser.add_argument("--folds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "quality.json")
    parser.add_argument("--tag", default="cross_fit")
    parser.add_argument("--runs", default="holdout,cross_fit", help="which tunes: holdout, cross_fit or both")
    parser.add_argument("--epochs", type=int, default=None, help="the epoch budget (default pcd tune's)")
    parser.add_argument("--patience", type=int, default=0, help="pcd tune --patience")
    parser.add_argument("--save-predictions", type=Path, default=None, help="a folder: each tuned run's test and "
                        "holdout probabilities as <set>.<run>.npz")
    args = parser.parse_args()
    global SAVE_DIR
    SAVE_DIR = args.save_predictions
    meta = {"model": "smollm2-135m-instruct", "train_rows": args.train_rows, "folds": args.folds,
            "epochs": args.epochs or default_epochs(args.train_rows), "patience": args.patience,
            "cpu": "2 cores, nice 19, 1 torch thread"}
    results: dict = {}
    for name in args.sets.split(","):
        results[name] = run_set(name, args.train_rows, args.folds, tuple(args.runs.split(",")), args.epochs,
                                args.patience)
        old = json.loads(args.json.read_text()).get("tune", {}).get(args.tag, {}) if args.json.exists() else {}
        save_tune_section(args.json, args.tag, meta, old.get("sets", {}) | results)  # other sets of the tag kept
        print(render({name: results[name]}), flush=True)
    print(render(results))


if __name__ == "__main__":
    main()
