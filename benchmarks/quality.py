"""Label quality on real human-labelled sets: zero-shot, calibration, examples, both, generation.

    python benchmarks/quality.py [--sets sms_spam,airline_tweets,...] [--model M] [--generate 100]
                                 [--json benchmarks/quality.json]

For each labelled set of ../shared/data (its rows split into 5 folds, seed 0), on one model
(default: the embedded SmolLM2-135M-Instruct), every figure is measured on rows that
neither the examples nor the calibration saw:

* majority: the majority-class baseline (accuracy of always answering the most frequent gold label);
* zero-shot: ``pcd label`` with the schema alone;
* +calibration: temperature + per-label bias (``pcd calibrate``), 5-fold cross-validated;
* +4 / +8 examples: for each fold, K examples drawn (balanced, ``draw_examples``) from the
  other folds and put in the head; the fold's rows are labelled with them;
* +8 examples +calibration: the 8-example predictions, calibrated by 5-fold cross-validation
  (each fold's calibration is fitted on rows labelled with other folds' examples; a row of one
  fold may have served as one of 8 examples for another fold: a small, stated leak);
* generation: the same model writing the JSON answer token by token (greedy) on the first
  ``--generate`` rows, invalid answers counted as wrong;
* records/s with 8 examples against zero-shot (the same rows, the same process).

Each set is cut to its first ``--max-rows`` rows (default 200) to keep the run under an hour
on a 2-core CPU.

AUROC is that of ``<f>__prob`` for "the label is correct": near 0.5 the model carries no
signal on the task, whatever the calibration.
"""

from __future__ import annotations

import argparse
import json
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
from pcd_cli.bench import check_generated  # noqa: E402
from pcd_cli.decoding.examples import draw_examples  # noqa: E402
from pcd_cli.io.readers import InputSpec  # noqa: E402
from pcd_cli.quality import evaluate, fit_calibration  # noqa: E402
from pcd_cli.schema.load import load_schema

DATA = ROOT.parent / "shared" / "data"
SETS = {
    "sms_spam": ("sms_spam.dev.jsonl", "sms_spam.yaml", "is_spam"),
    "airline_tweets": ("airline_tweets.dev.jsonl", "airline_sentiment.yaml", "sentiment"),
    "trec_questions": ("trec_questions.dev.jsonl", "trec_questions.yaml", "answer_type"),
    "intents": ("intents.dev.jsonl", "intents.yaml", "intent"),
    "bbc_news": ("bbc_news.dev.jsonl", "bbc_news.yaml", "topic"),
}
FOLDS = 5


def folds_of(n: int, seed: int = 0) -> np.ndarray:
    order = np.random.default_rng(seed).permutation(n)
    fold = np.empty(n, dtype=int)
    fold[order] = np.arange(n) % FOLDS
    return fold


def scores(preds: pd.DataFrame, gold: pd.DataFrame, schema, field: str) -> dict:
    report = evaluate(preds, gold, schema, id_field="id").field(field)
    return {"accuracy": report.accuracy, "macro_f1": report.macro_f1, "ece": report.ece, "auroc": report.auroc,
            "majority": report.majority_accuracy, "n": report.n}


def calibrated(preds: pd.DataFrame, gold: pd.DataFrame, schema, metadata: dict, field: str) -> dict:
    _, report = fit_calibration(preds, gold, schema, metadata, id_field="id", folds=FOLDS, seed=0)
    after = next(f for f in report.fields if f.field == field).after
    return {"accuracy": after.accuracy, "macro_f1": after.macro_f1, "ece": after.ece, "nll": after.nll}


def with_examples(backend, schema, rows: pd.DataFrame, fold: np.ndarray, shots: int, tmp: Path) -> tuple[pd.DataFrame, float, dict]:
    parts, seconds = [], 0.0
    metadata = {}
    for k in range(FOLDS):
        train = tmp / f"train{k}.jsonl"
        rows[fold != k].to_json(train, orient="records", lines=True, force_ascii=False)
        examples = draw_examples(train, schema, InputSpec(id_field="id"), shots=shots, seed=k)
        labeler = Labeler(schema, backend=backend, examples=examples)
        metadata = labeler.metadata()
        started = time.perf_counter()
        parts.append(labeler.label_frame(rows[fold == k], id_field="id", all_probs=True))
        seconds += time.perf_counter() - started
    return pd.concat(parts, ignore_index=True), seconds, metadata


