"""``pcd tune`` against the baseline a data scientist would try, on held-out human labels.

    python benchmarks/tune_quality.py [--sets sms_spam,airline_tweets,intents,trec_questions]
                                      [--epochs 3] [--json benchmarks/tune_quality.json]
    python benchmarks/tune_quality.py --sets airline_tweets,sms_spam --mass-weights 0,1 --epochs 2 \
                                      --max-rows 300 --json benchmarks/tune_mass.json

With ``--mass-weights W1,W2,...`` (issue 29: mass kept, calibrated by construction) each set is
tuned once per ``--mass-weight`` from the same base model and split, and every tune is scored
on the test rows for mean candidate mass (before: the base model; after: each tune), accuracy,
macro-F1 and ECE raw and with the calibration ``pcd tune`` writes into its folder
(``fit_tune_calibration``, fitted on the tuner's own holdout, never on test rows), ECE with
its 95 % percentile-bootstrap interval (``metrics.bootstrap_interval``, 1000 resamples), and
``flips_when_reversed``: test rows whose label changes when the schema's enum list is reversed
(``prior_correction.reversed_schema``; a boolean's order is fixed, so 0 there by construction).

    python benchmarks/tune_quality.py --sets airline_tweets --order --epochs 2 --max-rows 300 \
                                      --json benchmarks/tune_order.json

With ``--order`` (issue 29 item 4) the set is tuned twice, plainly and with ``--permutations 2``
(the label list and its reversal, each a loss term), and each model, the base model included,
is read on the test rows with one ordering at a time: ``flips`` counts the rows whose label
changes between the list and its reversal (each read alone, values listed after the record as
``--permutations`` lists them); ``plain_flips`` the same for the plain prompt (values in the
system catalog, schema list reversed). Accuracy is that of the prompt the model was tuned for.

    python benchmarks/tune_quality.py --sets intents,airline_tweets --train-rows 50,100,200,400
    python benchmarks/tune_quality.py --sets intents,sms_spam,trec_questions,airline_tweets \
                                      --folds 3 --max-rows 150

Both write into ``benchmarks/quality.json``'s ``tune`` section (``learning_curve`` / ``kfold``,
or ``--tag``; the zero-shot and calibration figures of ``benchmarks/quality.py`` are kept),
with ``pcd tune``'s default options unless ``--epochs`` says otherwise, every tune beside the
TF-IDF + logistic regression baseline fitted on the same training rows and scored on the same
test rows (``tune_split``): accuracy, macro-F1, ECE with its bootstrap interval, mean
candidate mass, train seconds; tuned raw and with the calibration tune writes.

* ``--train-rows`` (issue 29 item 3, learning curve): one stratified test split
  (``--test-fraction``, 0.25, seed 0); nested training sets of each size drawn from a seeded
  shuffle of the remaining rows (a size above what remains takes all of it: airline has 300,
  intents 112).
* ``--folds K`` (item 5): stratified K-fold (seed 0) over the first ``--max-rows`` rows; every
  row is predicted once by the tune that did not train on it, and the figures are those of
  the pooled out-of-fold predictions (accuracy with its Wilson interval), costs per fold.

    OMP_NUM_THREADS=1 python benchmarks/tune_quality.py --sets bbc_news --split 100,50
    OMP_NUM_THREADS=1 python benchmarks/tune_quality.py --sets drug_reviews --split 48,100

* ``--split TRAIN,TEST`` (item 5, the long-text sets BBC news and drug reviews, whose tunes
  cost ~10-25 min each here, too much for k folds): one seeded split, ``TEST`` rows drawn
  stratified on the schema's first field, ``TRAIN`` rows from a seeded shuffle of the rest,
  ``pcd tune``'s default epochs unless ``--epochs``; every field of the set's schema is scored
  (``run_split_set``). The drug reviews use ``schemas/drug_review.yaml``: sentiment (3
  labels) and condition (99 labels, most with one or two rows; a label seen only in the test
  rows counts as an error for every model, and the baseline gives it probability 0). Written
  to the ``tune`` section under ``one_split_long`` (or ``--tag``), one set at a time, the
  file re-read just before each write.

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

from prior_correction import reversed_schema  # noqa: E402
from quality import DATA  # noqa: E402  (benchmarks/quality.py: the same data folder and set table)
from quality import SETS as QUALITY_SETS  # noqa: E402

from pcd_cli.api import Labeler  # noqa: E402
from pcd_cli.backends import load_backend  # noqa: E402
from pcd_cli.io.readers import InputSpec  # noqa: E402
from pcd_cli.quality import fit_calibration  # noqa: E402
from pcd_cli.quality import metrics as M  # noqa: E402
from pcd_cli.results import Record  # noqa: E402
from pcd_cli.schema.load import load_schema
from pcd_cli.tune import TuneConfig, fit_tune_calibration, gold_records, stratified_holdout, tune  # noqa: E402

#: The sets of benchmarks/quality.py that the tune benchmark runs (file, schema, field).
SHORT_SETS = ("sms_spam", "airline_tweets", "intents", "trec_questions")
SETS = {name: QUALITY_SETS[name] for name in (*SHORT_SETS, "bbc_news")}
#: Sets scored on every field of their schema (``--split``): the drug reviews' two gold fields.
MULTI_FIELD_SETS = {"drug_reviews": ("drug_reviews.dev.jsonl", "drug_review.yaml", ("sentiment", "condition"))}


def scores(probs: np.ndarray, gold: np.ndarray, labels) -> dict:
    pred = probs.argmax(1)
    return {"accuracy": M.accuracy(gold, pred), "macro_f1": M.macro_f1(M.label_scores(gold, pred, labels)),
            "ece": M.ece(probs.max(1), pred == gold), "nll": M.nll(probs, gold)}


def epoch_printer(tag: str):
    """An ``on_epoch`` callback printing each epoch's loss and holdout (accuracy, NLL) per field to stderr."""
    return lambda e: print(f"  {tag} epoch {e.epoch}: loss {e.train_loss} holdout "
                           f"{ {k: (round(v.accuracy or 0, 3), round(v.nll or 0, 3)) for k, v in e.holdout.items()} }",
                           file=sys.stderr, flush=True)


