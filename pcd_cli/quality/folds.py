"""Folds, splits and bootstrap resamples of gold rows, grouped by model input.

Copies of one text are not independent rows: the model reads the same input and gives the same
probabilities, so a copy in the training folds and another in the held-out fold is a leak, and a
bootstrap that draws copies one by one counts one text several times (round 7 measured a 95 %
interval shrunk to 62 % of its width by giving each gold row three times under new ids). Every
fit on gold rows therefore draws **groups**, not rows: a group is one model input, keyed as
``--reuse`` keys rows (``pcd_cli.results.input_key`` of the record's text after ``--template``,
the output's ``__input_sha256`` column); rows without a key are each a group of their own.

The one definition of the folds, used by ``pcd calibrate``'s cross-validation
(``calibration.fit_calibration``) and its decision rules (``decision.fit_rule``), ``pcd tune``'s
calibration of its holdout (``calibration.fit_trusted``), the conformal split
(``conformal.conformal_split``) and the rules' bootstrap intervals
(``decision.held_out_figures``, the cluster bootstrap: resample groups with replacement, each
drawn group bringing all its rows), and ``pcd tune``'s stratified holdout and cross-fit folds
(``tune.stratified_holdout``, ``tune.cross_fit_folds``, over ``first_rows``). With every row its own group each function gives exactly the
rows the ungrouped code gave (the same seeded permutation), so figures on distinct texts do not
move.
"""

from __future__ import annotations

import numpy as np

from ..errors import CalibrationError


def group_index(keys, n: int | None = None) -> np.ndarray:
    """(n,) int64 group numbers ``0 .. m-1`` in order of first appearance: rows with equal keys
    share one. ``keys``: a sequence of hashable keys (``None`` or NaN: a group of its own), or
    ``None``: every one of ``n`` rows its own group."""
    if keys is None:
        if n is None:
            raise ValueError("group_index: give keys or n")
        return np.arange(n, dtype=np.int64)
    seen: dict = {}
    out = np.empty(len(keys), dtype=np.int64)
    for i, key in enumerate(keys):
        if key is None or (isinstance(key, float) and key != key):
            key = ("row", i)
        out[i] = seen.setdefault(key, len(seen))
    return out


def _members(groups: np.ndarray) -> tuple[int, list[np.ndarray]]:
    """(m, rows of each group in row order)."""
    groups = np.asarray(groups, dtype=np.int64)
    m = int(groups.max()) + 1 if len(groups) else 0
    order = np.argsort(groups, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(groups, minlength=m))])
    return m, [order[bounds[j]:bounds[j + 1]] for j in range(m)]


def first_rows(groups: np.ndarray) -> np.ndarray:
    """(m,) the first row of each group (group ``j``'s representative): a function of rows
    (a stratified split) applied to these and mapped back by ``groups`` splits whole groups."""
    groups = np.asarray(groups, dtype=np.int64)
    m = int(groups.max()) + 1 if len(groups) else 0
    first = np.full(m, len(groups), dtype=np.int64)
    np.minimum.at(first, groups, np.arange(len(groups)))
    return first


def grouped_folds(groups: np.ndarray, folds: int, seed: int, *, name: str = "") -> list[np.ndarray]:
    """``folds`` parts of the rows (row indices): the groups, shuffled by ``seed``, split into
    ``folds`` near-equal runs (``np.array_split``), each part the rows of its groups; no group
    is in two parts.

    Args:
        groups: (n,) group numbers (``group_index``).

    Raises:
        CalibrationError: fewer groups (distinct texts) than ``folds``, naming field ``name``.
    """
    m, members = _members(groups)
    if m < folds:
        n = len(groups)
        texts = f" ({m} distinct texts)" if m != n else ""
        raise CalibrationError(f"field {name!r}: {n} rows with gold labels{texts}, fewer than --folds {folds}; "
                               "add gold rows or lower --folds")
    order = np.random.default_rng(seed).permutation(m)
    return [np.concatenate([members[j] for j in part]).astype(np.int64) if len(part) else np.zeros(0, np.int64)
            for part in np.array_split(order, folds)]


def grouped_split(groups: np.ndarray, share: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded split of the rows into (kept rows, held rows), both sorted: groups are taken in a
    seeded order until ``round(share * n)`` rows are held (a group is never cut in two)."""
    n = len(groups)
    m, members = _members(groups)
    order = np.random.default_rng(seed).permutation(m)
    want = int(round(share * n))
    held, count = [], 0
    for j in order:
        if count >= want:
            break
        held.append(members[j])
        count += len(members[j])
    held_rows = np.sort(np.concatenate(held)) if held else np.zeros(0, np.int64)
    return np.setdiff1d(np.arange(n), held_rows), held_rows.astype(np.int64)


def bootstrap_weights(groups: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    """(resamples, n) int64 row weights of a cluster bootstrap: each resample draws ``m`` groups
    with replacement (``m`` the groups) and weighs each row by how often its group was drawn.
    With every row its own group, the draws are those of an ordinary row bootstrap of
    ``default_rng(seed).integers(0, n, (resamples, n))``."""
    groups = np.asarray(groups, dtype=np.int64)
    m = int(groups.max()) + 1 if len(groups) else 0
    draws = np.random.default_rng(seed).integers(0, m, size=(resamples, m))
    counts = np.bincount((np.arange(resamples)[:, None] * m + draws).ravel(),
                         minlength=resamples * m).reshape(resamples, m)
    return counts[:, groups]
