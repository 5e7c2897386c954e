"""What the resume integrity check costs: reading a large input with and without the running
SHA-256 of the raw rows (``pcd_cli.io.readers.RecordReader``), as a resumed run reads past the rows
done. No model is involved; the decoder is far slower than either.

    python benchmarks/resume_hash.py [--rows 1000000] [--format jsonl|csv]
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import tempfile
import time
from pathlib import Path

from pcd_cli.io.readers import InputSpec, RecordReader


class _NoHash:
    def update(self, data: bytes) -> None:
        pass

    def hexdigest(self) -> str:
        return ""


def _write(path: Path, rows: int, fmt: str) -> None:
    text = "The flight was delayed for three hours and nobody at the gate could tell us why. " * 2
    with path.open("w", encoding="utf-8", newline="") as fh:
        if fmt == "jsonl":
            for i in range(rows):
                fh.write(json.dumps({"id": f"r{i}", "text": f"{i} {text}"}) + "\n")
        else:
            writer = csv.writer(fh)
            writer.writerow(["id", "text"])
            for i in range(rows):
                writer.writerow([f"r{i}", f"{i} {text}"])


def _read(path: Path, hashed: bool) -> tuple[float, int, str]:
    started = time.perf_counter()
    reader = RecordReader(path, InputSpec(id_field="id"), batch_size=1024)
    if not hashed:
        reader._hash = _NoHash()
    n = sum(len(batch) for batch in reader)
    return time.perf_counter() - started, n, reader.digest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--format", choices=["jsonl", "csv"], default="jsonl")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"big.{args.format}"
        _write(path, args.rows, args.format)
        size = path.stat().st_size
        data = path.read_bytes()
        started = time.perf_counter()
        hashlib.sha256(data).hexdigest()
        alone = time.perf_counter() - started
        lines = data.splitlines(keepends=True)
        started = time.perf_counter()
        digest = hashlib.sha256()
        for line in lines:  # one update per row, as the reader does
            digest.update(line)
        per_row = time.perf_counter() - started
        del data, lines
        plain = min(_read(path, hashed=False)[0] for _ in range(args.repeat))
        hashed, n, digest = min(_read(path, hashed=True) for _ in range(args.repeat))
    mb = size / 1e6
    print(f"{args.format}: {n} rows, {mb:.0f} MB")
    print(f"  read without hash: {plain:.2f} s ({mb / plain:.0f} MB/s, {n / plain:,.0f} rows/s)")
    print(f"  read with hash:    {hashed:.2f} s ({mb / hashed:.0f} MB/s); overhead {hashed - plain:+.2f} s "
          f"({100 * (hashed - plain) / plain:+.1f}%)")
    print(f"  sha256 of the whole file at once: {alone:.2f} s ({mb / alone:.0f} MB/s); one update per row: "
          f"{per_row:.2f} s ({100 * per_row / plain:.1f}% of the read)")


if __name__ == "__main__":
    main()