def ece_interval(probs: np.ndarray, gold: np.ndarray) -> list[float] | None:
    """95 % percentile-bootstrap interval of the ECE (rows resampled, ``metrics.bootstrap_interval``)."""
    pred = probs.argmax(1)
    ci = M.bootstrap_interval(lambda c, k: M.ece(c, k), (probs.max(1), (pred == gold).astype(float)))
    return list(ci) if ci is not None else None


def ece_figures(probs: np.ndarray, gold: np.ndarray) -> dict:
    """The ECE's 95 % bootstrap interval (``ece_ci``) and the ECE a perfectly calibrated model
    with these probabilities shows on these rows by chance (``ece_floor``: mean, 95th
    percentile; ``metrics.ece_noise_floor``)."""
    floor = M.ece_noise_floor(probs.max(1))
    return {"ece_ci": ece_interval(probs, gold), "ece_floor": list(floor) if floor is not None else None}


def mass_scores(probs: np.ndarray, mass: np.ndarray, gold: np.ndarray, labels, min_mass: float = 0.5) -> dict:
    """``scores`` plus ``ece_figures``, mean candidate mass and share of rows below ``min_mass``."""
    return scores(probs, gold, labels) | ece_figures(probs, gold) | {
        "mean_mass": float(mass.mean()), "below_min_mass": float((mass < min_mass).mean())}


def flips_when_reversed(schema, backend, rows: pd.DataFrame, field: str, frame: pd.DataFrame) -> int | None:
    """Rows of ``frame`` (labelled with ``schema``) whose label changes under the reversed enum list."""
    if all(f.is_boolean for f in schema.fields):
        return None
    back = Labeler(reversed_schema(schema), backend=backend).label_frame(rows, id_field="id", all_probs=False)
    return int((frame[field].astype(str).to_numpy() != back[field].astype(str).to_numpy()).sum())


def label_probs(labeler: Labeler, rows: pd.DataFrame, field: str) -> tuple[np.ndarray, float, pd.DataFrame]:
    started = time.perf_counter()
    frame = labeler.label_frame(rows, id_field="id", all_probs=True)
    seconds = (time.perf_counter() - started) / len(rows)
    probs = np.array([[p for _, p in cell] for cell in frame[f"{field}__probs"]])
    return probs, seconds, frame


def baseline_probs(train: pd.DataFrame, test: pd.DataFrame, field: str, labels) -> tuple[np.ndarray, float]:
    """TF-IDF + logistic regression fitted on ``train``: its (test rows, labels) probabilities
    and training seconds (a label absent from ``train`` gets probability 0)."""
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
    return probs, seconds


def baseline(train: pd.DataFrame, test: pd.DataFrame, field: str, labels) -> tuple[dict, float]:
    probs, seconds = baseline_probs(train, test, field, labels)
    gold = np.array([labels.index(str(v).lower() if isinstance(v, bool) else v) for v in test[field]])
    return scores(probs, gold, labels), seconds