def generation_accuracy(backend, schema, rows: pd.DataFrame, field: str, n: int) -> dict:
    labeler = Labeler(schema, backend=backend)
    prompt = labeler.compiled.prompt
    head = list(prompt.head_ids)
    eos = set(backend.eos_token_ids)
    f = schema.fields[schema.field_index(field)]
    correct = invalid = 0
    problems: dict[str, int] = {}
    cap = 48
    subset = rows.head(n)
    for rid, text, gold in zip(subset["id"], subset["text"], subset[field]):
        ids = head + prompt.record_ids(rid, text.strip())[1]
        new, _ = backend.generate(ids, cap, cache_prefix_len=len(head))
        out = prompt.layout.opener + backend.tokenizer.decode([t for t in new if t not in eos])
        parsed, values, found = check_generated(schema, out, len(new) >= cap and not (eos & set(new)))
        found = [p for p in found if not p.startswith("quoted boolean")]  # a quoted boolean still names a label
        if not parsed or found:
            invalid += 1
            for p in found[:1]:
                kind = p.split("=")[0].split(" ")[0:2]
                problems_key = " ".join(kind)
                problems[problems_key] = problems.get(problems_key, 0) + 1
            continue
        correct += f.label_index(values[field]) == f.label_index(gold)
    return {"accuracy": correct / len(subset), "invalid": invalid, "n": len(subset), "problems": problems}


def run_set(name: str, backend, n_generate: int, max_rows: int) -> dict:
    data_file, schema_file, field = SETS[name]
    schema = load_schema(ROOT / "schemas" / schema_file)
    rows = pd.read_json(DATA / data_file, lines=True, dtype=False)
    rows = rows[["id", "text", field]].head(max_rows)
    gold = rows[["id", field]]
    fold = folds_of(len(rows))
    zero = Labeler(schema, backend=backend)
    started = time.perf_counter()
    zero_preds = zero.label_frame(rows, id_field="id", all_probs=True)
    zero_seconds = time.perf_counter() - started
    out = {"rows": len(rows), "zero_shot": scores(zero_preds, gold, schema, field)}
    out["majority"] = out["zero_shot"].pop("majority")
    out["calibrated"] = calibrated(zero_preds, gold, schema, zero.metadata(), field)
    with tempfile.TemporaryDirectory() as tmp:
        for shots in (4, 8):
            preds, seconds, metadata = with_examples(backend, schema, rows, fold, shots, Path(tmp))
            out[f"examples_{shots}"] = scores(preds, gold, schema, field)
            out[f"examples_{shots}"].pop("majority")
            if shots == 8:
                out["examples_8_calibrated"] = calibrated(preds, gold, schema, metadata, field)
                out["seconds_per_record"] = {"zero_shot": zero_seconds / len(rows), "examples_8": seconds / len(rows)}
                out["time_ratio_8_examples"] = seconds / zero_seconds
    out["generation"] = generation_accuracy(backend, schema, rows, field, n_generate)
    out["pcd_zero_shot_on_generation_rows"] = float(
        (zero_preds.head(n_generate)[field].astype(str).str.lower().values ==
         rows.head(n_generate)[field].astype(str).str.lower().values).mean())
    return out


RULE_SETS = ("sms_spam", "airline_tweets", "trec_questions", "intents")


