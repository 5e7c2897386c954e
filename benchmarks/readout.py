"""The linear readout (issue #50): quality and speed through the product path.

    python benchmarks/readout.py [--sets sms_spam,airline_tweets,trec_questions,intents] [--fit 100]
                                 [--speed-rows 200]

Per set: ``calibrate_on_gold`` (``pcd calibrate --readout linear``) on the first ``--fit`` rows of
../shared/data, then a ``Labeler`` with the written file labels the set's last 200 rows (intents
and BBC: the last 50), scored by macro-F1 against their gold; beside it the zero-shot argmax and
the logits calibration (``--readout logits``) on the same rows. ``--speed-rows``: records/s of
labelling the same rows with and without the readout on one loaded model (best of 3 runs each,
interleaved). Writes benchmarks/readout.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pcd_cli.api import Labeler  # noqa: E402
from pcd_cli.fitting import calibrate_on_gold  # noqa: E402
from pcd_cli.job import LabelJob  # noqa: E402
from pcd_cli.quality import evaluate  # noqa: E402

DATA = ROOT.parent / "shared" / "data"
SETS = {
    "sms_spam": ("sms_spam.dev.jsonl", "sms_spam.yaml", "is_spam", 200),
    "airline_tweets": ("airline_tweets.dev.jsonl", "airline_sentiment.yaml", "sentiment", 200),
    "trec_questions": ("trec_questions.dev.jsonl", "trec_questions.yaml", "answer_type", 200),
    "intents": ("intents.dev.jsonl", "intents.yaml", "intent", 50),
    "bbc_news": ("bbc_news.dev.jsonl", "bbc_news.yaml", "topic", 50),
}


def macro_f1(labeler, test: pd.DataFrame, schema, field: str) -> tuple[float, float]:
    """(macro-F1 of the labeler's labels on ``test``, records/s)."""
    start = time.perf_counter()
    preds = labeler.label_frame(test, text_field="text", id_field="id", all_probs=True)
    rate = len(test) / (time.perf_counter() - start)
    return evaluate(preds, test, schema, id_field="id").field(field).macro_f1, rate


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sets", default="sms_spam,airline_tweets,trec_questions,intents")
    ap.add_argument("--fit", type=int, default=100)
    ap.add_argument("--speed-rows", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "readout.json"))
    args = ap.parse_args()
    results = json.loads(Path(args.out).read_text()) if Path(args.out).is_file() else {}
    backend = None
    for name in args.sets.split(","):
        data, schema_file, field, n_test = SETS[name]
        rows = pd.read_json(DATA / data, lines=True)
        fit, test = rows.iloc[: args.fit], rows.iloc[-n_test:]
        schema = ROOT / "schemas" / schema_file
        out = {}
        with tempfile.TemporaryDirectory() as tmp:
            gold = Path(tmp) / "gold.jsonl"
            fit.to_json(gold, orient="records", lines=True)
            job = LabelJob(id_field="id")
            t0 = time.perf_counter()
            run = calibrate_on_gold(gold, schema, job, output=Path(tmp) / "cal.json", readout="linear")
            out["calibrate_seconds"] = round(time.perf_counter() - t0, 1)
            saved = run.calibration.save(Path(tmp) / "cal.json")
            fc = saved.fields[field]
            out["cv"] = fc.readout.cv | {"layers": list(fc.readout.layers), "C": fc.readout.C}
            out["notes"] = list(run.report.notes)
            logits = calibrate_on_gold(gold, schema, job, output=Path(tmp) / "logits.json").calibration
            logits.save(Path(tmp) / "logits.json")
            plain = Labeler(schema, job, backend=backend)
            backend = plain.backend
            for key, labeler in (("zero_shot", plain),
                                 ("logits_calibration", Labeler(schema, job, backend=backend,
                                                                calibration=str(Path(tmp) / "logits.json"))),
                                 ("readout", Labeler(schema, job, backend=backend,
                                                     calibration=str(Path(tmp) / "cal.json")))):
                f1, rate = macro_f1(labeler, test, schema, field)
                out[key] = {"macro_f1": round(f1, 3), "records_per_s": round(rate, 2)}
            if args.speed_rows:
                speed_rows = rows.iloc[-args.speed_rows:]
                with_readout = Labeler(schema, job, backend=backend, calibration=str(Path(tmp) / "cal.json"))
                best = {"without": 0.0, "with": 0.0}
                for _ in range(3):
                    for key, labeler in (("without", plain), ("with", with_readout)):
                        best[key] = max(best[key], macro_f1(labeler, speed_rows, schema, field)[1])
                out["speed"] = {k: round(v, 2) for k, v in best.items()} | {
                    "ratio": round(best["with"] / best["without"], 3), "rows": len(speed_rows)}
        results[f"{name}@{args.fit}"] = out
        print(name, json.dumps({k: v for k, v in out.items() if k != "cv"}), "cv readout",
              out["cv"]["readout"], flush=True)
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