def run_mass_set(name: str, epochs: int, lr: float, weights: list[float], max_rows: int | None,
                 holdout: float) -> dict:
    """One set, one split: the baseline, the base model and one tune per mass weight (see the
    module's docstring), every figure on the test rows."""
    rows, schema, field, f, gold_all = load_set(name, max_rows)
    spec = InputSpec(text_field="text", id_field="id")
    test_idx = stratified_holdout(gold_all.tolist(), 0.4, 0)
    test = rows.iloc[test_idx].reset_index(drop=True)
    train = rows.drop(index=rows.index[test_idx]).reset_index(drop=True)
    gold_test = np.array([f.label_index(v) for v in test[field]])
    out: dict = {"rows": {"train": len(train), "test": len(test)}, "holdout": holdout}
    out["tfidf_logreg"], out["baseline_train_seconds"] = baseline(train, test, field, f.labels)
    records, labels, _ = gold_records(train, schema, spec)
    for weight in weights:
        backend = load_backend(None, device="cpu", dtype="float32")
        if "base" not in out:
            base = Labeler(schema, backend=backend)
            probs, out["seconds_per_record_before"], frame = label_probs(base, test, field)
            out["base"] = mass_scores(probs, frame[f"{field}__mass"].to_numpy(), gold_test, f.labels)
            out["base"]["flips_when_reversed"] = flips_when_reversed(schema, backend, test, field, frame)
        config = TuneConfig(epochs=epochs, lr=lr, seed=0, holdout=holdout, mass_weight=weight)
        started = time.perf_counter()
        result, trainer = tune(backend, schema, records, labels, config,
                               on_epoch=lambda e: print(f"  {name} w={weight} epoch {e.epoch}: loss {e.train_loss} "
                                                        f"holdout { {k: (round(v.accuracy or 0, 3), round(v.mass or 0, 3)) for k, v in e.holdout.items()} }",
                                                        file=sys.stderr, flush=True))
        run: dict = {"tune_seconds": time.perf_counter() - started, "best_epoch": result.best_epoch,
                     "holdout_rows": result.holdout_rows}
        run["epochs"] = [{"epoch": e.epoch, "train_loss": e.train_loss, "holdout_accuracy": e.holdout[field].accuracy,
                          "holdout_nll": e.holdout[field].nll, "holdout_mass": e.holdout[field].mass}
                         for e in result.epochs]
        tuned = Labeler(schema, backend=backend)  # the adapter is live in backend's model: labels as the folder does
        calibration, notes = fit_tune_calibration(result, schema, tuned.metadata(), model="tuned", seed=0)
        probs, run["seconds_per_record_after"], frame = label_probs(tuned, test, field)
        mass = frame[f"{field}__mass"].to_numpy()
        run["raw"] = mass_scores(probs, mass, gold_test, f.labels)
        run["raw"]["flips_when_reversed"] = flips_when_reversed(schema, backend, test, field, frame)
        if calibration is not None and field in calibration.fields:
            fc = calibration.fields[field]
            run["calibration"] = {"method": fc.cv["method"], "reason": fc.cv["reason"], "temperature": fc.temperature,
                                  "n": fc.n}
            run["calibrated"] = mass_scores(fc.apply(probs), mass, gold_test, f.labels)
        else:
            run["calibration"] = {"notes": notes}
        out[f"tune_w{weight:g}"] = run
        del trainer, tuned, backend
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def render_mass(results: dict) -> str:
    """The mass-weight table: per set, baseline, base model and each tune (raw and calibrated)."""
    def ci(m):
        return f"[{m['ece_ci'][0]:.3f}, {m['ece_ci'][1]:.3f}]" if m.get("ece_ci") else "-"

    lines = [f"{'set':15} {'configuration':24} {'acc':>5} {'F1':>5} {'ECE':>5} {'ECE 95% CI':>15} {'mass':>5} "
             f"{'<0.5':>5} {'flips':>5}  notes", "-" * 106]
    for name, r in results.items():
        rows = [("TF-IDF + logreg", r["tfidf_logreg"], "")]
        rows.append(("base (zero-shot)", r["base"], f"{r['seconds_per_record_before']:.3f} s/record"))
        for key, run in r.items():
            if not key.startswith("tune_w"):
                continue
            rows.append((f"tune {key[5:]}", run["raw"], f"{run['tune_seconds']:.0f} s, best epoch {run['best_epoch']}"))
            if "calibrated" in run:
                rows.append((f"tune {key[5:]} +tune's cal.", run["calibrated"],
                             f"{run['calibration']['method']}, {run['calibration']['n']} holdout rows"))
        for i, (config, m, note) in enumerate(rows):
            lines.append(f"{name if i == 0 else '':15} {config:24} {_f(m.get('accuracy'))} {_f(m.get('macro_f1'))} "
                         f"{_f(m.get('ece'))} {ci(m):>15} {_f(m.get('mean_mass'))} {_f(m.get('below_min_mass'))}"
                         f" {'-' if m.get('flips_when_reversed') is None else m['flips_when_reversed']:>5}  {note}")
        lines.append(f"{'':15} train {r['rows']['train']} / test {r['rows']['test']} rows")
    return "\n".join(lines)


def order_flips(schema, backend, test: pd.DataFrame, field: str, gold: np.ndarray) -> dict:
    """Labels of ``test`` under ordering 0 (the list) and 1 (its reversal), each read alone;
    the rows that change, and each ordering's and the combined (K = 2) accuracy."""
    from pcd_cli.decoding.decode import Decoder
    from pcd_cli.decoding.permute import combine, compile_orderings

    records = [Record(str(i), t) for i, t in zip(test["id"], test["text"])]
    orderings = compile_orderings(schema, backend.tokenizer, 2, logits_width=backend.logits_width)
    fi = schema.field_index(field)
    per = [Decoder(backend, c).decode(records) for c in orderings]
    labels = [np.array([r.fields[fi].label for r in results]) for results in per]
    combined = np.array([combine(list(pair), schema).fields[fi].label for pair in zip(*per)])
    return {"flips": int((labels[0] != labels[1]).sum()), "accuracy_list": float((labels[0] == gold).mean()),
            "accuracy_reversed": float((labels[1] == gold).mean()), "accuracy_k2": float((combined == gold).mean())}