def tfidf_baseline(dev: pd.DataFrame, held: pd.DataFrame, field: str, labels: tuple[str, ...]) -> np.ndarray:
    """TF-IDF + logistic regression fitted on the dev rows, with its own decision rule tuned on them
    for macro-F1: a binary set through scikit-learn's ``TunedThresholdClassifierCV`` (5-fold), a
    multi-class set through pcd's offsets (``decision.fit_once``) on its 5-fold out-of-fold
    probabilities. Returns the held-out rows' label indices."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import TunedThresholdClassifierCV, cross_val_predict
    from sklearn.pipeline import make_pipeline

    from pcd_cli.quality.decision import fit_once, parse_objective

    index = {label: i for i, label in enumerate(labels)}
    y_dev = np.array([index[str(v).lower() if isinstance(v, bool) else str(v)] for v in dev[field]])
    model = make_pipeline(TfidfVectorizer(ngram_range=(1, 2), min_df=1, sublinear_tf=True),
                          LogisticRegression(max_iter=2000, C=10.0))
    if len(labels) == 2:
        tuned = TunedThresholdClassifierCV(model, scoring="f1_macro", cv=5, random_state=0)
        tuned.fit(dev["text"], y_dev)
        return tuned.predict(held["text"])
    present = np.unique(y_dev)
    oof = cross_val_predict(model, dev["text"], y_dev, cv=3, method="predict_proba")
    model.fit(dev["text"], y_dev)
    full = np.full((len(dev), len(labels)), 1e-9)
    full[:, present] = oof
    rule, _ = fit_once(parse_objective("macro-f1"), field, full / full.sum(1, keepdims=True), y_dev, labels)
    held_probs = np.full((len(held), len(labels)), 1e-9)
    held_probs[:, present] = model.predict_proba(held["text"])
    return rule.decide(held_probs / held_probs.sum(1, keepdims=True))


def run_rules(name: str, backend, objective: str, cache: Path) -> dict:
    """Held-out figures of one set, its rows split in half (seeded shuffle): the first half is the
    dev rows (the gold a user has), the second the held-out rows. On the held-out rows: argmax of
    the zero-shot probabilities, with a likelihood calibration fitted on the dev rows, with the
    decision rule fitted for ``objective`` on them (``pcd calibrate --objective``), and TF-IDF +
    logistic regression with its own tuned rule (``tfidf_baseline``). Each figure with a 95 %
    bootstrap interval (1,000 resamples of the held-out rows)."""
    from pcd_cli.quality.calibration import fit_calibration
    from pcd_cli.quality.decision import held_out_figures, parse_objective

    data_file, schema_file, field = SETS[name]
    schema = load_schema(ROOT / "schemas" / schema_file)
    rows = pd.read_json(DATA / data_file, lines=True, dtype=False)[["id", "text", field]]
    rows["id"] = rows["id"].astype(str)
    cached = cache / f"{name}.pkl"
    if cached.exists():
        preds = pd.read_pickle(cached)
        metadata = json.loads((cache / f"{name}.meta.json").read_text())
    else:
        labeler = Labeler(schema, backend=backend)
        preds = labeler.label_frame(rows, id_field="id", all_probs=True)
        metadata = labeler.metadata()
        preds.to_pickle(cached)
        (cache / f"{name}.meta.json").write_text(json.dumps(metadata))
    f = schema.fields[schema.field_index(field)]
    labels = f.labels
    order = np.random.default_rng(0).permutation(len(rows))
    dev_ids = set(rows["id"].iloc[order[: len(rows) // 2]])
    is_dev = preds["id"].isin(dev_ids).to_numpy()
    gold_of = dict(zip(rows["id"], rows[field]))
    gold_idx = np.array([f.label_index(gold_of[i]) for i in preds["id"]])
    probs = np.array([[dict(p)[label] for label in labels] for p in preds[f"{field}__probs"]], dtype=np.float64)
    probs /= probs.sum(axis=1, keepdims=True)
    held_gold = gold_idx[~is_dev]
    obj = parse_objective(objective)
    out = {"rows": len(rows), "dev": int(is_dev.sum()), "held_out": int((~is_dev).sum()), "objective": objective,
           "labels": list(labels), "dev_counts": {labels[j]: int(c) for j, c in
                                                   enumerate(np.bincount(gold_idx[is_dev], minlength=len(labels)))}}

    def figures(pred):
        return held_out_figures(obj, field, held_gold, np.asarray(pred), labels)

    out["argmax"] = figures(probs[~is_dev].argmax(axis=1))
    dev_gold = rows[rows["id"].isin(dev_ids)][["id", field]]
    cal, _ = fit_calibration(preds[is_dev], dev_gold, schema, metadata, id_field="id", folds=FOLDS, seed=0)
    fc = cal.fields[field]
    out["likelihood_calibration"] = figures(fc.apply(probs[~is_dev]).argmax(axis=1))
    try:
        ruled, _ = fit_calibration(preds[is_dev], dev_gold, schema, metadata, id_field="id", folds=FOLDS, seed=0,
                                   objective=objective)
        rc = ruled.fields[field]
        out["rule"] = figures(rc.rule.decide(rc.apply(probs[~is_dev])))
        out["rule_cv_on_dev"] = rc.rule.cv
        out["rule_text"] = rc.rule.describe()
    except Exception as exc:  # the floor or a floor objective refused: said, not hidden
        out["rule"] = None
        out["rule_refused"] = str(exc)
    held_rows = preds[~is_dev][["id"]].merge(rows, on="id")
    dev_rows = rows[rows["id"].isin(dev_ids)]
    out["tfidf_lr_tuned"] = figures(tfidf_baseline(dev_rows, held_rows, field, labels))
    return out


def render_rules(results: dict) -> str:
    """One line per set: held-out macro-F1 and accuracy at argmax, calibrated, rule, TF-IDF + LR."""
    lines = [f"{'set':15} {'dev/held':>8}  {'argmax':>19}  {'+calibration':>19}  {'+rule':>19}  {'TF-IDF+LR tuned':>19}",
             f"{'':15} {'':>8}  " + "  ".join(f"{'macro-F1 [95%]':>14} acc" for _ in range(4)), "-" * 108]
    for name, r in results.items():
        cells = []
        for key in ("argmax", "likelihood_calibration", "rule", "tfidf_lr_tuned"):
            m = r.get(key)
            cells.append(f"{'refused':>19}" if m is None else
                         f"{m['value']:.3f} [{m['low']:.2f},{m['high']:.2f}] {m['accuracy']:.2f}")
        lines.append(f"{name:15} {r['dev']:>4}/{r['held_out']:<3}  " + "  ".join(f"{c:>19}" for c in cells))
        if r.get("rule_refused"):
            lines.append(f"{'':15} rule refused: {r['rule_refused']}")
        elif r.get("rule_text"):
            lines.append(f"{'':15} rule: {r['rule_text']}")
    return "\n".join(lines)


def _f(value) -> str:
    return "  -  " if value is None else f"{value:.3f}"


def render(results: dict) -> str:
    """One line per set and configuration: accuracy, macro-F1, ECE (held-out rows)."""
    lines = [f"{'set':15} {'configuration':22} {'acc':>5} {'F1':>5} {'ECE':>5}  notes", "-" * 72]
    for name, r in results.items():
        rows = [("majority baseline", {"accuracy": r["majority"]}, ""),
                ("zero-shot", r["zero_shot"], f"AUROC {_f(r['zero_shot']['auroc'])}"),
                ("+calibration", r["calibrated"], "5-fold CV"),
                ("+4 examples", r["examples_4"], ""),
                ("+8 examples", r["examples_8"],
                 f"time/record x{r['time_ratio_8_examples']:.2f} of zero-shot"),
                ("+8 examples +calib.", r["examples_8_calibrated"], "5-fold CV"),
                ("generation", r["generation"],
                 f"{r['generation']['invalid']} invalid of {r['generation']['n']} "
                 f"({', '.join(f'{k}: {v}' for k, v in r['generation']['problems'].items()) or '-'}); "
                 "pcd zero-shot on the same rows "
                 f"{r['pcd_zero_shot_on_generation_rows']:.3f}")]
        for i, (config, m, note) in enumerate(rows):
            lines.append(f"{name if i == 0 else '':15} {config:22} {_f(m.get('accuracy'))} {_f(m.get('macro_f1'))} "
                         f"{_f(m.get('ece'))}  {note}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", default=",".join(SETS))
    parser.add_argument("--model", default=None)
    parser.add_argument("--generate", type=int, default=100)
    parser.add_argument("--max-rows", type=int, default=200, help="first N rows of each set (file order)")
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "quality.json")
    parser.add_argument("--append", action="store_true", help="add to the sets already in --json")
    parser.add_argument("--rules", default=None, metavar="OBJECTIVE",
                        help="only the decision-rule comparison (issue #44) for this objective, e.g. macro-f1, on "
                             + ", ".join(RULE_SETS) + "; writes benchmarks/quality_rules.json")
    parser.add_argument("--cache", type=Path, default=None, help="--rules: keep the zero-shot predictions here")
    args = parser.parse_args()
    backend = load_backend(args.model, device="cpu", dtype="float32")
    if args.rules:
        cache = args.cache or Path(tempfile.mkdtemp(prefix="pcd-rules-"))
        cache.mkdir(parents=True, exist_ok=True)
        out_json = ROOT / "benchmarks" / "quality_rules.json"
        results = {}
        if args.append and out_json.exists():  # keep the sets measured by an earlier run
            results = json.loads(out_json.read_text())["sets"]
        sets = RULE_SETS if args.sets == ",".join(SETS) else tuple(args.sets.split(","))
        for name in sets:
            started = time.perf_counter()
            results[name] = run_rules(name, backend, args.rules, cache)
            print(f"{name}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
            out_json.write_text(json.dumps({"model": backend.model_id, "objective": args.rules, "sets": results},
                                           indent=2))
        print(f"model: {backend.model_id}; objective {args.rules}; each set's rows split in half (seed 0): dev rows "
              "fit, held-out rows score; 95% bootstrap intervals")
        print(render_rules(results))
        return
    results = {}
    if args.append and args.json.exists():  # keep the sets measured by an earlier run
        results = json.loads(args.json.read_text())["sets"]
    for name in args.sets.split(","):
        started = time.perf_counter()
        results[name] = run_set(name, backend, args.generate, args.max_rows)
        results[name]["max_rows"], results[name]["generated"] = args.max_rows, args.generate
        print(f"{name}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
        args.json.write_text(json.dumps({"model": backend.model_id, "sets": results}, indent=2))
    print(f"model: {backend.model_id}; 5-fold cross-validation; all figures on held-out rows; rows per set: "
          + ", ".join(f"{k} {v['rows']}" for k, v in results.items()))
    print(render(results))


if __name__ == "__main__":
    main()
