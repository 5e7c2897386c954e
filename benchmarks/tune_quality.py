"""``pcd tune`` against the baseline a data scientist would try, on held-out human labels.

    python benchmarks/tune_quality.py [--sets sms_spam,airline_tweets,intents,trec_questions]
                                      [--epochs 3] [--json benchmarks/tune_quality.json]

For each labelled set of ../shared/data: one seeded, stratified split (60 % train, 40 %
test; seed 0). Everything is fitted on the train rows only and every figure is measured on
the test rows:

* majority: always the most frequent train label;
* TF-IDF + logistic regression (scikit-learn, word 1-2-grams, C=10, balanced class weights),
  trained on the train rows;
* zero-shot: ``pcd label`` with the schema alone on the embedded model;
* +tune: ``pcd tune`` on the train rows (its own stratified 20 % holdout picks the epoch),
  written as a merged model folder and loaded back like ``pcd label --model DIR``;
* +tune +calibration: ``pcd calibrate`` fitted on the tuned model's labels of that inner
  holdout (rows the adapter never trained on), applied to the test rows.

Also: training seconds, seconds per labelled record before/after tuning (same process, same
rows), peak resident memory. One split, not 5-fold cross-validation: a 5-fold run of the
tuner costs about 5x this run's ~30 minutes on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pcd_cli.api import Labeler  # noqa: E402
from pcd_cli.backends import load_backend  # noqa: E402
from pcd_cli.io.readers import InputSpec  # noqa: E402
from pcd_cli.quality import fit_calibration  # noqa: E402
from pcd_cli.quality import metrics as M  # noqa: E402
from pcd_cli.schema.load import load_schema
from pcd_cli.tune import TuneConfig, gold_records, stratified_holdout, tune  # noqa: E402

from quality import DATA  # noqa: E402  (benchmarks/quality.py: the same data folder and set table)
from quality import SETS as QUALITY_SETS  # noqa: E402

#: The sets of benchmarks/quality.py that the tune benchmark runs (file, schema, field).
SETS = {name: QUALITY_SETS[name] for name in ("sms_spam", "airline_tweets", "intents", "trec_questions")}


def scores(probs: np.ndarray, gold: np.ndarray, labels) -> dict:
    pred = probs.argmax(1)
    return {"accuracy": M.accuracy(gold, pred), "macro_f1": M.macro_f1(M.label_scores(gold, pred, labels)),
            "ece": M.ece(probs.max(1), pred == gold), "nll": M.nll(probs, gold)}


def label_probs(labeler: Labeler, rows: pd.DataFrame, field: str) -> tuple[np.ndarray, float, pd.DataFrame]:
    started = time.perf_counter()
    frame = labeler.label_frame(rows, id_field="id", all_probs=True)
    seconds = (time.perf_counter() - started) / len(rows)
    probs = np.array([[p for _, p in cell] for cell in frame[f"{field}__probs"]])
    return probs, seconds, frame


def baseline(train: pd.DataFrame, test: pd.DataFrame, field: str, labels) -> tuple[dict, float]:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    started = time.perf_counter()
    model = make_pipeline(TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=1),
                          LogisticRegression(C=10, max_iter=2000, class_weight="balanced"))
    y = np.array([labels.index(str(v).lower() if isinstance(v, bool) else v) for v in train[field]])
    model.fit(train["text"], y)
    seconds = time.perf_counter() - started
    probs = np.zeros((len(test), len(labels)))
    probs[:, model.classes_] = model.predict_proba(test["text"])
    gold = np.array([labels.index(str(v).lower() if isinstance(v, bool) else v) for v in test[field]])
    return scores(probs, gold, labels), seconds


def run_set(name: str, epochs: int, lr: float) -> dict:
    data_file, schema_file, field = SETS[name]
    schema = load_schema(ROOT / "schemas" / schema_file)
    f = schema.fields[schema.field_index(field)]
    rows = pd.read_json(DATA / data_file, lines=True, dtype=False)[["id", "text", field]]
    spec = InputSpec(text_field="text", id_field="id")
    gold_all = [f.label_index(v) for v in rows[field]]
    test_idx = stratified_holdout(gold_all, 0.4, 0)
    test = rows.iloc[test_idx].reset_index(drop=True)
    train = rows.drop(index=rows.index[test_idx]).reset_index(drop=True)
    gold_test = np.array([f.label_index(v) for v in test[field]])
    gold_train = np.array([f.label_index(v) for v in train[field]])
    out: dict = {"rows": {"train": len(train), "test": len(test)}}
    majority = int(np.bincount(gold_train, minlength=len(f.labels)).argmax())
    out["majority"] = {"accuracy": float((gold_test == majority).mean()), "label": f.labels[majority]}
    out["tfidf_logreg"], out["baseline_train_seconds"] = baseline(train, test, field, f.labels)

    backend = load_backend(None, device="cpu", dtype="float32")
    zero = Labeler(schema, backend=backend)
    probs, out["seconds_per_record_before"], _ = label_probs(zero, test, field)
    out["zero_shot"] = scores(probs, gold_test, f.labels)

    records, labels, _ = gold_records(train, schema, spec)
    config = TuneConfig(epochs=epochs, lr=lr, seed=0)
    started = time.perf_counter()
    result, trainer = tune(backend, schema, records, labels, config,
                           on_epoch=lambda e: print(f"  {name} epoch {e.epoch}: loss {e.train_loss} holdout "
                                                    f"{ {k: round(v.accuracy or 0, 3) for k, v in e.holdout.items()} }",
                                                    file=sys.stderr, flush=True))
    out["tune_seconds"] = time.perf_counter() - started
    out["tune_epochs"] = [{"epoch": e.epoch, "train_loss": e.train_loss, "holdout_accuracy": e.holdout[field].accuracy,
                           "holdout_nll": e.holdout[field].nll, "seconds": e.seconds} for e in result.epochs]
    out["best_epoch"] = result.best_epoch
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "tuned"
        trainer.save(folder, adapter_only=False, card={})
        del trainer, backend, zero
        tuned_backend = load_backend(str(folder), device="cpu", dtype="float32")
        tuned = Labeler(schema, backend=tuned_backend)
        probs, out["seconds_per_record_after"], _ = label_probs(tuned, test, field)
        out["tune"] = scores(probs, gold_test, f.labels)
        # calibration on the inner holdout (never trained on), applied to the test rows
        inner = stratified_holdout([lab[0] for lab in labels], config.holdout, config.seed)
        inner_rows = train.iloc[inner].reset_index(drop=True)
        _, _, inner_frame = label_probs(tuned, inner_rows, field)
        calibration, _ = fit_calibration(inner_frame, inner_rows, schema, tuned.metadata(), id_field="id", folds=2,
                                         seed=0)
        cal = calibration.fields[field]
        calibrated = np.array([cal.apply(row) for row in probs])
        out["tune_calibrated"] = scores(calibrated, gold_test, f.labels)
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def _f(value) -> str:
    return "  -  " if value is None else f"{value:.3f}"


def render(results: dict) -> str:
    lines = [f"{'set':15} {'configuration':22} {'acc':>5} {'F1':>5} {'ECE':>5}  notes", "-" * 78]
    for name, r in results.items():
        rows = [("majority", r["majority"], f"always {r['majority']['label']}"),
                ("TF-IDF + logreg", r["tfidf_logreg"], f"trained in {r['baseline_train_seconds']:.1f} s"),
                ("zero-shot", r["zero_shot"], f"{r['seconds_per_record_before']:.3f} s/record"),
                ("+tune", r["tune"], f"{r['tune_seconds']:.0f} s training, best epoch {r['best_epoch']}; "
                                     f"{r['seconds_per_record_after']:.3f} s/record"),
                ("+tune +calibration", r["tune_calibrated"], "calibrated on the tuner's holdout")]
        for i, (config, m, note) in enumerate(rows):
            lines.append(f"{name if i == 0 else '':15} {config:22} {_f(m.get('accuracy'))} {_f(m.get('macro_f1'))} "
                         f"{_f(m.get('ece'))}  {note}")
        lines.append(f"{'':15} train {r['rows']['train']} / test {r['rows']['test']} rows; peak RSS "
                     f"{r['peak_rss_mb']:.0f} MB")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", default=",".join(SETS))
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "tune_quality.json")
    args = parser.parse_args()
    results = json.loads(args.json.read_text())["sets"] if args.json.exists() else {}
    for name in args.sets.split(","):
        started = time.perf_counter()
        results[name] = run_set(name, args.epochs, args.lr)
        print(f"{name}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
        args.json.write_text(json.dumps({"model": "smollm2-135m-instruct", "epochs": args.epochs, "lr": args.lr,
                                         "split": "stratified 60/40, seed 0", "sets": results}, indent=2))
    print(render(results))


if __name__ == "__main__":
    main()
