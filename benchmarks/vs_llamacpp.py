"""pcd against llama.cpp's grammar-constrained JSON, the forward limit and bfloat16, in one run
(issue #38): `pcd bench --baseline llama.cpp` on one-field tweets, the 28-field triage preset and
the 255-label customs preset, the model loaded once.

    python benchmarks/vs_llamacpp.py [--json benchmarks/vs_llamacpp.json] [--scale 1.0] [--model x.gguf]

Needs llama-cpp-python (pip install 'pcd-cli[bench]'). Each job prints the table `pcd bench`
prints and its summary goes into one JSON, with the machine's load average before and after
(this machine is shared: the ratios measured in one run are what compare, not the absolute rates).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

from rich.console import Console

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pcd_cli.backends import load_backend  # noqa: E402
from pcd_cli.bench import render_bench, run_bench  # noqa: E402
from pcd_cli.io.readers import InputSpec  # noqa: E402
from pcd_cli.schema.load import load_schema  # noqa: E402

#: (name, schema, records, --template, records benchmarked)
JOBS = [
    ("tweets_1_field", "schemas/airline_sentiment.yaml", "sample_data/airline_tweets.jsonl", None, 30),
    ("support_triage_28", "schemas/support_triage.yaml", "sample_data/support_tickets.jsonl",
     "Subject: {subject}\\n\\n{body}", 8),
    ("customs_255", "schemas/customs_255.yaml", "sample_data/customs_invoices.jsonl", None, 8),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "vs_llamacpp.json")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply each job's record count")
    parser.add_argument("--model", default=None, help="a GGUF file (default: the embedded model's)")
    parser.add_argument("--only", default=None, help="comma-separated job names")
    args = parser.parse_args()
    console = Console(width=170)
    backend = load_backend(args.model, device="cpu", dtype="float32")
    out = {"model": backend.model_id, "machine": f"{platform.machine()} {platform.system()}",
           "cpus": os.cpu_count(), "load_average_before": os.getloadavg(), "jobs": {}}
    for name, schema, data, template, n in JOBS:
        if args.only and name not in args.only.split(","):
            continue
        load_before = os.getloadavg()
        report = run_bench(load_schema(ROOT / schema), ROOT / data,
                           InputSpec(template=template, limit=max(2, round(n * args.scale))), backend=backend,
                           model=args.model, baseline="llama.cpp", compare_dtype=True)
        render_bench(report, console)
        out["jobs"][name] = {"records": report.records, "load_average_before": load_before,
                             "load_average_after": os.getloadavg(), "summary": report.summary}
        args.json.write_text(json.dumps(out, indent=2, default=str) + "\n")
    out["load_average_after"] = os.getloadavg()
    args.json.write_text(json.dumps(out, indent=2, default=str) + "\n")
    console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
