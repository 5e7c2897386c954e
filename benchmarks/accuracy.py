"""Accuracy and calibration of a pcd output against human gold labels.

    python benchmarks/accuracy.py OUTPUT.parquet GOLD.jsonl FIELD

Joins on the id column (``id`` in both files), then prints accuracy, mean probability of
the chosen label, expected calibration error (ECE, 10 equal-width bins of the chosen
label's probability; Guo et al. 2017, "On Calibration of Modern Neural Networks"), mean
candidate mass, and the confusion counts.
"""

from __future__ import annotations

import sys
from collections import Counter

import numpy as np
import orjson
import pyarrow.parquet as pq


def ece(confidence: np.ndarray, correct: np.ndarray, bins: int = 10) -> float:
    """Expected calibration error: sum over bins of (bin share) * |accuracy - mean confidence|."""
    edges = np.linspace(0.0, 1.0, bins + 1)
    total = 0.0
    for lo, hi in zip(edges[:-1], edges[1:]):
        in_bin = (confidence > lo) & (confidence <= hi)
        if in_bin.any():
            total += in_bin.mean() * abs(correct[in_bin].mean() - confidence[in_bin].mean())
    return float(total)


def main(output: str, gold_path: str, field: str) -> None:
    table = pq.read_table(output).to_pylist()
    gold = {}
    with open(gold_path, "rb") as fh:
        for line in fh:
            row = orjson.loads(line)
            gold[str(row["id"])] = row[field]
    rows = [r for r in table if str(r["id"]) in gold]
    predicted = [r[field] for r in rows]
    truth = [gold[str(r["id"])] for r in rows]
    correct = np.array([p == t for p, t in zip(predicted, truth)], dtype=float)
    confidence = np.array([r[f"{field}__prob"] for r in rows], dtype=float)
    mass = np.array([r[f"{field}__mass"] for r in rows], dtype=float)
    majority = Counter(truth).most_common(1)[0]
    print(f"{output}: {field} on {len(rows)} records with gold labels")
    print(f"  accuracy {correct.mean():.3f} (majority class {majority[0]!r}: {majority[1] / len(rows):.3f}); "
          f"mean prob {confidence.mean():.3f}; ECE {ece(confidence, correct):.3f}; mean mass {mass.mean():.3f}")
    confusion = Counter(zip(truth, predicted))
    print("  gold -> predicted: " + ", ".join(f"{t}->{p}: {n}" for (t, p), n in sorted(confusion.items(), key=str)))


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