def run_order_set(name: str, epochs: int, lr: float, weight: float, max_rows: int | None, holdout: float) -> dict:
    """One set, one split: base, plain tune and ``--permutations 2`` tune, read one ordering at a time."""
    rows, schema, field, f, gold_all = load_set(name, max_rows)
    test_idx = stratified_holdout(gold_all.tolist(), 0.4, 0)
    test = rows.iloc[test_idx].reset_index(drop=True)
    train = rows.drop(index=rows.index[test_idx]).reset_index(drop=True)
    gold_test = np.array([f.label_index(v) for v in test[field]])
    records, labels, _ = gold_records(train, schema, InputSpec(text_field="text", id_field="id"))
    out: dict = {"rows": {"train": len(train), "test": len(test)}, "mass_weight": weight}
    for key, k in (("tune_k1", 1), ("tune_k2", 2)):
        backend = load_backend(None, device="cpu", dtype="float32")
        if "base" not in out:
            out["base"] = order_flips(schema, backend, test, field, gold_test)
            _, _, frame = label_probs(Labeler(schema, backend=backend), test, field)
            out["base"]["plain_flips"] = flips_when_reversed(schema, backend, test, field, frame)
            out["base"]["accuracy_plain"] = float((frame[field].map(f.label_index).to_numpy() == gold_test).mean())
        started = time.perf_counter()
        config = TuneConfig(epochs=epochs, lr=lr, seed=0, holdout=holdout, mass_weight=weight, permutations=k)
        result, trainer = tune(backend, schema, records, labels, config,
                               on_epoch=lambda e: print(f"  {name} K={k} epoch {e.epoch}: loss {e.train_loss}",
                                                        file=sys.stderr, flush=True))
        run = {"tune_seconds": time.perf_counter() - started, "best_epoch": result.best_epoch}
        run |= order_flips(schema, backend, test, field, gold_test)
        _, _, frame = label_probs(Labeler(schema, backend=backend), test, field)
        run["plain_flips"] = flips_when_reversed(schema, backend, test, field, frame)
        run["accuracy_plain"] = float((frame[field].map(f.label_index).to_numpy() == gold_test).mean())
        out[key] = run
        del trainer, backend
    return out


def run_set(name: str, epochs: int, lr: float) -> dict:
    rows, schema, field, f, gold_all = load_set(name)
    spec = InputSpec(text_field="text", id_field="id")
    test_idx = stratified_holdout(gold_all.tolist(), 0.4, 0)
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


def load_set(name: str, max_rows: int | None = None):
    """``(rows, schema, field name, field, gold label indices)`` of a set (its first ``max_rows`` rows)."""
    data_file, schema_file, field = SETS[name]
    schema = load_schema(ROOT / "schemas" / schema_file)
    f = schema.fields[schema.field_index(field)]
    rows = pd.read_json(DATA / data_file, lines=True, dtype=False)[["id", "text", field]]
    if max_rows:
        rows = rows.iloc[:max_rows].reset_index(drop=True)
    return rows, schema, field, f, np.array([f.label_index(v) for v in rows[field]])


def read_base(schema, field: str, f, test: pd.DataFrame, gold: np.ndarray) -> tuple[dict, np.ndarray]:
    """The untuned embedded model on ``test``: ``mass_scores`` and its per-row candidate mass."""
    backend = load_backend(None, device="cpu", dtype="float32")
    probs, seconds, frame = label_probs(Labeler(schema, backend=backend), test, field)
    mass = frame[f"{field}__mass"].to_numpy()
    return mass_scores(probs, mass, gold, f.labels) | {"seconds_per_record": seconds}, mass


def tune_split(schema, field: str, f, train: pd.DataFrame, test: pd.DataFrame, gold: np.ndarray,
               config: TuneConfig, tag: str) -> tuple[dict, dict]:
    """TF-IDF + logreg and ``pcd tune`` (``config``) on the same ``train`` rows, scored on ``test``
    (tuned raw and with the calibration tune writes, ``fit_tune_calibration``). Returns the
    figures and the per-row arrays (``baseline``, ``raw``, ``calibrated`` probabilities, ``mass``)
    for pooling folds. A diverged tune (``TrainingDiverged``) is recorded, not raised."""
    from pcd_cli.tune import TrainingDiverged

    probs_b, seconds_b = baseline_probs(train, test, field, f.labels)
    out: dict = {"train_rows": len(train), "test_rows": len(test), "baseline_train_seconds": seconds_b,
                 "tfidf_logreg": scores(probs_b, gold, f.labels) | ece_figures(probs_b, gold)}
    arrays = {"baseline": probs_b}
    backend = load_backend(None, device="cpu", dtype="float32")
    records, labels, _ = gold_records(train, schema, InputSpec(text_field="text", id_field="id"))
    started = time.perf_counter()
    try:
        result, trainer = tune(backend, schema, records, labels, config, on_epoch=epoch_printer(tag))
    except TrainingDiverged as exc:
        out["tune"] = {"diverged": str(exc), "tune_seconds": time.perf_counter() - started}
        return out, arrays
    run: dict = {"tune_seconds": time.perf_counter() - started, "best_epoch": result.best_epoch,
                 "tune_train_rows": result.train_rows, "holdout_rows": result.holdout_rows,
                 "holdout_nll": [e.holdout[field].nll for e in result.epochs], "warnings": list(result.warnings)}
    tuned = Labeler(schema, backend=backend)
    calibration, notes = fit_tune_calibration(result, schema, tuned.metadata(), model="tuned", seed=0)
    probs, run["seconds_per_record"], frame = label_probs(tuned, test, field)
    arrays["raw"], arrays["mass"] = probs, frame[f"{field}__mass"].to_numpy()
    run["raw"] = mass_scores(probs, arrays["mass"], gold, f.labels)
    if calibration is not None and field in calibration.fields:
        fc = calibration.fields[field]
        run["calibration"] = {"method": fc.cv["method"], "temperature": fc.temperature, "n": fc.n}
        arrays["calibrated"] = fc.apply(probs)
        run["calibrated"] = mass_scores(arrays["calibrated"], arrays["mass"], gold, f.labels)
    else:
        run["calibration"] = {"notes": notes}
    out["tune"] = run
    del trainer, tuned, backend
    return out, arrays


