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
is never empty; adding it can only raise the coverage. So is a label the schema's rules write
(``pcd_cli.schema.rules.RuleSolver.apply`` adds it when it is outside): a written label is
always inside its own set.

With fewer held rows than ``rows_needed(coverage)`` no finite threshold exists and every set
would hold every label: ``pcd calibrate`` refuses (``too_few_rows``), ``pcd label`` warns about
such a file (``weak_set_warnings``).

The guarantee is marginal (over rows), not per label: a rare label may be covered less
often; ``pcd eval`` reports coverage per gold label so that it shows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .folds import group_index, grouped_split

#: Share of each field's gold rows held out of the calibration fit for the conformal threshold.
CONFORMAL_SHARE = 0.5
#: Slack on the threshold when a set is built: a score within it of ``q`` counts as ``<= q``.
#: A gold row labelled again is read in another batch, and the decoder's float32 arithmetic then
#: gives it probabilities that differ a little (measured on the CPU, tiny test model: up to
#: 1.6e-6): without the slack, the held row whose score *is* the threshold could fall out of its
#: own set. Far below any difference in probability that matters.
SCORE_TOLERANCE = 1e-5


def rows_needed(coverage: float) -> int:
    """Fewest held rows ``n`` for which split conformal gives a finite threshold at ``coverage``:
    the rank ``ceil((n + 1) * coverage)`` must be at most ``n``, i.e. ``n >= coverage / (1 -
    coverage)`` (9 at 0.9, 19 at 0.95, 99 at 0.99). With fewer, every set holds every label."""
    n = 1
    while math.ceil((n + 1) * coverage - 1e-9) > n:
        n += 1
    return n


def gold_rows_needed(coverage: float, share: float = CONFORMAL_SHARE) -> int:
    """Fewest gold rows of a field for which ``pcd calibrate --coverage`` holds enough rows out
    (``conformal_split``: ``round(share * n)`` held) for ``rows_needed(coverage)``: 18 at 0.9."""
    n, held = 1, rows_needed(coverage)
    while int(round(share * n)) < held:
        n += 1
    return n


def max_coverage(n: int) -> float | None:
    """The highest coverage ``n`` held rows can give a finite threshold for: ``n / (n + 1)``
    (``None`` for no rows)."""
    return n / (n + 1) if n > 0 else None


def too_few_rows(field: str, n: int, coverage: float) -> str | None:
    """The message when ``n`` held rows cannot give a finite threshold at ``coverage`` (every
    label set would hold every label), naming the rows needed, held and gold; else ``None``."""
    needed = rows_needed(coverage)
    if n >= needed:
        return None
    best = max_coverage(n)
    lower = (f"ask for --coverage {math.floor(best * 100) / 100:g} or less, or " if best and best >= 0.5 else "")
    return (f"field {field!r}: {n} held rows are too few for coverage {coverage:g} (at least {needed} needed, so "
            f"{gold_rows_needed(coverage)} gold rows, as half of them set the threshold): every label set would "
            f"hold every label; {lower}add gold rows")


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
        return tuple(int(j) for i, j in enumerate(order)
                     if i == 0 or 1.0 - p[j] <= self.score_threshold + SCORE_TOLERANCE)

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


def conformal_split(n: int, seed: int, share: float = CONFORMAL_SHARE,
                    groups: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Seeded split of ``n`` rows into (fit rows, held rows): ``round(share * n)`` rows held
    for the conformal threshold, the rest for the calibration fit; copies of one model input
    (``groups``, ``folds.group_index``; ``None``: every row its own) on one side
    (``folds.grouped_split``)."""
    return grouped_split(group_index(groups, n) if groups is None else groups, share, seed + 7919)


def weak_set_warnings(fields: dict) -> list[str]:
    """One line per calibrated field (``fields``: name -> ``FieldCalibration``) whose conformal
    threshold was fitted on too few held rows for its coverage (a file ``pcd calibrate`` no
    longer writes): every set holds every label, and ``--abstain-unless-single`` abstains on
    every row of that field."""
    lines = []
    for name, fc in fields.items():
        c = getattr(fc, "conformal", None)
        if c is not None and c.n < rows_needed(c.coverage):
            lines.append(f"field {name!r}: its label sets were fitted on {c.n} held rows, too few for coverage "
                         f"{c.coverage:g} (at least {rows_needed(c.coverage)} needed): every set holds every label, "
                         "so --abstain-unless-single abstains on every row; fit again with more gold rows "
                         "(pcd calibrate --coverage)")
    return lines
