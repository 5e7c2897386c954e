"""The linear readout (``pcd calibrate --readout linear``, issue #50): per field, a standardised,
L2-regularised multinomial logistic regression on the model's hidden state at the field's
decision point, in place of the next-token logits there.

The decision point is the root of the field's label trie (the last token of the trunk its
spellings share: after ``"is_spam":`` for a boolean, after the opening quote for an enum whose
spellings are all quoted), the position whose next-token distribution the field's first
decision reads. The features are the hidden states of one layer or the concatenation of two
(``Backend.forward_features``; layer ``l`` is transformers' ``hidden_states[l]``), read inside
the same packed passes that score the forest, so a readout costs no extra pass.

Fitting (``fit_readout``), inside the folds ``pcd calibrate`` already uses (``parts``):

* each candidate feature set (``candidate_layers``: a few layers spread over the depth and
  concatenations of the late ones) and each strength ``C`` in ``C_GRID`` is scored by an inner
  k-fold cross-validation on the outer training rows, repeated over ``INNER_REPEATS`` shuffles:
  pooled inner held-out macro-F1 averaged over the shuffles, ties broken by the lower NLL;
  the best pair is refitted on the outer training rows and scores the outer held-out rows
  (nested cross-validation: the figures in ``cv`` never saw their rows while the layer and
  ``C`` were chosen);
* the saved readout is then chosen the same way on every row and fitted on all of them.

The regression: features standardised (mean and standard deviation of the training rows; a
constant feature's scale is 1), scikit-learn's ``LogisticRegression`` (lbfgs, multinomial,
``class_weight="balanced"``: a rare label weighs as much as a common one), ``C`` the inverse
L2 strength.

A label without gold rows (or absent from a fold's training rows) cannot be learnt by the
regression. It is not made impossible: with ``a`` such labels out of ``k``, the readout's
probabilities are ``(1 - w) * p_regression + w * p_model`` with ``w = 1 / (n + 2)`` (``n`` the
training rows; Laplace's rule of succession for a label never seen in ``n`` draws) and
``p_model`` the decoder's own probabilities over every label: an absent label keeps a small
probability in proportion to the model's belief in it, and is written only when the model is
sure of it and the labels the regression knows are all unlikely. ``pcd calibrate`` names
such labels in a warning. Without absent labels ``w = 0``.

Applying a readout needs numpy only (``Readout.probs``); fitting needs scikit-learn
(``pip install 'pcd-cli[readout]'``).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from dataclasses import field as dc_field

import numpy as np

from ..errors import CalibrationError, MissingExtra
from . import metrics as M

#: Strengths tried (inverse L2 penalty of scikit-learn's ``LogisticRegression``).
C_GRID = (0.003, 0.01, 0.03, 0.1, 0.3)
#: The readout's floor: at least this many gold rows in all, and per label that has any.
MIN_ROWS, MIN_PER_LABEL = 20, 2
#: Inner cross-validation folds choosing the layer and ``C`` (fewer when rows are few).
INNER_FOLDS = 5
#: The inner cross-validation is repeated over this many shuffles and its figures averaged: on
#: 100 gold rows one shuffle's choice of layer is noisy (on TREC one shuffle chose a layer 15
#: points worse on held-out rows than the three-shuffle choice; docs/quality.md).
INNER_REPEATS = 3


def require_sklearn() -> None:
    """Raises ``MissingExtra`` when scikit-learn (the readout's fitter) is not installed."""
    try:
        import sklearn  # noqa: F401
    except ImportError:
        raise MissingExtra("pcd calibrate --readout linear fits with scikit-learn: "
                           "pip install 'pcd-cli[readout]'") from None


def candidate_layers(n_layers: int) -> tuple[tuple[int, ...], ...]:
    """The feature sets tried for a model of ``n_layers`` layers: layers at 1/3, 1/2, 2/3, 5/6
    of the depth and the last, the concatenation of the 2/3 layer and the last, and of the 2/3,
    5/6 and last layers (for 30 layers: 10, 15, 20, 25, 30, 20+30 and 20+25+30; the first six
    are the sets of issue #50's measurement, the three late layers together were added after
    measuring on the quoted prompt: docs/quality.md, "The linear readout"); bounded, so the
    features kept while fitting are a few layers, never all of them."""
    picks = sorted({max(1, min(n_layers, round(n_layers * f))) for f in (1 / 3, 1 / 2, 2 / 3, 5 / 6, 1.0)})
    sets = [(layer,) for layer in picks]
    two, five = max(1, round(n_layers * 2 / 3)), max(1, round(n_layers * 5 / 6))
    for late in ((two, n_layers), (two, five, n_layers)):
        late = tuple(sorted(set(late)))
        if len(late) > 1 and late not in sets:
            sets.append(late)
    return tuple(sets)


def feature_layers(n_layers: int) -> tuple[int, ...]:
    """Every layer some candidate reads (``Decoder.feature_layers`` while fitting)."""
    return tuple(sorted({layer for c in candidate_layers(n_layers) for layer in c}))


@dataclass(frozen=True)
class Readout:
    """One field's fitted readout.

    Attributes:
        layers: the layers whose hidden states are concatenated, in this order.
        labels: the field's labels, in schema order.
        classes: indices (into ``labels``) of the labels the regression knows, ascending.
        mean, scale: the standardiser, float64 ``(d,)``.
        coef: float64 ``(len(classes), d)``; intercept: ``(len(classes),)``; class ``c``'s
            logit is ``coef[c] @ ((x - mean) / scale) + intercept[c]`` (a binary regression
            is stored as two rows, the first all zeros).
        absent_weight: ``w`` of the module docstring (0 when every label is known).
        C: the strength chosen.
        cv: the cross-validated figures: ``{"folds", "seed", "n", "argmax": {...}, "logits":
            {...} (today's temperature-and-bias calibration), "readout": {...}}`` each with
            ``accuracy``, ``macro_f1``, ``ece``, ``nll``; and ``"chosen"``: the layer sets and
            ``C`` the outer folds chose.
    """

    layers: tuple[int, ...]
    labels: tuple[str, ...]
    classes: tuple[int, ...]
    mean: np.ndarray = dc_field(repr=False)
    scale: np.ndarray = dc_field(repr=False)
    coef: np.ndarray = dc_field(repr=False)
    intercept: np.ndarray = dc_field(repr=False)
    absent_weight: float = 0.0
    C: float = 1.0
    cv: dict = dc_field(default_factory=dict, compare=False, hash=False)

    @property
    def absent(self) -> tuple[str, ...]:
        """Labels the regression does not know (no gold rows)."""
        return tuple(label for i, label in enumerate(self.labels) if i not in self.classes)

    def features(self, read: dict) -> np.ndarray:
        """The readout's input from ``{layer: (hidden,) array}`` (``FieldResult.features``)."""
        return np.concatenate([np.asarray(read[layer], dtype=np.float64) for layer in self.layers])

    def probs(self, x: np.ndarray, model_probs: np.ndarray) -> np.ndarray:
        """Probabilities of every label: ``x`` float ``(d,)`` or ``(n, d)`` features,
        ``model_probs`` the decoder's ``(k,)`` or ``(n, k)``; float64, same leading shape,
        rows summing to 1 (the module docstring's mixture for absent labels).

        Raises:
            ValueError: ``x`` is not ``len(mean)`` wide.
        """
        return _mixed(_regression_probs(self._params(), np.asarray(x, dtype=np.float64)), self.classes,
                      np.asarray(model_probs, dtype=np.float64), self.absent_weight)

    def _params(self):
        return self.mean, self.scale, self.coef, self.intercept

    def to_dict(self) -> dict:
        """The calibration file's ``"readout"`` object of a field (plain JSON; floats exact)."""
        return {"layers": list(self.layers), "classes": [self.labels[c] for c in self.classes],
                "absent": list(self.absent), "absent_weight": self.absent_weight, "C": self.C,
                "mean": self.mean.tolist(), "scale": self.scale.tolist(), "coef": self.coef.tolist(),
                "intercept": self.intercept.tolist(), "cv": self.cv}

    @classmethod
    def from_dict(cls, raw, labels: tuple[str, ...], where: str) -> "Readout":
        """Read and validate a field's ``"readout"`` object.

        Raises:
            CalibrationError: naming ``where`` and the key that is missing, ill-typed or of the
                wrong shape.
        """
        at = f"{where}: 'readout'"
        if not isinstance(raw, dict):
            raise CalibrationError(f"{at} must be an object")
        layers = raw.get("layers")
        if not isinstance(layers, list) or not layers or not all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in layers):
            raise CalibrationError(f"{at}: 'layers' must be a list of layer numbers >= 1")
        classes = raw.get("classes")
        if not isinstance(classes, list) or not classes or any(c not in labels for c in classes) \
                or len(set(classes)) != len(classes):
            raise CalibrationError(f"{at}: 'classes' must be distinct labels of the field ({', '.join(labels)})")
        index = sorted(labels.index(c) for c in classes)
        arrays = {}
        for key, shape in (("mean", 1), ("scale", 1), ("coef", 2), ("intercept", 1)):
            try:
                arrays[key] = np.asarray(raw.get(key), dtype=np.float64)
            except (TypeError, ValueError):
                raise CalibrationError(f"{at}: {key!r} must be numbers") from None
            if arrays[key].ndim != shape or not np.isfinite(arrays[key]).all():
                raise CalibrationError(f"{at}: {key!r} must be a {'matrix' if shape == 2 else 'list'} of finite "
                                       "numbers")
        d = len(arrays["mean"])
        if arrays["scale"].shape != (d,) or (arrays["scale"] <= 0).any() or \
                arrays["coef"].shape != (len(classes), d) or arrays["intercept"].shape != (len(classes),):
            raise CalibrationError(f"{at}: 'mean' and 'scale' (> 0) must have one entry per feature, 'coef' one row "
                                   f"of them and 'intercept' one number per class ({len(classes)})")
        order = np.argsort([labels.index(c) for c in classes])
        weight, strength = raw.get("absent_weight", 0.0), raw.get("C", 1.0)
        for key, value in (("absent_weight", weight), ("C", strength)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value < 0 or (key == "absent_weight" and value >= 1):
                raise CalibrationError(f"{at}: {key!r} must be a number in its range, got {value!r}")
        cv = raw.get("cv", {})
        if not isinstance(cv, dict):
            raise CalibrationError(f"{at}: 'cv' must be an object")
        return cls(tuple(layers), labels, tuple(index), arrays["mean"], arrays["scale"], arrays["coef"][order],
                   arrays["intercept"][order], float(weight), float(strength), cv)


@dataclass(frozen=True)
class FieldReadout:
    """What the decoder applies in the wave for one field (``Decoder.readouts``): the readout
    and the field's decision rule (``pcd calibrate --objective``) over its probabilities."""

    readout: Readout
    rule: object | None = None

    @property
    def layers(self) -> tuple[int, ...]:
        return self.readout.layers

    @property
    def by_rule(self) -> bool:
        return self.rule is not None

    def decide(self, read: dict, model_probs: np.ndarray) -> tuple[int, np.ndarray]:
        """``(label index written, (k,) readout probabilities)`` from ``{layer: (hidden,)}`` and the
        decoder's ``(k,)`` probabilities: the rule's choice, or the argmax."""
        probs = self.readout.probs(self.readout.features(read), model_probs)
        label = int(np.argmax(probs)) if self.rule is None else int(self.rule.decide(probs))
        return label, probs


# --- the regression ------------------------------------------------------------------------------

def _regression_probs(params, x: np.ndarray) -> np.ndarray:
    mean, scale, coef, intercept = params
    if x.shape[-1] != len(mean):
        raise ValueError(f"the readout takes {len(mean)} features, got {x.shape[-1]}")
    z = ((x - mean) / scale) @ coef.T + intercept
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def _mixed(p_classes: np.ndarray, classes, model_probs: np.ndarray, weight: float) -> np.ndarray:
    """The regression's probabilities over ``classes`` spread over every label, mixed with the
    model's own (renormalised) when some label is absent (``weight`` > 0)."""
    k = model_probs.shape[-1]
    out = np.zeros(p_classes.shape[:-1] + (k,))
    out[..., list(classes)] = p_classes
    if weight > 0:
        model = model_probs / np.maximum(model_probs.sum(axis=-1, keepdims=True), M.PROB_FLOOR)
        out = (1 - weight) * out + weight * model
    return out


def _fit_lr(x: np.ndarray, y: np.ndarray, C: float):
    """Standardise ``x`` and fit a balanced L2 logistic regression: ``(params, classes)``."""
    from sklearn.linear_model import LogisticRegression

    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    scale[scale == 0] = 1.0
    z = (x - mean) / scale
    classes = np.unique(y)
    if len(classes) == 1:  # one label in the rows: it is certain (the absent ones mix in)
        return (mean, scale, np.zeros((1, x.shape[1])), np.zeros(1)), tuple(int(c) for c in classes)
    # More features than rows (a hidden state of ~1000 on ~100 gold rows): the L2-penalised
    # optimum's weights lie in the span of the rows (the representer theorem), so fit on the
    # rows' coordinates in that span, z = U S V^T -> U S, and map back with V^T: the same
    # solution, at the cost of n features instead of d.
    basis = None
    if z.shape[1] > z.shape[0]:
        u, sv, basis = np.linalg.svd(z, full_matrices=False)
        z = u * sv
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # lbfgs convergence notes at the iteration cap
        model = LogisticRegression(C=C, class_weight="balanced", max_iter=2000).fit(z, y)
    coef, intercept = model.coef_, model.intercept_
    if basis is not None:
        coef = coef @ basis
    if len(classes) == 2:  # scikit-learn's one row (class 1 against class 0) as two softmax rows
        coef = np.vstack([np.zeros_like(coef), coef])
        intercept = np.array([0.0, intercept[0]])
    return (mean, scale, coef.astype(np.float64), intercept.astype(np.float64)), tuple(int(c) for c in classes)


def _absent_weight(classes, k: int, n: int) -> float:
    return 1.0 / (n + 2) if len(classes) < k else 0.0


def _predict(x_train, y_train, x_test, model_test, k: int, C: float) -> np.ndarray:
    params, classes = _fit_lr(x_train, y_train, C)
    return _mixed(_regression_probs(params, x_test), classes, model_test, _absent_weight(classes, k, len(y_train)))


def _choose(sets: dict, rows: np.ndarray, gold: np.ndarray, model: np.ndarray, k: int, labels, seed: int
            ) -> tuple[tuple[int, ...], float]:
    """The feature set and ``C`` with the best inner cross-validated macro-F1 on ``rows``: pooled
    over each shuffle's held-out folds, averaged over ``INNER_REPEATS`` seeded shuffles (ties:
    lower mean NLL; then the earlier candidate)."""
    n = len(rows)
    inner = max(2, min(INNER_FOLDS, n // 4))
    shuffles = [np.array_split(np.random.default_rng(seed + 1 + 1000 * r).permutation(n), inner)
                for r in range(INNER_REPEATS)]
    best, best_key = None, None
    for layers, x in sets.items():
        for C in C_GRID:
            figures = []
            for parts in shuffles:
                held = np.zeros((n, k))
                for part in parts:
                    train = np.setdiff1d(np.arange(n), part, assume_unique=True)
                    held[part] = _predict(x[rows[train]], gold[rows[train]], x[rows[part]], model[rows[part]], k, C)
                figures.append((M.macro_f1(M.label_scores(gold[rows], held.argmax(axis=1), labels)),
                                -M.nll(held, gold[rows])))
            key = tuple(float(v) for v in np.mean(figures, axis=0))
            if best_key is None or key > best_key:
                best, best_key = (layers, C), key
    return best


def floor_problem(name: str, gold: np.ndarray, labels) -> str | None:
    """Why ``name``'s gold rows are too few for a readout (``MIN_ROWS`` in all, ``MIN_PER_LABEL``
    for every label that has any), or ``None``."""
    counts = np.bincount(gold, minlength=len(labels))
    thin = [f"{labels[i]} ({c})" for i, c in enumerate(counts) if 0 < c < MIN_PER_LABEL]
    if len(gold) < MIN_ROWS or thin:
        return (f"field {name!r}: the linear readout needs at least {MIN_ROWS} gold rows and {MIN_PER_LABEL} per "
                f"label it has; it has {len(gold)}" + (f", and {', '.join(thin)} for" if thin else "")
                + " (add gold rows, or use --readout logits)")
    return None


def fit_readout(name: str, labels: tuple[str, ...], features: dict, gold: np.ndarray, model_probs: np.ndarray,
                parts: list[np.ndarray], *, seed: int = 0) -> tuple[Readout, np.ndarray]:
    """Fit one field's readout with nested cross-validation (the module docstring).

    Args:
        features: ``{layers: float64 (n, d)}``, one matrix per candidate feature set
            (``candidate_layers``), rows aligned with ``gold``.
        gold: int ``(n,)`` label indices. model_probs: the decoder's ``(n, k)`` probabilities.
        parts: the outer folds' held-out row indices (``pcd calibrate``'s, covering every row once).

    Returns:
        ``(readout, held_out)``: the readout chosen and fitted on every row (its ``cv`` holds
        ``{"readout": ..., "chosen": ...}``; the caller adds the other columns), and the outer
        folds' held-out readout probabilities ``(n, k)`` (what ``--objective`` fits its rule on).

    Raises:
        CalibrationError: below the floor (``floor_problem``).
    """
    problem = floor_problem(name, gold, labels)
    if problem is not None:
        raise CalibrationError(problem)
    from threadpoolctl import threadpool_limits  # scikit-learn's own dependency

    with threadpool_limits(1):  # hundreds of tiny fits: threads cost more than they give (10x on 2 busy cores)
        return _fit_nested(name, labels, features, gold, model_probs, parts, seed)


def _fit_nested(name, labels, features, gold, model_probs, parts, seed) -> tuple[Readout, np.ndarray]:
    k, n = len(labels), len(gold)
    held = np.zeros((n, k))
    chosen = []
    for j, part in enumerate(parts):
        train = np.setdiff1d(np.arange(n), part, assume_unique=True)
        layers, C = _choose(features, train, gold, model_probs, k, labels, seed + j)
        chosen.append({"layers": list(layers), "C": C})
        held[part] = _predict(features[layers][train], gold[train], features[layers][part], model_probs[part], k, C)
    layers, C = _choose(features, np.arange(n), gold, model_probs, k, labels, seed)
    params, classes = _fit_lr(features[layers], gold, C)
    readout = Readout(tuple(layers), tuple(labels), classes, *params, absent_weight=_absent_weight(classes, k, n),
                      C=float(C), cv={"chosen": chosen})
    return readout, held