def load_multi_set(name: str):
    """``(rows, schema, fields, dropped)`` of a set scored on several fields (``MULTI_FIELD_SETS``,
    or a ``SETS`` entry as one field): rows whose gold value of any field is not a label of the
    schema are left out and counted in ``dropped`` (the drug reviews' three rows whose condition
    is scraping debris, ``'2</span> users found this comment helpful.'``)."""
    data_file, schema_file, fields = MULTI_FIELD_SETS.get(name) or SETS[name]
    fields = (fields,) if isinstance(fields, str) else tuple(fields)
    schema = load_schema(ROOT / "schemas" / schema_file)
    rows = pd.read_json(DATA / data_file, lines=True, dtype=False)[["id", "text", *fields]]
    known = np.ones(len(rows), dtype=bool)
    for field in fields:
        f = schema.fields[schema.field_index(field)]
        allowed = set(f.labels)
        known &= rows[field].map(lambda v: v in allowed or (f.is_boolean and str(v).lower() in allowed)).to_numpy()
    dropped = rows.loc[~known, ["id", *fields]].to_dict("records")
    return rows[known].reset_index(drop=True), schema, fields, dropped


def run_split_set(name: str, train_rows: int, test_rows: int, epochs: int | None, lr: float) -> dict:
    """One seeded split (issue 29 item 5, the long-text sets): ``test_rows`` test rows drawn
    stratified on the schema's first field (``stratified_holdout``, seed 0; a label's share
    rounded, so the count is near ``test_rows``), the first ``train_rows`` of a seeded shuffle
    of the rest for training. Every field of the schema is scored: base model, TF-IDF + logreg
    (one per field, trained on the same rows), ``pcd tune`` with its defaults (``epochs`` None:
    ``default_epochs`` of the training rows, as ``pcd tune`` without ``--epochs``) raw and with
    the calibration it writes (``fit_tune_calibration``). A label with one row lands on one
    side of the split; the baseline gives a label absent from its training rows probability 0."""
    from pcd_cli.tune import TrainingDiverged, default_epochs

    rows, schema, fields, dropped = load_multi_set(name)
    first = schema.fields[schema.field_index(fields[0])]
    test_idx = stratified_holdout([first.label_index(v) for v in rows[fields[0]]], test_rows / len(rows), 0)
    test = rows.iloc[test_idx].reset_index(drop=True)
    pool = rows.drop(index=rows.index[test_idx]).reset_index(drop=True)
    train = pool.iloc[np.random.default_rng(0).permutation(len(pool))[:train_rows]].reset_index(drop=True)
    fs = {field: schema.fields[schema.field_index(field)] for field in fields}
    gold = {field: np.array([fs[field].label_index(v) for v in test[field]]) for field in fields}
    config = TuneConfig(epochs=epochs or default_epochs(len(train)), lr=lr, seed=0)
    out: dict = {"rows": len(rows), "dropped_rows": dropped, "train_rows": len(train), "test_rows": len(test),
                 "epochs": config.epochs, "fields": {}}
    for field, f in fs.items():
        labels_train = {f.label_index(v) for v in train[field]}
        labels_test = {int(g) for g in gold[field]}
        probs_b, seconds_b = baseline_probs(train, test, field, f.labels)
        out["fields"][field] = {
            "labels": len(f.labels), "labels_in_train": len(labels_train), "labels_in_test": len(labels_test),
            "test_rows_label_unseen_in_train": int(sum(g not in labels_train for g in gold[field])),
            "baseline_train_seconds": seconds_b,
            "tfidf_logreg": scores(probs_b, gold[field], f.labels) | ece_figures(probs_b, gold[field])}
    backend = load_backend(None, device="cpu", dtype="float32")

    def read(labeler: Labeler) -> tuple[dict, dict, float]:
        started = time.perf_counter()
        frame = labeler.label_frame(test, id_field="id", all_probs=True)
        seconds = (time.perf_counter() - started) / len(test)
        probs = {field: np.array([[p for _, p in cell] for cell in frame[f"{field}__probs"]]) for field in fields}
        return probs, {field: frame[f"{field}__mass"].to_numpy() for field in fields}, seconds

    probs, mass_before, out["seconds_per_record_before"] = read(Labeler(schema, backend=backend))
    for field in fields:
        out["fields"][field]["base"] = mass_scores(probs[field], mass_before[field], gold[field], fs[field].labels)
    records, labels, _ = gold_records(train, schema, InputSpec(text_field="text", id_field="id"))
    started = time.perf_counter()
    try:
        result, trainer = tune(backend, schema, records, labels, config, on_epoch=epoch_printer(name))
    except TrainingDiverged as exc:
        out["tune"] = {"diverged": str(exc), "tune_seconds": time.perf_counter() - started}
        return out
    out["tune_seconds"] = time.perf_counter() - started
    out["tune"] = {"best_epoch": result.best_epoch, "tune_train_rows": result.train_rows,
                   "holdout_rows": result.holdout_rows, "warnings": list(result.warnings),
                   "epochs": [{"epoch": e.epoch, "train_loss": e.train_loss, "seconds": e.seconds,
                               "holdout": {k: {"accuracy": v.accuracy, "nll": v.nll, "mass": v.mass}
                                           for k, v in e.holdout.items()}} for e in result.epochs]}
    tuned = Labeler(schema, backend=backend)  # the adapter is live in backend's model: labels as the folder does
    calibration, notes = fit_tune_calibration(result, schema, tuned.metadata(), model="tuned", seed=0)
    out["tune"]["calibration_notes"] = list(notes)
    probs, mass, out["seconds_per_record_after"] = read(tuned)
    for field, f in fs.items():
        r = out["fields"][field]
        r["tune_raw"] = mass_scores(probs[field], mass[field], gold[field], f.labels)
        r["mass_before"], r["mass_after"] = float(mass_before[field].mean()), float(mass[field].mean())
        if calibration is not None and field in calibration.fields:
            fc = calibration.fields[field]
            r["calibration"] = {"method": fc.cv["method"], "reason": fc.cv["reason"], "temperature": fc.temperature,
                                "n": fc.n}
            r["tune_calibrated"] = mass_scores(fc.apply(probs[field]), mass[field], gold[field], f.labels)
        else:
            r["calibration"] = None
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    del trainer, tuned, backend
    return out


