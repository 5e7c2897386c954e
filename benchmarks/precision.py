"""How much packing and half precision move probabilities (issue #13, item 4).

    python benchmarks/precision.py [--model M] [--device cpu] [--records 24] [--json out.json]

For each dtype (float32, bfloat16, float16) the same records are labelled twice: packed
(several records per pass, the default) and one record per pass. Reported per dtype and
schema, over every label probability and candidate mass:

* ``packing``: max |packed - one per pass|: how far a record's result moves with its pack
  neighbours and pass boundaries (the packing bound; float32 shows pure rounding);
* ``vs float32``: max |dtype, one per pass - float32, one per pass|: the precision's own error;
* ``flips``: fields whose chosen label differs between packed and one per pass.

Packing changes only which keys are masked out and the shapes of the matrix products. On
this CPU (SmolLM2-135M, budget 512) the packing bound measured 7e-6 in float32, 6.2e-2 in
bfloat16 and 1.1e-2 in float16 (README, *Precision*), so pcd keeps packing neighbours
independent of ``--batch-size`` (chunks counted from row 0) to keep resumed runs
bit-identical. support_triage's 28-field records are too big to share a 512-token pass:
its rows show the dtype's own error only.
"""

from __future__ import annotations

import argparse
import json
from itertools import islice
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from pcd_cli.api import Labeler
from pcd_cli.backends import load_backend
from pcd_cli.results import RecordResult
from pcd_cli.io.readers import InputSpec, read_records
from pcd_cli.schema.load import load_schema

ROOT = Path(__file__).resolve().parent.parent
CASES = [  # (name, schema, data, text template)
    ("airline_sentiment", "schemas/airline_sentiment.yaml", "sample_data/airline_tweets.jsonl", None),
    ("support_triage", "schemas/support_triage.yaml", "sample_data/support_tickets.jsonl",
     "Subject: {subject}\\n\\n{body}"),
]
DTYPES = ("float32", "bfloat16", "float16")


def _records(data: str, template: str | None, n: int):
    spec = InputSpec(template=template.replace("\\n", "\n") if template else None)
    items = [r for batch in read_records(ROOT / data, spec, batch_size=64) for r in batch]
    return list(islice(items, n))


def _flat(results) -> tuple[np.ndarray, list[int]]:
    values, labels = [], []
    for r in results:
        assert isinstance(r, RecordResult), r
        for f in r.fields:
            values.extend(f.probs)
            values.append(f.mass)
            labels.append(f.label)
    return np.array(values), labels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--records", type=int, default=24)
    parser.add_argument("--budget", type=int, default=512)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    reference: dict[str, np.ndarray] = {}
    for dtype in DTYPES:
        backend = load_backend(args.model, device=args.device, dtype=dtype)
        for name, schema_path, data, template in CASES:
            schema = load_schema(ROOT / schema_path)
            n = args.records if name == "airline_sentiment" else max(4, args.records // 4)
            records = _records(data, template, n)
            packed = Labeler(schema, backend=backend, max_tokens_per_pass=args.budget).label_batch(records)
            single = Labeler(schema, backend=backend, max_tokens_per_pass=args.budget,
                             pack_records=False).label_batch(records)
            (p, p_labels), (s, s_labels) = _flat(packed), _flat(single)
            if dtype == "float32":
                reference[name] = s
            rows.append({"dtype": dtype, "schema": name, "records": len(records), "fields": len(p_labels),
                         "packing": float(np.abs(p - s).max()),
                         "vs_float32": float(np.abs(s - reference[name]).max()),
                         "flips": int(sum(a != b for a, b in zip(p_labels, s_labels)))})
            print(json.dumps(rows[-1]), flush=True)
    table = Table(title=f"Packing and precision ({args.device}, budget {args.budget} tokens/pass)")
    for col in ("dtype", "schema", "records", "fields", "max |packed - single|", "max |single - float32|",
                "label flips"):
        table.add_column(col, justify="left" if col in ("dtype", "schema") else "right")
    for r in rows:
        table.add_row(r["dtype"], r["schema"], str(r["records"]), str(r["fields"]), f"{r['packing']:.1e}",
                      f"{r['vs_float32']:.1e}", str(r["flips"]))
    Console().print(table)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
