"""Label sets with a coverage guarantee: split conformal prediction on calibrated probabilities.

Score of a row: ``s = 1 - p(gold)``, one minus the calibrated probability of its gold label
(the "least ambiguous set-valued classifier", LAC, of Sadinle, Lei and Wasserman 2019: it
gives the smallest sets on average among sets built from the probabilities). On ``n`` held
rows, not used to fit the calibration, the threshold is the ``ceil((n + 1)(1 - alpha))``-th
smallest score ``q``; a new row's set holds every label with ``1 - p_j <= q``. If the held
rows and the new rows are exchangeable (drawn the same way), the set holds the gold label
with probability at least ``1 - alpha``, and at most ``1 - alpha + 1 / (n + 1)`` (Vovk,
Gammerman and Shafer 2005; Angelopoulos and Bates 2021, "A Gentle Introduction to Conformal
Prediction", section 1). The chosen label (the most probable) is always in the set, so a set
is never empty; adding it can only raise the coverage.

The guarantee is marginal (over rows), not per label: a rare label may be covered less
often; ``pcd eval`` reports coverage per gold label so that it shows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: Share of each field's gold rows held out of the calibration fit for the conformal threshold.
CONFORMAL_SHARE = 0.5


@dataclass(frozen=True)
class ConformalSet:
    """One field's conformal threshold.

    Attributes:
        coverage: the coverage asked, ``1 - alpha`` in (0, 1).
        score_threshold: ``q``; a label is in the set when ``1 - p <= q`` (``p`` calibrated).
            1.0 (every label) when the held rows are too few for the coverage asked.
        n: held rows it was computed on.
        score: how rows were scored (for the file, and for people).
    """

    coverage: float
    score_threshold: float
    n: int
    score: str = "lac: 1 - calibrated probability of the gold label"

    def label_set(self, probs: np.ndarray | tuple[float, ...]) -> tuple[int, ...]:
        """Indices of the labels in the set for (k,) calibrated probabilities, most probable first.

        The most probable label is always in it (the set is never empty).
        """
        p = np.asarray(probs, dtype=np.float64)
        order = np.argsort(-p, kind="mergesort")
        return tuple(int(j) for i, j in enumerate(order) if i == 0 or 1.0 - p[j] <= self.score_threshold)

    def to_dict(self) -> dict:
        return {"coverage": self.coverage, "score_threshold": self.score_threshold, "n": self.n, "score": self.score}

    @classmethod
    def from_dict(cls, raw: object, where: str) -> "ConformalSet":
        """Read the ``conformal`` object of a calibration file's field.

        Raises:
            ValueError: a key is missing or out of range (the message names it; ``where`` first).
        """
        if not isinstance(raw, dict):
            raise ValueError(f"{where}: 'conformal' must be an object")
        coverage, threshold, n = raw.get("coverage"), raw.get("score_threshold"), raw.get("n")
        if not _number(coverage) or not 0 < coverage < 1:
            raise ValueError(f"{where}: 'conformal.coverage' must be a number in (0, 1), got {coverage!r}")
        if not _number(threshold) or not 0 <= threshold <= 1:
            raise ValueError(f"{where}: 'conformal.score_threshold' must be in [0, 1], got {threshold!r}")
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"{where}: 'conformal.n' must be a count, got {n!r}")
        return cls(float(coverage), float(threshold), n, str(raw.get("score", cls.score)))


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def fit_conformal(probs: np.ndarray, gold: np.ndarray, coverage: float) -> ConformalSet:
    """The split-conformal threshold for ``coverage`` from held rows (see the module docstring).

    Args:
        probs: (n, k) calibrated probabilities of rows not used to fit the calibration.
        gold: (n,) gold label indices.
        coverage: ``1 - alpha``, in (0, 1).

    Raises:
        ValueError: ``coverage`` outside (0, 1).
    """
    if not 0 < coverage < 1:
        raise ValueError(f"coverage must be in (0, 1), got {coverage}")
    n = len(gold)
    rank = math.ceil((n + 1) * coverage - 1e-9)
    if n == 0 or rank > n:
        return ConformalSet(coverage, 1.0, n)
    scores = np.sort(1.0 - probs[np.arange(n), gold])
    return ConformalSet(coverage, float(scores[rank - 1]), n)


def conformal_split(n: int, seed: int, share: float = CONFORMAL_SHARE) -> tuple[np.ndarray, np.ndarray]:
    """Seeded split of ``n`` rows into (fit rows, held rows): ``round(share * n)`` rows held
    for the conformal threshold, the rest for the calibration fit."""
    order = np.random.default_rng(seed + 7919).permutation(n)
    held = int(round(share * n))
    return np.sort(order[held:]), np.sort(order[:held])

