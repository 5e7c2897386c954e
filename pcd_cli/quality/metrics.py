"""Classification and calibration metrics on label indices and probabilities (numpy only).

Conventions: ``gold`` and ``pred`` are (n,) int arrays of label indices in ``[0, k)``;
``confidence`` is (n,) the probability of the chosen label; ``probs`` is (n, k), rows in
label order. Undefined values (no rows, one class for AUROC) are ``None``, never NaN.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: Bins of the expected calibration error (Guo et al. 2017 use 15).
ECE_BINS = 15
#: Probabilities are floored here before taking logs (NLL, calibration).
PROB_FLOOR = 1e-12


@dataclass(frozen=True)
class LabelScores:
    """Per-label scores. precision = tp / predicted, recall = tp / support, f1 their harmonic
    mean; 0.0 where the denominator is 0 (scikit-learn's ``zero_division=0``)."""

    label: str
    precision: float
    recall: float
    f1: float
    support: int  #: gold rows with this label
    predicted: int  #: rows predicted as this label


@dataclass(frozen=True)
class ReliabilityBin:
    """One equal-width confidence bin ``(lower, upper]`` (the first also holds 0)."""

    lower: float
    upper: float
    count: int
    accuracy: float | None  #: share of correct rows in the bin; None when empty
    confidence: float | None  #: mean chosen-label probability in the bin; None when empty


@dataclass(frozen=True)
class SelectivePoint:
    """Accuracy on the ``n`` highest-scored rows (``n = ceil(coverage * rows)``).

    Rows tied with the last one kept count by their share (expected accuracy under random
    tie-breaking), so the figure does not depend on row order.
    """

    coverage: float
    n: int
    accuracy: float | None


@dataclass(frozen=True)
class TargetPoint:
    """The lowest score threshold whose kept rows (score >= threshold) reach ``target`` accuracy.

    ``threshold`` is ``None`` (and coverage 0) when no threshold reaches it, or when the gold
    rows are too few to fit one (``reason`` says why: ``decision.budget_floor_problem``).
    """

    target: float
    threshold: float | None
    coverage: float
    n: int
    accuracy: float | None
    reason: str | None = None


def accuracy(gold: np.ndarray, pred: np.ndarray) -> float | None:
    """Share of rows with ``pred == gold``."""
    return float(np.mean(gold == pred)) if len(gold) else None


def confusion_matrix(gold: np.ndarray, pred: np.ndarray, k: int) -> np.ndarray:
    """(k, k) int64 counts; row = gold label, column = predicted label."""
    matrix = np.zeros((k, k), dtype=np.int64)
    np.add.at(matrix, (gold, pred), 1)
    return matrix


def label_scores(gold: np.ndarray, pred: np.ndarray, labels: tuple[str, ...]) -> list[LabelScores]:
    """Precision, recall, F1, support per label, from the confusion matrix."""
    matrix = confusion_matrix(gold, pred, len(labels))
    out = []
    for j, label in enumerate(labels):
        tp, support, predicted = int(matrix[j, j]), int(matrix[j].sum()), int(matrix[:, j].sum())
        p = tp / predicted if predicted else 0.0
        r = tp / support if support else 0.0
        f1 = 2 * p * r / (p + r) if p + r else 0.0
        out.append(LabelScores(label, p, r, f1, support, predicted))
    return out


def macro_f1(scores: list[LabelScores]) -> float | None:
    """Unweighted mean F1 over the labels present in the gold or the predictions (as
    scikit-learn's ``f1_score(average="macro", zero_division=0)`` without ``labels=``):
    a label nobody used neither helps nor hurts."""
    used = [s.f1 for s in scores if s.support or s.predicted]
    return float(np.mean(used)) if used else None


def majority(gold: np.ndarray, k: int) -> tuple[int, float] | None:
    """(label index, share) of the most frequent gold label (ties: first in label order)."""
    if not len(gold):
        return None
    counts = np.bincount(gold, minlength=k)
    best = int(np.argmax(counts))
    return best, float(counts[best] / len(gold))


#: ``one_label``: a label written on at least this share of a field's rows ...
ONE_LABEL_SHARE = 0.95
#: ... of at least this many rows, for a field with at least this many labels.
ONE_LABEL_MIN_ROWS, ONE_LABEL_MIN_LABELS = 10, 3


def one_label(counts: dict[str, int], n_labels: int) -> tuple[str, int, int] | None:
    """``(label, rows with it, rows)`` when one label takes (nearly) every row of a field: at
    least ``ONE_LABEL_SHARE`` of at least ``ONE_LABEL_MIN_ROWS`` rows, on a field with at least
    ``ONE_LABEL_MIN_LABELS`` labels; else ``None``. The sign of a model that does not tell the
    labels apart (the embedded model zero-shot calls every tweet NEGATIVE). A yes/no field is
    left out: the same answer on nearly every row is often the truth there (a rare event).
    The one rule of ``pcd eval``'s and ``pcd label``'s warning.

    Args:
        counts: label -> rows written with it (rows without a label left out).
        n_labels: how many labels the field has.
    """
    n = sum(counts.values())
    if n < ONE_LABEL_MIN_ROWS or n_labels < ONE_LABEL_MIN_LABELS:
        return None
    label, count = max(counts.items(), key=lambda item: item[1])
    return (label, count, n) if count >= ONE_LABEL_SHARE * n else None


def bin_index(confidence: np.ndarray, bins: int = ECE_BINS) -> np.ndarray:
    """(n,) each row's equal-width bin ``((m-1)/M, m/M]`` of the chosen label's probability, 0-based
    (a 0 goes in the first)."""
    return np.clip(np.ceil(confidence * bins).astype(np.int64) - 1, 0, bins - 1)


def reliability_bins(confidence: np.ndarray, correct: np.ndarray, bins: int = ECE_BINS) -> list[ReliabilityBin]:
    """Equal-width bins ``((m-1)/M, m/M]`` of the chosen label's probability (``bin_index``)."""
    index = bin_index(confidence, bins)
    out = []
    for m in range(bins):
        mask = index == m
        count = int(mask.sum())
        out.append(ReliabilityBin(m / bins, (m + 1) / bins, count,
                                  float(correct[mask].mean()) if count else None,
                                  float(confidence[mask].mean()) if count else None))
    return out


def ece(confidence: np.ndarray, correct: np.ndarray, bins: int = ECE_BINS) -> float | None:
    """Expected calibration error: ``sum_m |B_m|/n * |acc(B_m) - conf(B_m)|`` over equal-width
    bins of the chosen label's probability (Guo et al. 2017, "On Calibration of Modern Neural
    Networks", eq. 3)."""
    n = len(confidence)
    if not n:
        return None
    return float(sum(b.count / n * abs(b.accuracy - b.confidence)
                     for b in reliability_bins(confidence, correct, bins) if b.count))


def brier_multiclass(probs: np.ndarray, gold: np.ndarray) -> float | None:
    """Multi-class Brier score (Brier 1950): mean over rows of ``sum_j (p_j - [j = gold])^2``;
    0 is perfect, 2 the worst. For two labels it is twice the binary form."""
    if not len(gold):
        return None
    onehot = np.zeros_like(probs)
    onehot[np.arange(len(gold)), gold] = 1.0
    return float(np.mean(np.sum((probs - onehot) ** 2, axis=1)))


def brier_top_label(confidence: np.ndarray, correct: np.ndarray) -> float | None:
    """Binary Brier score of the chosen label: mean of ``(p_chosen - [chosen is correct])^2``
    (used when the full distribution, ``<f>__probs``, is not in the output); 0..1."""
    return float(np.mean((confidence - correct) ** 2)) if len(correct) else None


def nll(probs: np.ndarray, gold: np.ndarray) -> float | None:
    """Mean negative log-likelihood ``-log p(gold)``, natural log, probabilities floored at 1e-12."""
    if not len(gold):
        return None
    return float(np.mean(-np.log(np.maximum(probs[np.arange(len(gold)), gold], PROB_FLOOR))))


def auroc(score: np.ndarray, positive: np.ndarray) -> float | None:
    """Area under the ROC curve of ``score`` for ``positive`` (bool), by the Mann-Whitney U
    statistic with average ranks for ties. ``None`` when only one class is present."""
    positive = positive.astype(bool)
    n_pos = int(positive.sum())
    n_neg = len(positive) - n_pos
    if not n_pos or not n_neg:
        return None
    from scipy.stats import rankdata

    ranks = rankdata(score, method="average")
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def selective_accuracy(score: np.ndarray, correct: np.ndarray, coverage: float) -> SelectivePoint:
    """Accuracy on the ``ceil(coverage * n)`` rows of highest ``score`` (ties shared, see
    ``SelectivePoint``)."""
    n = len(score)
    m = min(n, max(1, math.ceil(coverage * n - 1e-9))) if n else 0
    if not m:
        return SelectivePoint(coverage, 0, None)
    cut = np.sort(score)[::-1][m - 1]
    above = score > cut
    tied = score == cut
    a, b = int(above.sum()), int(tied.sum())
    hits = correct[above].sum() + (m - a) * correct[tied].sum() / b
    return SelectivePoint(coverage, m, float(hits / m))


def threshold_for_accuracy(score: np.ndarray, correct: np.ndarray, target: float) -> TargetPoint:
    """Lowest threshold ``t`` among the scores such that rows with ``score >= t`` have
    accuracy >= ``target`` (the largest coverage reaching it)."""
    n = len(score)
    best = TargetPoint(target, None, 0.0, 0, None)
    if not n:
        return best
    order = np.argsort(-score, kind="mergesort")
    s, c = score[order], correct[order].astype(np.float64)
    hits = np.cumsum(c)
    ends = np.flatnonzero(np.r_[s[1:] != s[:-1], True])  # last index of each run of equal scores
    for end in ends:
        acc = hits[end] / (end + 1)
        if acc >= target - 1e-12:
            best = TargetPoint(target, float(s[end]), float((end + 1) / n), int(end + 1), float(acc))
    return best


# --- multi-select fields: (n, k) boolean gold/prediction matrices, one column per option --------


def option_scores(gold: np.ndarray, pred: np.ndarray, options: tuple[str, ...]) -> list[LabelScores]:
    """Per option, "chosen" as the positive class: precision, recall, F1 (0 where a denominator
    is 0), support (gold rows holding it) and predicted (rows where it was chosen)."""
    out = []
    for j, option in enumerate(options):
        tp = int(np.sum(gold[:, j] & pred[:, j]))
        support, predicted = int(gold[:, j].sum()), int(pred[:, j].sum())
        p = tp / predicted if predicted else 0.0
        r = tp / support if support else 0.0
        out.append(LabelScores(option, p, r, 2 * p * r / (p + r) if p + r else 0.0, support, predicted))
    return out


def micro_f1(gold: np.ndarray, pred: np.ndarray) -> float | None:
    """F1 of the pooled option decisions: ``2 tp / (2 tp + fp + fn)`` over every (row, option)
    (scikit-learn's ``f1_score(average="micro")`` on the indicator matrices); 0 when no option
    is in the gold or the predictions, ``None`` without rows."""
    if not len(gold):
        return None
    tp = int(np.sum(gold & pred))
    wrong = int(np.sum(gold != pred))
    return 2 * tp / (2 * tp + wrong) if tp + wrong else 0.0


def subset_accuracy(gold: np.ndarray, pred: np.ndarray) -> float | None:
    """Share of rows whose predicted option set is exactly the gold set (exact match)."""
    return float(np.mean(np.all(gold == pred, axis=1))) if len(gold) else None


def hamming_loss(gold: np.ndarray, pred: np.ndarray) -> float | None:
    """Share of (row, option) decisions that are wrong (0 is perfect)."""
    return float(np.mean(gold != pred)) if gold.size else None


# --- ordered scales (ordinal, integer): values or label positions on the scale ------------------


def mean_absolute_error(gold: np.ndarray, pred: np.ndarray) -> float | None:
    """Mean ``|pred - gold|`` in scale units (an integer's value, an ordinal label's position)."""
    return float(np.mean(np.abs(pred - gold))) if len(gold) else None


def within_one(gold: np.ndarray, pred: np.ndarray) -> float | None:
    """Share of rows off by at most one step on the scale."""
    return float(np.mean(np.abs(pred - gold) <= 1 + 1e-9)) if len(gold) else None


def quadratic_weighted_kappa(gold: np.ndarray, pred: np.ndarray, k: int) -> float | None:
    """Cohen's kappa with quadratic weights (Cohen 1968) over the ``k`` positions of the scale
    ``0..k-1`` (every step counts, used or not): ``1 - sum W*O / sum W*E`` with ``W_ij = (i-j)^2``,
    ``O`` the confusion counts and ``E`` the counts expected from the marginals. It equals
    scikit-learn's ``cohen_kappa_score(..., labels=range(k), weights="quadratic")``; ``None`` when
    undefined (no rows, or both sides always at one position)."""
    if not len(gold):
        return None
    observed = confusion_matrix(gold, pred, k).astype(np.float64)
    expected = np.outer(observed.sum(axis=1), observed.sum(axis=0)) / observed.sum()
    steps = np.arange(k)
    weights = (steps[:, None] - steps[None, :]) ** 2
    denominator = float(np.sum(weights * expected))
    return 1 - float(np.sum(weights * observed)) / denominator if denominator > 0 else None


# --- intervals and paired tests -----------------------------------------------------------------

#: Level of every interval ``pcd eval`` reports.
INTERVAL_LEVEL = 0.95
#: Resamples of the percentile bootstrap (Efron and Tibshirani 1993, ch. 13); seeded, so the
#: same rows give the same interval.
BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 0


def wilson_interval(successes: int, n: int, level: float = INTERVAL_LEVEL) -> tuple[float, float] | None:
    """Wilson score interval of a proportion (Wilson 1927; Brown, Cai and DasGupta 2001 advise
    it over the normal approximation for small ``n`` and rates near 0 or 1). ``None`` when n = 0.

    ``(p + z²/2n ± z·sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n)`` with ``z`` the normal quantile.
    """
    if n <= 0:
        return None
    from scipy.stats import norm

    z = float(norm.ppf(0.5 + level / 2))
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high


def bootstrap_interval(statistic, arrays: tuple[np.ndarray, ...], *, level: float = INTERVAL_LEVEL,
                       resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> tuple[float, float] | None:
    """Percentile bootstrap interval of ``statistic(*arrays)`` over rows resampled with
    replacement (the same row indices for every array). Resamples where the statistic is
    undefined (``None``, e.g. AUROC with one class) are left out; ``None`` if fewer than half
    remain or there are no rows.
    """
    n = len(arrays[0])
    if not n:
        return None
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(resamples):
        idx = rng.integers(0, n, n)
        v = statistic(*(a[idx] for a in arrays))
        if v is not None:
            values.append(v)
    if len(values) < resamples / 2:
        return None
    lo, hi = np.quantile(values, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def ece_noise_floor(confidence: np.ndarray, *, bins: int = ECE_BINS, level: float = INTERVAL_LEVEL,
                    resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> tuple[float, float] | None:
    """The ECE a perfectly calibrated model shows on these rows by chance: each row's label
    drawn right with probability ``confidence`` (so calibration holds by construction),
    ``resamples`` times, seeded; the ECE is never 0 on finite rows, and on 50 rows it is
    often 0.1. This is the consistency resampling of Bröcker and Smith (2007, "Increasing the
    reliability of reliability diagrams", Weather and Forecasting 22).

    Args:
        confidence: (n,) the chosen label's probability.

    Returns:
        ``(mean, upper)``: the mean simulated ECE and its ``level`` quantile (an observed ECE
        above ``upper`` is miscalibration the rows can show; below it, the rows cannot tell it
        from chance). ``None`` with no rows.
    """
    n = len(confidence)
    if not n:
        return None
    onehot = np.zeros((n, bins))
    onehot[np.arange(n), bin_index(confidence, bins)] = 1.0
    confidence_sums = confidence @ onehot  # (bins,): fixed, only the drawn outcomes change
    rng = np.random.default_rng(seed)
    values = []
    block = max(1, 4_000_000 // n)  # resamples per block: bounded memory on large evals
    for start in range(0, resamples, block):
        draws = (rng.random((min(block, resamples - start), n)) < confidence[None, :]).astype(np.float64)
        values.append(np.abs(draws @ onehot - confidence_sums).sum(axis=1) / n)  # = ece(confidence, draw)
    values = np.concatenate(values)
    return float(values.mean()), float(np.quantile(values, level))


@dataclass(frozen=True)
class McNemar:
    """McNemar's test of two labelings of the same rows (McNemar 1947).

    Attributes:
        n: rows in both. only_before: right before, wrong after. only_after: wrong before,
            right after. p_value: two-sided; exact (binomial, p = 1/2, on the discordant rows)
            when they are fewer than ``MCNEMAR_EXACT_BELOW``, else the chi-square form with
            continuity correction (Edwards 1948). method: ``exact`` or ``chi2``.
    """

    n: int
    only_before: int
    only_after: int
    p_value: float
    method: str


#: Below this many discordant rows McNemar's test is exact (the chi-square form is poor there).
MCNEMAR_EXACT_BELOW = 25


def mcnemar(correct_before: np.ndarray, correct_after: np.ndarray) -> McNemar:
    """McNemar's test on (n,) booleans "row right" before and after (same rows, same order)."""
    from scipy.stats import binom, chi2

    b = int(np.sum(correct_before & ~correct_after))
    c = int(np.sum(~correct_before & correct_after))
    if b + c == 0:
        return McNemar(len(correct_before), b, c, 1.0, "exact")
    if b + c < MCNEMAR_EXACT_BELOW:
        p = min(1.0, 2 * float(binom.cdf(min(b, c), b + c, 0.5)))
        return McNemar(len(correct_before), b, c, p, "exact")
    stat = (abs(b - c) - 1) ** 2 / (b + c)
    return McNemar(len(correct_before), b, c, float(chi2.sf(stat, 1)), "chi2")