def render_split(results: dict) -> str:
    """The one-split table: per set and field, base, baseline, tuned raw and calibrated."""
    lines = [f"{'set':13} {'field':10} {'configuration':16} {'acc':>5} {'F1':>5} {'ECE':>5} {'ECE 95% CI':>15} "
             f"{'mass':>5}  notes", "-" * 100]
    for name, r in results.items():
        for field, x in r["fields"].items():
            lines.append(f"{name:13} {field:10} {'base (zero-shot)':16} {_row(x['base'])}  "
                         f"{r['seconds_per_record_before']:.2f} s/record")
            lines.append(f"{'':13} {'':10} {'TF-IDF + logreg':16} {_row(x['tfidf_logreg'], mass=False)}")
            if "tune_raw" not in x:
                if "diverged" in r.get("tune", {}):
                    lines.append(f"{'':13} {'':10} {'tune':16} diverged after {r['tune']['tune_seconds']:.0f} s: "
                                 f"{r['tune']['diverged'][:70]}")
                continue
            lines.append(f"{'':13} {'':10} {'tune':16} {_row(x['tune_raw'])}  {r['tune_seconds']:.0f} s, best epoch "
                         f"{r['tune']['best_epoch']} of {r['epochs']}, {r['seconds_per_record_after']:.2f} s/record")
            if x.get("tune_calibrated"):
                lines.append(f"{'':13} {'':10} {'tune +its cal.':16} {_row(x['tune_calibrated'])}  "
                             f"{x['calibration']['method']}, {x['calibration']['n']} rows")
        lines.append(f"{'':13} train {r['train_rows']} / test {r['test_rows']} rows")
    return "\n".join(lines)


def run_curve_set(name: str, sizes: list[int], config: TuneConfig, test_fraction: float, on_point=None) -> dict:
    """Learning curve (issue 29 item 3): one stratified test split (seed 0); nested training sets
    of ``sizes`` rows (a seeded shuffle of the rest; a size over the rest left takes all of it).
    ``on_point(partial result)`` after each size (the caller saves it)."""
    rows, schema, field, f, gold = load_set(name)
    test_idx = stratified_holdout(gold.tolist(), test_fraction, 0)
    test, gold_test = rows.iloc[test_idx].reset_index(drop=True), gold[test_idx]
    pool = rows.drop(index=rows.index[test_idx]).reset_index(drop=True)
    pool = pool.iloc[np.random.default_rng(0).permutation(len(pool))].reset_index(drop=True)
    out: dict = {"rows": len(rows), "test_rows": len(test), "pool_rows": len(pool)}
    out["base"], _ = read_base(schema, field, f, test, gold_test)
    out["points"] = {}
    for n in sorted({min(n, len(pool)) for n in sizes}):
        out["points"][str(n)], _ = tune_split(schema, field, f, pool.iloc[:n], test, gold_test, config, f"{name} n={n}")
        if on_point:
            on_point(out)
    return out


def run_kfold_set(name: str, folds: int, config: TuneConfig, max_rows: int | None) -> dict:
    """Stratified k-fold (seed 0) over the first ``max_rows`` rows: baseline and tune per fold;
    pooled out-of-fold figures (every row predicted once) with the ECE's bootstrap interval."""
    from sklearn.model_selection import StratifiedKFold

    rows, schema, field, f, gold = load_set(name, max_rows)
    out: dict = {"rows": len(rows), "folds": folds}
    out["base"], mass_before = read_base(schema, field, f, rows, gold)
    pooled = {k: np.zeros((len(rows), len(f.labels))) for k in ("baseline", "raw", "calibrated")}
    pooled["mass"] = np.zeros(len(rows))
    seen = {k: np.zeros(len(rows), dtype=bool) for k in pooled}  # rows each array has (a diverged or
    out["per_fold"] = []                                          # uncalibrated fold leaves gaps)
    split = StratifiedKFold(folds, shuffle=True, random_state=0).split(np.zeros(len(rows)), gold)
    for k, (train_idx, test_idx) in enumerate(split):
        run, arrays = tune_split(schema, field, f, rows.iloc[train_idx].reset_index(drop=True),
                                 rows.iloc[test_idx].reset_index(drop=True), gold[test_idx], config, f"{name} fold {k}")
        out["per_fold"].append(run)
        for key, values in arrays.items():
            pooled[key][test_idx], seen[key][test_idx] = values, True
    for key, array in (("tfidf_logreg", "baseline"), ("tune_raw", "raw"), ("tune_calibrated", "calibrated")):
        done = seen[array]
        if not done.any():
            out[key] = None
            continue
        pred = pooled[array][done].argmax(1)
        mass = pooled["mass"][done] if array != "baseline" else np.ones(int(done.sum()))
        out[key] = mass_scores(pooled[array][done], mass, gold[done], f.labels) | {
            "rows": int(done.sum()), "accuracy_ci": M.wilson_interval(int((pred == gold[done]).sum()), int(done.sum()))}
        if array == "baseline":
            out[key]["mean_mass"] = out[key]["below_min_mass"] = None
        else:
            out[key]["mass_before"] = float(mass_before[done].mean())
    out["tune_seconds"] = [r["tune"]["tune_seconds"] for r in out["per_fold"]]
    out["baseline_train_seconds"] = [r["baseline_train_seconds"] for r in out["per_fold"]]
    return out


