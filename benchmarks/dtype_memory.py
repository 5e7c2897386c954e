"""Peak memory of ``pcd label`` per ``--dtype`` on the CPU (issue 51, item 8).

    python benchmarks/dtype_memory.py [--records 12] [--model M] [--dtypes float32,bfloat16,float16]
                                      [--runs 1] [--json out.json]

Each dtype labels the same records (``sample_data/airline_tweets.jsonl``, the airline schema)
in a fresh ``pcd label`` process; its peak resident set size is that process's own
``ru_maxrss`` (``os.wait4``: the child alone, not this script), in MB (10^6 bytes). Half
precision must peak no higher than float32: pcd loads a model whose weight files hold another
dtype from a copy converted once per dtype (``pcd_cli.backends.torch_backend.weights_in_dtype``),
so the full-precision weights are never resident beside the half-precision ones. The first
run of a dtype writes that copy, one tensor at a time (reported apart as ``first run``; ``--runs``
counts the runs after it). Labels and probabilities of each dtype are printed as a digest,
to compare before and after a change.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
PCD = str(Path(sys.executable).with_name("pcd"))


def label(records: Path, out: Path, dtype: str, model: str | None) -> tuple[int, int]:
    """Run ``pcd label`` once; (exit code, peak RSS in MB of that process)."""
    cmd = [PCD, "label", str(records), "-s", str(ROOT / "schemas/airline_sentiment.yaml"), "--id-field", "id",
           "-o", str(out), "--device", "cpu", "--dtype", dtype, "--all-probs", "--quiet"]
    if model:
        cmd += ["--model", model]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    err = proc.stderr.read().decode()
    proc.stderr.close()
    code = os.waitstatus_to_exitcode(status)
    if code:
        sys.exit(f"pcd label --dtype {dtype} failed ({code}): {err[-2000:]}")
    return code, usage.ru_maxrss * 1024 // 1_000_000  # Linux: KiB


def digest(out: Path) -> str:
    table = pq.read_table(out)
    cols = [c for c in table.column_names if c not in ("id",)]
    return hashlib.sha256(json.dumps(table.select(cols).to_pylist(), default=str).encode()).hexdigest()[:12]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=12)
    ap.add_argument("--model", default=None)
    ap.add_argument("--dtypes", default="float32,bfloat16,float16")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="pcd-dtype-memory-"))
    rows = (ROOT / "sample_data/airline_tweets.jsonl").read_text().splitlines()[: args.records]
    records = tmp / "in.jsonl"
    records.write_text("\n".join(rows) + "\n")
    results = {}
    for dtype in args.dtypes.split(","):
        first = label(records, tmp / f"first-{dtype}.parquet", dtype, args.model)[1]  # may convert the weights
        peaks = [label(records, tmp / f"{dtype}.parquet", dtype, args.model)[1] for _ in range(args.runs)]
        results[dtype] = {"peak_rss_mb": max(peaks), "runs": peaks, "first_run_mb": first,
                          "values": digest(tmp / f"{dtype}.parquet")}
        print(f"{dtype:9s} peak RSS {max(peaks):5d} MB  (runs {peaks}; first run {first} MB)  "
              f"values sha256 {results[dtype]['values']}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"records": args.records, "model": args.model or "embedded",
                                               "dtypes": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
