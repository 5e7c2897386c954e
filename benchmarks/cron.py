"""Costs and guarantees of checkpointed runs (issue #5), measured on this machine.

    python benchmarks/cron.py [--records 120]

1. Checkpoint overhead: the same file labelled with --batch-size 256 / 32 / 8 (records/s,
   part files, seconds spent committing parts, seconds assembling the final outputs).
2. Determinism on the embedded model: the same job twice (bit-identical?), and the largest
   probability/mass difference when only --max-tokens-per-pass or --batch-size changes.
3. Assembly at scale: the final Parquet built from 2,000 parts of 256 rows (512,000 rows).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pcd_cli.api import Labeler  # noqa: E402
from pcd_cli.backends import load_backend  # noqa: E402
from pcd_cli.engines.checkpoint import WorkDir  # noqa: E402
from pcd_cli.io.readers import InputSpec  # noqa: E402
from pcd_cli.io.output import output_schema  # noqa: E402
from pcd_cli.engines.local import label_file  # noqa: E402
from pcd_cli.schema.load import load_schema

SCHEMA = ROOT / "schemas" / "airline_sentiment.yaml"
INPUT = ROOT / "sample_data" / "airline_tweets.jsonl"


class Timed:
    """Wraps WorkDir.commit / finish to add up the seconds spent in them."""

    def __init__(self):
        self.commit = self.finish = 0.0
        self._commit, self._finish = WorkDir.commit, WorkDir.finish
        timed = self

        def commit(self, *a, **k):
            t = time.perf_counter()
            timed._commit(self, *a, **k)
            timed.commit += time.perf_counter() - t

        def finish(self, *a, **k):
            t = time.perf_counter()
            timed._finish(self, *a, **k)
            timed.finish += time.perf_counter() - t

        WorkDir.commit, WorkDir.finish = commit, finish


def run(backend, tmp: Path, name: str, records: int, **kw) -> tuple[dict, float]:
    budget = kw.pop("max_tokens_per_pass", 512)
    labeler = Labeler(SCHEMA, backend=backend, max_tokens_per_pass=budget)
    out = tmp / f"{name}.parquet"
    t = time.perf_counter()
    label_file(labeler, INPUT, InputSpec(id_field="id", limit=records), output=out,
               errors_path=tmp / f"{name}.errors.jsonl", progress=False, **kw)
    return pq.read_table(out).to_pydict(), time.perf_counter() - t


def max_diff(a: dict, b: dict) -> tuple[float, int]:
    diff, changed = 0.0, 0
    for col, values in a.items():
        if col.endswith(("__prob", "__mass")):
            diff = max(diff, float(np.abs(np.array(values) - np.array(b[col])).max()))
        elif col != "__truncated" and col != "id":
            changed += sum(x != y for x, y in zip(values, b[col]))
    return diff, changed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=120)
    args = ap.parse_args()
    backend = load_backend(None, device="cpu", dtype="float32")
    timed = Timed()
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        print(f"1. checkpoint overhead ({args.records} airline tweets, 1 field, CPU float32)")
        base = None
        for batch in (256, 32, 8):
            timed.commit = timed.finish = 0.0
            table, seconds = run(backend, tmp, f"b{batch}", args.records, batch_records=batch)
            parts = -(-args.records // batch)
            print(f"   --batch-size {batch:>3}: {args.records / seconds:6.2f} records/s, {parts:>3} parts, "
                  f"commits {timed.commit:.3f} s ({1000 * timed.commit / parts:.1f} ms per part), "
                  f"final assembly {timed.finish:.3f} s")
            base = base or table
        print("2. determinism")
        again, _ = run(backend, tmp, "again", args.records, batch_records=256)
        print(f"   same job twice: {'bit-identical' if again == base else 'DIFFERENT'}")
        for name, kw in {"--max-tokens-per-pass 128": {"max_tokens_per_pass": 128},
                         "--max-tokens-per-pass 2048": {"max_tokens_per_pass": 2048},
                         "--batch-size 8": {"batch_records": 8}}.items():
            other, _ = run(backend, tmp, name.replace(" ", "_"), args.records, **kw)
            diff, changed = max_diff(base, other)
            print(f"   {name:<27}: labels changed {changed}, largest prob/mass difference {diff:.2e}")
        print("3. final assembly at scale: 2,000 parts of 256 rows")
        schema = load_schema(SCHEMA)
        arrow = output_schema(schema, "id", pa.string(), all_probs=False)
        part = pa.Table.from_pydict({"id": [f"r{i}" for i in range(256)], "sentiment": ["NEGATIVE"] * 256,
                                     "sentiment__prob": [0.5] * 256, "sentiment__mass": [0.7] * 256,
                                     "__truncated": [False] * 256}, schema=arrow)
        with WorkDir.open(tmp / "big.parquet", {"bench": 1}, arrow, resume=False) as work:
            t = time.perf_counter()
            for _ in range(2000):
                work.commit(part, [], [], truncated=0)
            commit_s = time.perf_counter() - t
            t = time.perf_counter()
            work.finish(tmp / "big.parquet", errors_path=tmp / "big.errors.jsonl", trace_path=None, metadata={})
            finish_s = time.perf_counter() - t
        meta = pq.ParquetFile(tmp / "big.parquet").metadata
        print(f"   2,000 commits {commit_s:.2f} s ({1000 * commit_s / 2000:.2f} ms each); assembly {finish_s:.2f} s "
              f"-> {meta.num_rows} rows in {meta.num_row_groups} row groups")


if __name__ == "__main__":
    main()
