"""What the new field types cost: passes and time per record with and without them.

    python benchmarks/field_types.py [--rows 48] [--json benchmarks/field_types.json]

On the embedded model and the airline tweets of sample_data, the same records are labelled
with four schemas: a base schema (an enum and two booleans), the base plus one 12-option
multi-select field, the base plus a nullable enum, an ordinal scale and an integer 1-10,
and the base plus all of them. Each is labelled once in the packed mode ``pcd label`` uses;
the forward passes spent on the records (the one-off prompt-head prefill excluded) and the
wall-clock time per record are reported. A multi field is one boolean decision per option,
read in the same pass as every other field, so it adds tokens to a pass, not passes.
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

from pcd_cli.api import Labeler  # noqa: E402
from pcd_cli.backends import load_backend  # noqa: E402
from pcd_cli.schema import parse_schema  # noqa: E402

BASE = {
    "sentiment": {"type": "enum", "labels": ["NEGATIVE", "NEUTRAL", "POSITIVE"],
                  "description": "The author's sentiment toward the airline"},
    "mentions_delay": {"type": "boolean", "description": "The tweet mentions a delay or cancellation"},
    "asks_for_help": {"type": "boolean", "description": "The author asks the airline to do something"},
}
MULTI = {"topics": {"type": "multi", "description": "What the tweet is about", "labels": [
    "delay", "cancellation", "baggage", "customer_service", "booking", "refund", "seating", "food",
    "crew", "wifi", "price", "loyalty_program"]}}
SCALES = {
    "airline": {"type": "enum", "labels": ["united", "american", "delta", "southwest", "us_airways", "virgin"],
                "nullable": True, "description": "The airline the tweet addresses, null if none"},
    "intensity": {"type": "ordinal", "labels": ["MILD", "MODERATE", "STRONG"],
                  "description": "How strongly the opinion is put"},
    "score": {"type": "integer", "minimum": 1, "maximum": 10, "description": "The experience, 1 (worst) to 10"},
}
SCHEMAS = {"base": BASE, "base + 12-option multi": BASE | MULTI, "base + nullable/ordinal/integer": BASE | SCALES,
           "base + all": BASE | MULTI | SCALES}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=48)
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "field_types.json")
    args = parser.parse_args()
    rows = pd.read_json(ROOT / "sample_data" / "airline_tweets.jsonl", lines=True).head(args.rows)
    backend = load_backend(None, device="cpu", dtype="float32")
    results = []
    for name, fields in SCHEMAS.items():
        schema = parse_schema({"name": name, "fields": fields})
        labeler = Labeler(schema, backend=backend)
        labeler.label_frame(rows[["id", "text"]].head(2), id_field="id")  # warm-up (compiled plans, allocator)
        passes = labeler.forward_passes
        started = time.perf_counter()
        frame = labeler.label_frame(rows[["id", "text"]], id_field="id", all_probs=False)
        elapsed = time.perf_counter() - started
        n = len(frame)
        results.append({"schema": name, "declared_fields": len(schema.declared), "decisions": len(schema.fields),
                        "waves": len(schema.waves), "records": n,
                        "passes_per_record": (labeler.forward_passes - passes) / n,
                        "ms_per_record": 1000 * elapsed / n})
    base_ms = results[0]["ms_per_record"]
    print(f"{'schema':34} {'fields':>6} {'decisions':>9} {'passes/rec':>10} {'ms/rec':>8} {'vs base':>8}")
    for r in results:
        print(f"{r['schema']:34} {r['declared_fields']:>6} {r['decisions']:>9} {r['passes_per_record']:>10.3f} "
              f"{r['ms_per_record']:>8.1f} {r['ms_per_record'] / base_ms:>7.2f}x")
    args.json.write_text(json.dumps({"model": backend.model_id, "rows": args.rows, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
