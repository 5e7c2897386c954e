"""What the new field types cost: passes and time per record with and without them.

    python benchmarks/field_types.py [--rows 48] [--json benchmarks/field_types.json]

On the embedded model and the airline tweets of sample_data, the same records are labelled
with four schemas: a base schema (an enum and two booleans), the base plus one 12-option
multi-select field, the base plus a nullable enum, an ordinal scale and an integer 1-10,
and the base plus all of them. Each is labelled in the packed mode ``pcd label`` uses (records
share passes up to the token budget) and one record per pass group (as ``pcd bench`` runs);
the forward passes and tokens spent on the records (the one-off prompt-head prefill
excluded) and the wall-clock time per record are reported. A multi field is one boolean decision per option,
read in the same pass as every other field, so it adds tokens to a pass, not passes; its options'
common trunk (``"topics": {"``) is fed once per record (issue #38: 179 -> 120 tokens per record
packed on 32 tweets, ``trunk_sharing_issue_38`` in the JSON).
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
from pcd_cli.schema.load import parse_schema

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
        row = {"schema": name, "declared_fields": len(schema.declared), "decisions": len(schema.fields),
               "waves": len(schema.waves), "records": len(rows)}
        for mode, pack in (("packed", True), ("one_record_per_pass", False)):
            labeler = Labeler(schema, backend=backend, pack_records=pack)
            labeler.label_frame(rows[["id", "text"]].head(2), id_field="id")  # warm-up (compiled plans, allocator)
            passes, tokens = labeler.forward_passes, labeler.decoder.tokens_fed
            started = time.perf_counter()
            frame = labeler.label_frame(rows[["id", "text"]], id_field="id", all_probs=False)
            elapsed = time.perf_counter() - started
            n = len(frame)
            row[mode] = {"passes_per_record": (labeler.forward_passes - passes) / n,
                         "tokens_per_record": (labeler.decoder.tokens_fed - tokens) / n,
                         "ms_per_record": 1000 * elapsed / n}
        results.append(row)
    base = results[0]
    print(f"{'schema':32} {'fields':>6} {'decisions':>9} {'waves':>5} | packed: {'passes/rec':>10} {'tokens/rec':>10} "
          f"{'ms/rec':>7} {'vs base':>7} | one record per pass: {'passes/rec':>10} {'ms/rec':>7} {'vs base':>7}")
    for r in results:
        p, u = r["packed"], r["one_record_per_pass"]
        print(f"{r['schema']:32} {r['declared_fields']:>6} {r['decisions']:>9} {r['waves']:>5} | "
              f"{p['passes_per_record']:>18.3f} {p['tokens_per_record']:>10.1f} {p['ms_per_record']:>7.1f} "
              f"{p['ms_per_record'] / base['packed']['ms_per_record']:>6.2f}x | "
              f"{u['passes_per_record']:>31.3f} {u['ms_per_record']:>7.1f} "
              f"{u['ms_per_record'] / base['one_record_per_pass']['ms_per_record']:>6.2f}x")
    args.json.write_text(json.dumps({"model": backend.model_id, "rows": args.rows, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
