"""Prior correction ("calibrate before use") on every labelled set of ../shared/data, and what
it does to order dependence.

    python benchmarks/prior_correction.py [--max-rows 120] [--json benchmarks/prior_correction.json]

For each set (its first ``--max-rows`` rows; no gold label is used by the correction itself),
on the embedded model: accuracy and macro-F1 of ``pcd label`` without and with
``--prior-correction``; then the same with the schema's label list reversed, and how many
rows change label when the list is reversed (order dependence), without and with the
correction. Each setting is labelled once; nothing is trained or calibrated.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from pcd_cli.api import Labeler  # noqa: E402
from pcd_cli.backends import load_backend  # noqa: E402
from pcd_cli.quality import evaluate  # noqa: E402
from pcd_cli.schema.load import load_schema, parse_schema
from quality import DATA  # noqa: E402  (benchmarks/quality.py: the same data folder and set table)
from quality import SETS as QUALITY_SETS  # noqa: E402

#: Every labelled set of ../shared/data: quality.py's, and the drug reviews' sentiment.
SETS = {**QUALITY_SETS, "drug_reviews": ("drug_reviews.dev.jsonl", "drug_reviews.yaml", "sentiment")}


def reversed_schema(schema):
    """The same schema with each enum's label list reversed (booleans have a fixed order)."""
    data = {"name": schema.name, "instructions": schema.instructions, "fields": {
        f.name: ({"type": "boolean", "description": f.description} if f.is_boolean else
                 {"type": "enum", "description": f.description, "labels": list(reversed(f.labels))})
        for f in schema.fields}}
    return parse_schema(data)


def run(schema, backend, rows: pd.DataFrame, field: str, prior: bool) -> tuple[pd.DataFrame, dict, float]:
    labeler = Labeler(schema, backend=backend, prior_correction=prior)
    started = time.perf_counter()
    frame = labeler.label_frame(rows[["id", "text"]], id_field="id", all_probs=False)
    seconds = time.perf_counter() - started
    report = evaluate(frame, rows[["id", field]], schema, id_field="id").field(field)
    return frame, {"accuracy": report.accuracy, "macro_f1": report.macro_f1,
                   "majority": report.majority_accuracy, "n": report.n}, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-rows", type=int, default=120)
    parser.add_argument("--sets", default=",".join(SETS))
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "prior_correction.json")
    args = parser.parse_args()
    backend = load_backend(None, device="cpu", dtype="float32")
    results = {}
    for name in args.sets.split(","):
        file, schema_file, field = SETS[name]
        rows = pd.read_json(DATA / file, lines=True, dtype={"id": str}).head(args.max_rows)
        schema = load_schema(ROOT / "schemas" / schema_file)
        flipped = reversed_schema(schema)
        out = {"rows": len(rows)}
        for prior in (False, True):
            key = "corrected" if prior else "plain"
            frame, scores, seconds = run(schema, backend, rows, field, prior)
            back, scores_rev, _ = run(flipped, backend, rows, field, prior)
            flips = int((frame[field].astype(str).to_numpy() != back[field].astype(str).to_numpy()).sum())
            out[key] = scores | {"reversed_accuracy": scores_rev["accuracy"], "flips_when_reversed": flips,
                                 "seconds": round(seconds, 1)}
            print(f"{name:15s} {key:9s} acc {scores['accuracy']:.3f} F1 {scores['macro_f1']:.3f} "
                  f"(majority {scores['majority']:.3f}); reversed list: acc {scores_rev['accuracy']:.3f}, "
                  f"{flips}/{len(rows)} rows change label", flush=True)
        results[name] = out
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