def render_curve(results: dict) -> str:
    """The learning-curve table: per set and training size, baseline vs tuned (raw, calibrated)."""
    lines = [f"{'set':15} {'rows':>5} {'configuration':18} {'acc':>5} {'F1':>5} {'ECE':>5} {'ECE 95% CI':>15} "
             f"{'mass':>5} {'sec':>6}  notes", "-" * 100]
    for name, r in results.items():
        lines.append(f"{name:15} {'-':>5} {'base (zero-shot)':18} {_row(r['base'])} {'':>6}  test {r['test_rows']} rows")
        for n, p in r["points"].items():
            t = p["tune"]
            lines.append(f"{'':15} {n:>5} {'TF-IDF + logreg':18} {_row(p['tfidf_logreg'])} "
                         f"{p['baseline_train_seconds']:6.1f}")
            if "diverged" in t:
                lines.append(f"{'':15} {n:>5} {'tune':18} diverged: {t['diverged'][:60]}")
                continue
            lines.append(f"{'':15} {n:>5} {'tune':18} {_row(t['raw'])} {t['tune_seconds']:6.0f}  best epoch "
                         f"{t['best_epoch']}, holdout {t['holdout_rows']}")
            if "calibrated" in t:
                lines.append(f"{'':15} {n:>5} {'tune +its cal.':18} {_row(t['calibrated'])} {'':>6}  "
                             f"{t['calibration']['method']}")
    return "\n".join(lines)


def render_kfold(results: dict) -> str:
    """The k-fold table: pooled out-of-fold figures per set, baseline vs tuned, with costs."""
    lines = [f"{'set':15} {'configuration':18} {'acc':>5} {'F1':>5} {'ECE':>5} {'ECE 95% CI':>15} {'mass':>5} "
             f"{'sec/fold':>8}  notes", "-" * 100]
    for name, r in results.items():
        lines.append(f"{name:15} {'base (zero-shot)':18} {_row(r['base'])} {'':>8}  {r['rows']} rows, "
                     f"{r['folds']} folds")
        lines.append(f"{'':15} {'TF-IDF + logreg':18} {_row(r['tfidf_logreg'], mass=False)} "
                     f"{np.mean(r['baseline_train_seconds']):8.1f}")
        for key, label in (("tune_raw", "tune"), ("tune_calibrated", "tune +its cal.")):
            if r[key] is None:
                lines.append(f"{'':15} {label:18} none (see per_fold)")
                continue
            note = (f"best epochs {[p['tune'].get('best_epoch') for p in r['per_fold']]}" if key == "tune_raw" else
                    f"{sorted({p['tune'].get('calibration', {}).get('method', '-') for p in r['per_fold']})}")
            cost = f"{np.mean(r['tune_seconds']):8.0f}" if key == "tune_raw" else " " * 8
            lines.append(f"{'':15} {label:18} {_row(r[key])} {cost}  {note}, {r[key]['rows']} rows")
    return "\n".join(lines)


def _row(m: dict, mass: bool = True) -> str:
    ci = f"[{m['ece_ci'][0]:.3f}, {m['ece_ci'][1]:.3f}]" if m.get("ece_ci") else "-"
    return (f"{_f(m.get('accuracy'))} {_f(m.get('macro_f1'))} {_f(m.get('ece'))} {ci:>15} "
            f"{_f(m.get('mean_mass')) if mass else '  -  '}")


