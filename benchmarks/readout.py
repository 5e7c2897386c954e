"""The linear readout (issue #50): macro-F1 on rows it was not fitted on, and labelling speed.

    python benchmarks/readout.py [--sets sms_spam,airline_tweets,trec_questions,intents] [--fit 100]
    python benchmarks/readout.py --speed sms_spam --speed-rows 100
    python benchmarks/readout.py --record-quoting none   # the record as it is (earlier releases)

Quality, per set: one ``Labeler`` of the embedded model reading the readout's candidate layers
(``Decoder.feature_layers``, as ``pcd calibrate --readout linear`` does) labels the first
``--fit`` rows of ../shared/data and the set's last 200 rows (intents and BBC: the last 50); the
calibration is fitted on the first exactly as ``pcd calibrate --readout linear`` fits it
(``fit_calibration(features=...)``) and applied to the held rows with the definitions the
decoder applies (``FieldReadout.decide``, ``FieldCalibration.apply``): macro-F1 of zero-shot
argmax, the logits calibration and the readout. (On these one-field schemas the readout deciding
in the wave changes no later context, so this equals labelling with the file; the tests check
that a record's readout is the same alone, packed and served.)

Speed: records/s labelling the same rows with and without the readout on one loaded model,
best of 3 runs each, interleaved. Writes benchmarks/readout.json.
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
from pcd_cli.quality import metrics as M  # noqa: E402
from pcd_cli.quality.calibration import fit_calibration  # noqa: E402
from pcd_cli.quality.data import id_keys  # noqa: E402
from pcd_cli.quality.readout import FieldReadout, feature_layers  # noqa: E402
from pcd_cli.schema.load import load_schema  # noqa: E402

DATA = ROOT.parent / "shared" / "data"
SETS = {
    "sms_spam": ("sms_spam.dev.jsonl", "sms_spam.yaml", "is_spam", 200),
    "airline_tweets": ("airline_tweets.dev.jsonl", "airline_sentiment.yaml", "sentiment", 200),
    "trec_questions": ("trec_questions.dev.jsonl", "trec_questions.yaml", "answer_type", 200),
    "intents": ("intents.dev.jsonl", "intents.yaml", "intent", 50),
    "bbc_news": ("bbc_news.dev.jsonl", "bbc_news.yaml", "topic", 50),
}


def labelled(labeler, frame: pd.DataFrame):
    out = labeler.label_frame(frame, text_field="text", id_field="id", all_probs=True)
    keys, _ = id_keys(out["id"], "predictions", "id")
    return out, dict(zip(keys, out.attrs["features"]))


def quality(name: str, n_fit: int, backend, quoting: str | None = None) -> tuple[dict, object]:
    data, schema_file, field, n_test = SETS[name]
    rows = pd.read_json(DATA / data, lines=True)
    fit, test = rows.iloc[:n_fit], rows.iloc[-n_test:]
    schema = load_schema(ROOT / "schemas" / schema_file)
    labeler = Labeler(schema, backend=backend, id_field="id", record_quoting=quoting)
    labeler.decoder.feature_layers = feature_layers(labeler.backend.n_layers)
    start = time.perf_counter()
    fit_frame, fit_features = labelled(labeler, fit)
    test_frame, test_features = labelled(labeler, test)
    seconds = time.perf_counter() - start
    start = time.perf_counter()
    cal, _ = fit_calibration(fit_frame, fit, schema, fit_frame.attrs["metadata"], id_field="id",
                             features=fit_features)
    fit_seconds = time.perf_counter() - start
    fc = cal.fields[field]
    labels = schema.fields[schema.field_index(field)].labels
    gold_values = test.set_index("id")[field]
    keys, _ = id_keys(test_frame["id"], "predictions", "id")
    gold = np.array([labels.index(json.dumps(v) if isinstance(v, bool) else v) if not isinstance(v, bool)
                     else labels.index("true" if v else "false") for v in gold_values.loc[test_frame["id"]]])
    probs = np.array([[dict(p)[label] for label in labels] for p in test_frame[f"{field}__probs"]])
    readout = FieldReadout(fc.readout, fc.rule)
    read = np.array([readout.decide(test_features[k][field], p)[0] for k, p in zip(keys, probs)])

    def f1(pred):
        return round(M.macro_f1(M.label_scores(gold, np.asarray(pred), labels)), 3)

    return {"zero_shot": f1(probs.argmax(axis=1)), "logits_calibration": f1(fc.apply(probs).argmax(axis=1)),
            "readout": f1(read), "regressions": fc.readout.describe(),
            "absent": list(fc.readout.absent), "cv_readout_macro_f1": round(fc.readout.cv["readout"]["macro_f1"], 3),
            "record_quoting": labeler.schema.record_quoting, "n_fit": len(fit), "n_test": len(test), "label_seconds": round(seconds, 1),
            "fit_seconds": round(fit_seconds, 1)}, (labeler.backend, cal)


def speed(name: str, n_rows: int, backend, cal, quoting: str | None = None) -> dict:
    data, schema_file, field, _ = SETS[name]
    rows = pd.read_json(DATA / data, lines=True).iloc[-n_rows:]
    schema = load_schema(ROOT / "schemas" / schema_file)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cal.json"
        cal.save(path)
        plain = Labeler(schema, backend=backend, id_field="id", record_quoting=quoting)
        with_readout = Labeler(schema, backend=backend, id_field="id", calibration=str(path), record_quoting=quoting)
        best = {"without": 0.0, "with": 0.0}
        for _ in range(3):
            for key, labeler in (("without", plain), ("with", with_readout)):
                start = time.perf_counter()
                labeler.label_frame(rows, text_field="text", id_field="id", all_probs=True)
                best[key] = max(best[key], n_rows / (time.perf_counter() - start))
    return {k: round(v, 2) for k, v in best.items()} | {"ratio": round(best["with"] / best["without"], 3),
                                                       "rows": n_rows, "records_per_s": "best of 3"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sets", default="sms_spam,airline_tweets,trec_questions,intents")
    ap.add_argument("--fit", type=int, default=100)
    ap.add_argument("--speed", default="")
    ap.add_argument("--speed-rows", type=int, default=100)
    ap.add_argument("--record-quoting", choices=("json", "none"), default=None,
                    help="the record's rendering (default: the job's default, as pcd label)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "readout.json"))
    args = ap.parse_args()
    results = json.loads(Path(args.out).read_text()) if Path(args.out).is_file() else {}
    backend = None
    for name in [s for s in args.sets.split(",") if s]:
        out, (backend, cal) = quality(name, args.fit, backend, args.record_quoting)
        results[f"{name}@{args.fit}"] = out
        print(name, json.dumps(out), flush=True)
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    if args.speed:
        out, (backend, cal) = quality(args.speed, args.fit, backend, args.record_quoting)
        results[f"speed:{args.speed}"] = speed(args.speed, args.speed_rows, backend, cal, args.record_quoting)
        print("speed", args.speed, json.dumps(results[f"speed:{args.speed}"]), flush=True)
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