def save_tune_section(path: Path, key: str, meta: dict, results: dict) -> None:
    """Write ``results`` into ``path``'s ``tune`` section under ``key`` (the rest kept)."""
    data = json.loads(path.read_text()) if path.exists() else {}
    data.setdefault("tune", {})[key] = meta | {"sets": results}
    path.write_text(json.dumps(data, indent=2))


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
    parser.add_argument("--sets", default=",".join(SHORT_SETS), help="default the four short-text sets; also "
                        "bbc_news, and drug_reviews (with --split)")
    parser.add_argument("--epochs", type=int, default=None, help="default 3; with --split, pcd tune's default")
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "tune_quality.json")
    parser.add_argument("--mass-weights", default=None, help="comma-separated --mass-weight values: the mass and "
                        "calibration comparison (issue 29) instead of the default table")
    parser.add_argument("--max-rows", type=int, default=None, help="first N rows of each set")
    parser.add_argument("--holdout", type=float, default=0.25, help="the tuner's holdout (with --mass-weights)")
    parser.add_argument("--order", action="store_true", help="flips under reversal, tune with and without "
                        "--permutations 2 (issue 29 item 4)")
    parser.add_argument("--mass-weight", type=float, default=0.3, help="the tunes' --mass-weight (with --order)")
    parser.add_argument("--train-rows", default=None, help="comma-separated training sizes: the learning curve "
                        "(issue 29 item 3) into --json's tune section, default options (--epochs 3, holdout 0.2)")
    parser.add_argument("--folds", type=int, default=None, help="k-fold tune vs baseline (issue 29 item 5) on the "
                        "first --max-rows rows into --json's tune section")
    parser.add_argument("--test-fraction", type=float, default=0.25, help="the learning curve's test split")
    parser.add_argument("--tag", default=None, help="key in the tune section (default learning_curve / kfold / "
                        "one_split_long)")
    parser.add_argument("--split", default=None, help="TRAIN,TEST rows: one split per set, every field of its schema "
                        "(issue 29 item 5, the long-text sets) into --json's tune section; without --epochs, "
                        "pcd tune's default epochs")
    args = parser.parse_args()
    args.epochs_given, args.epochs = args.epochs, 3 if args.epochs is None else args.epochs
    if args.split:
        path = args.json if args.json != ROOT / "benchmarks" / "tune_quality.json" else ROOT / "benchmarks" / "quality.json"
        n_train, n_test = (int(n) for n in args.split.split(","))
        key = args.tag or "one_split_long"
        epochs = args.epochs_given
        meta = {"model": "smollm2-135m-instruct", "epochs": epochs or "pcd tune's default (6 under 200 gold rows, "
                "else 3)", "lr": args.lr, "split": "per set: train_rows / test_rows asked with --split, seed 0",
                "cpu": "2 shared cores, OMP_NUM_THREADS=1, nice 19"}
        for name in args.sets.split(","):
            started = time.perf_counter()
            out = run_split_set(name, n_train, n_test, epochs, args.lr)
            out["wall_seconds"], out["split_asked"] = time.perf_counter() - started, [n_train, n_test]
            print(f"{name}: {out['wall_seconds']:.0f} s", file=sys.stderr, flush=True)
            old = json.loads(path.read_text()).get("tune", {}).get(key, {}) if path.exists() else {}
            results = old.get("sets", {}) | {name: out}  # re-read: other sets of this key, run by other commands
            save_tune_section(path, key, meta, results)
            print(render_split({name: out}), flush=True)
        return
    if args.train_rows or args.folds:
        path = args.json if args.json != ROOT / "benchmarks" / "tune_quality.json" else ROOT / "benchmarks" / "quality.json"
        config = TuneConfig(epochs=args.epochs, lr=args.lr, seed=0)
        key = args.tag or ("learning_curve" if args.train_rows else "kfold")
        meta = {"model": "smollm2-135m-instruct", "epochs": args.epochs, "lr": args.lr, "holdout": config.holdout,
                "mass_weight": config.mass_weight, "cpu": "2 shared cores, nice 19"}
        if args.train_rows:
            meta |= {"train_rows": [int(n) for n in args.train_rows.split(",")], "test_fraction": args.test_fraction}
        else:
            meta |= {"folds": args.folds, "max_rows": args.max_rows}
        old = json.loads(path.read_text()).get("tune", {}).get(key, {}) if path.exists() else {}
        results = old.get("sets", {})
        for name in args.sets.split(","):
            started = time.perf_counter()
            def partial(out, name=name):
                save_tune_section(path, key, meta, results | {name: out})

            results[name] = (run_curve_set(name, meta["train_rows"], config, args.test_fraction, partial)
                             if args.train_rows
                             else run_kfold_set(name, args.folds, config, args.max_rows))
            results[name]["wall_seconds"] = time.perf_counter() - started
            print(f"{name}: {results[name]['wall_seconds']:.0f} s", file=sys.stderr, flush=True)
            save_tune_section(path, key, meta, results)
        print(render_curve(results) if args.train_rows else render_kfold(results))
        return
    if args.order:
        results = {}
        for name in args.sets.split(","):
            results[name] = run_order_set(name, args.epochs, args.lr, args.mass_weight, args.max_rows, args.holdout)
            args.json.write_text(json.dumps({"model": "smollm2-135m-instruct", "epochs": args.epochs, "lr": args.lr,
                                             "max_rows": args.max_rows, "holdout": args.holdout,
                                             "split": "stratified 60/40, seed 0", "sets": results}, indent=2))
        print(json.dumps(results, indent=2))
        return
    if args.mass_weights is not None:
        weights = [float(w) for w in args.mass_weights.split(",")]
        results = json.loads(args.json.read_text())["sets"] if args.json.exists() else {}
        for name in args.sets.split(","):
            started = time.perf_counter()
            results[name] = run_mass_set(name, args.epochs, args.lr, weights, args.max_rows, args.holdout)
            print(f"{name}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
            args.json.write_text(json.dumps({
                "model": "smollm2-135m-instruct", "epochs": args.epochs, "lr": args.lr, "mass_weights": weights,
                "max_rows": args.max_rows, "holdout": args.holdout, "split": "stratified 60/40, seed 0",
                "min_mass": 0.5, "sets": results}, indent=2))
        print(render_mass(results))
        return
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
