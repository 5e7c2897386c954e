"""The linear readout (``pcd calibrate --readout linear``, issue #50): per field, a standardised,
L2-regularised multinomial logistic regression on the model's hidden state at the field's
decision point, in place of the next-token logits there.

The decision point is the root of the field's label trie (the last token of the trunk its
spellings share: after ``"is_spam":`` for a boolean, after the opening quote for an enum whose
spellings are all quoted), the position whose next-token distribution the field's first
decision reads. The features of one regression are the hidden states of one layer there or
the concatenation of several (``Backend.forward_features``; layer ``l`` is transformers'
``hidden_states[l]``), or, written ``-l``, the mean of layer ``l``'s hidden states over the
record's tokens (its rendering and the prompt up to the answer, after the cached head: what the
pooled sentence embeddings of the rivals read); all are read inside the same packed passes that
score the forest, so a readout costs no extra pass.

A field's readout averages the probabilities of up to ``ENSEMBLE`` such regressions, each on
its own feature set with its own strength: the sets the inner cross-validation ranks best.

Fitting (``fit_readout``), inside the folds ``pcd calibrate`` already uses (``parts``):

* each candidate feature set (``candidate_layers``: a few layers spread over the depth at the
  decision point, concatenations of the late ones, and the record-mean of the middle ones) is
  given its strength ``C`` in ``C_GRID`` by an inner k-fold cross-validation on the outer
  training rows, repeated over ``INNER_REPEATS`` shuffles: pooled inner held-out macro-F1
  averaged over the shuffles, ties broken by the lower NLL; the ``ENSEMBLE`` sets with the best
  figures are refitted on the outer training rows and their averaged probabilities score the
  outer held-out rows (nested cross-validation: the figures in ``cv`` never saw their rows while
  the sets and strengths were chosen);
* the saved readout is then chosen the same way on every row and fitted on all of them.

Why an average of the three best and the record-mean: chosen by nested cross-validation on the
first 100 gold rows of SMS, airline, TREC and intents only (never their held-out rows), the
average of the three best sets (with the record-means among the candidates) scored 0.911 /
0.950 / 0.620 / 0.658 cross-validated macro-F1 on intents / SMS / airline / TREC against the
single best decision-point set's 0.872 / 0.950 / 0.615 / 0.609 (docs/quality.md, "The linear
readout").

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
from dataclasses import replace

import numpy as np

from ..errors import CalibrationError, MissingExtra
from . import metrics as M

#: The regressions a readout averages: the best-ranked candidate sets (module docstring).
ENSEMBLE = 3
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
    """The feature sets tried for a model of ``n_layers`` layers: at the decision point, layers
    at 1/3, 1/2, 2/3, 5/6 of the depth and the last, the concatenation of the 2/3 layer and the
    last, and of the 2/3, 5/6 and last layers; and the record-means (``-l``) of the 1/3, 1/2,
    2/3 and 5/6 layers (for 30 layers: 10, 15, 20, 25, 30, 20+30, 20+25+30, -10, -15, -20,
    -25; the first six are the sets of issue #50's measurement, the three late layers together
    were added after measuring on the quoted prompt, the means after the nested
    cross-validation of the module docstring: docs/quality.md, "The linear readout"); bounded,
    so the features kept while fitting are a few layers, never all of them."""
    picks = sorted({max(1, min(n_layers, round(n_layers * f))) for f in (1 / 3, 1 / 2, 2 / 3, 5 / 6, 1.0)})
    sets = [(layer,) for layer in picks]
    two, five = max(1, round(n_layers * 2 / 3)), max(1, round(n_layers * 5 / 6))
    for late in ((two, n_layers), (two, five, n_layers)):
        late = tuple(sorted(set(late)))
        if len(late) > 1 and late not in sets:
            sets.append(late)
    middle = sorted({max(1, min(n_layers, round(n_layers * f))) for f in (1 / 3, 1 / 2, 2 / 3, 5 / 6)})
    sets.extend((-layer,) for layer in middle)
    return tuple(sets)


def regression_name(layers) -> str:
    """A regression's features in words: ``"layers 20+30"`` at the decision point, ``"the
    record-mean of layer 20"`` for ``(-20,)``, ``"layer 30 & the record-mean of layer 20"``."""
    if all(layer > 0 for layer in layers):
        return f"layer{'s' if len(layers) > 1 else ''} {'+'.join(map(str, layers))}"
    return " & ".join(f"layer {layer}" if layer > 0 else f"the record-mean of layer {-layer}" for layer in layers)


def feature_layers(n_layers: int) -> tuple[int, ...]:
    """Every layer some candidate reads (``Decoder.feature_layers`` while fitting)."""
    return tuple(sorted({layer for c in candidate_layers(n_layers) for layer in c}))


@dataclass(frozen=True)
class Readout:
    """One field's fitted readout: its first regression's parameters, and ``members``, the
    others whose probabilities are averaged with it (``ENSEMBLE``).

    Attributes:
        layers: the first regression's layers, whose hidden states are concatenated in this
            order (``-l``: layer ``l``'s mean over the record's tokens); ``read_layers`` is
            every regression's.
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
        members: the other regressions (``Readout`` values without members or ``cv``, the same
            ``labels``, ``classes`` and ``absent_weight``); ``()``: the readout is one regression.
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
    members: tuple["Readout", ...] = ()

    @property
    def regressions(self) -> tuple["Readout", ...]:
        """Every regression averaged: this one and ``members``."""
        return (self, *self.members)

    @property
    def read_layers(self) -> tuple[int, ...]:
        """Every layer some regression reads, in first use order."""
        return tuple(dict.fromkeys(layer for r in self.regressions for layer in r.layers))

    def describe(self) -> str:
        """The regressions in words: ``"layers 20+30 (C 0.1)"``, or ``"the mean of 2 regressions:
        layers 20+30 (C 0.1) + the record-mean of layer 15 (C 0.03)"`` (``regression_name``)."""
        each = " + ".join(f"{regression_name(r.layers)} (C {r.C:g})" for r in self.regressions)
        return each if not self.members else f"the mean of {len(self.regressions)} regressions: {each}"

    @property
    def absent(self) -> tuple[str, ...]:
        """Labels the regression does not know (no gold rows)."""
        return tuple(label for i, label in enumerate(self.labels) if i not in self.classes)

    def features(self, read: dict) -> np.ndarray:
        """This regression's input from ``{layer: (hidden,) or (n, hidden) array}``
        (``FieldResult.features``): ``layers``' arrays concatenated, ``(d,)`` or ``(n, d)``."""
        return np.concatenate([np.asarray(read[layer], dtype=np.float64) for layer in self.layers], axis=-1)

    def probs(self, x: np.ndarray, model_probs: np.ndarray) -> np.ndarray:
        """This regression alone (not its ``members``): probabilities of every label from ``x``
        float ``(d,)`` or ``(n, d)`` features and ``model_probs`` the decoder's ``(k,)`` or
        ``(n, k)``; float64, same leading shape, rows summing to 1 (the module docstring's
        mixture for absent labels).

        Raises:
            ValueError: ``x`` is not ``len(mean)`` wide.
        """
        return _mixed(_regression_probs(self._params(), np.asarray(x, dtype=np.float64)), self.classes,
                      np.asarray(model_probs, dtype=np.float64), self.absent_weight)

    def read_probs(self, read: dict, model_probs: np.ndarray) -> np.ndarray:
        """The readout's probabilities of every label: the mean of its regressions' over the
        labels they know, then the absent labels' mixture; ``read`` is ``{layer: (hidden,) or
        (n, hidden)}`` with every ``read_layers``, ``model_probs`` ``(k,)`` or ``(n, k)``.

        Raises:
            KeyError: a layer missing from ``read``. ValueError: a layer of the wrong width.
        """
        return self._averaged([r.features(read) for r in self.regressions], model_probs)

    def _averaged(self, xs: list, model_probs: np.ndarray) -> np.ndarray:
        """``read_probs`` from each regression's input ``xs`` (in ``regressions`` order)."""
        known = np.mean([_regression_probs(r._params(), np.asarray(x, dtype=np.float64))
                         for r, x in zip(self.regressions, xs)], axis=0)
        return _mixed(known, self.classes, np.asarray(model_probs, dtype=np.float64), self.absent_weight)

    def _params(self):
        return self.mean, self.scale, self.coef, self.intercept

    def to_dict(self) -> dict:
        """The calibration file's ``"readout"`` object of a field (plain JSON; floats exact): the
        first regression's keys, ``"members"`` the others' (``layers``, ``C`` and the arrays;
        omitted when there are none, so a one-regression readout is written as before)."""
        out = {"layers": list(self.layers), "classes": [self.labels[c] for c in self.classes],
               "absent": list(self.absent), "absent_weight": self.absent_weight, "C": self.C,
               **self._arrays(), "cv": self.cv}
        if self.members:
            out["members"] = [{"layers": list(m.layers), "C": m.C, **m._arrays()} for m in self.members]
        return out

    def _arrays(self) -> dict:
        return {"mean": self.mean.tolist(), "scale": self.scale.tolist(), "coef": self.coef.tolist(),
                "intercept": self.intercept.tolist()}

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
        classes = raw.get("classes")
        if not isinstance(classes, list) or not classes or any(c not in labels for c in classes) \
                or len(set(classes)) != len(classes):
            raise CalibrationError(f"{at}: 'classes' must be distinct labels of the field ({', '.join(labels)})")
        first = cls._regression_from_dict(raw, labels, classes, at)
        weight = raw.get("absent_weight", 0.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) \
                or not 0 <= weight < 1:
            raise CalibrationError(f"{at}: 'absent_weight' must be a number in its range, got {weight!r}")
        cv = raw.get("cv", {})
        if not isinstance(cv, dict):
            raise CalibrationError(f"{at}: 'cv' must be an object")
        members = raw.get("members", [])
        if not isinstance(members, list):
            raise CalibrationError(f"{at}: 'members' must be a list of regressions")
        rest = tuple(replace(cls._regression_from_dict(m, labels, classes, f"{at}: 'members'[{j}]"),
                             absent_weight=float(weight)) for j, m in enumerate(members))
        return replace(first, absent_weight=float(weight), cv=cv, members=rest)

    @classmethod
    def _regression_from_dict(cls, raw, labels: tuple[str, ...], classes: list, at: str) -> "Readout":
        """One regression's ``layers``, ``C`` and arrays (``from_dict``)."""
        if not isinstance(raw, dict):
            raise CalibrationError(f"{at} must be an object")
        layers = raw.get("layers")
        if not isinstance(layers, list) or not layers or not all(
                isinstance(v, int) and not isinstance(v, bool) and v != 0 for v in layers) or \
                len(set(layers)) != len(layers):
            raise CalibrationError(f"{at}: 'layers' must be a list of distinct layer numbers (>= 1; -l for layer "
                                   "l's mean over the record)")
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
        strength = raw.get("C", 1.0)
        if isinstance(strength, bool) or not isinstance(strength, (int, float)) or not math.isfinite(strength) \
                or strength < 0:
            raise CalibrationError(f"{at}: 'C' must be a number in its range, got {strength!r}")
        return cls(tuple(layers), labels, tuple(index), arrays["mean"], arrays["scale"], arrays["coef"][order],
                   arrays["intercept"][order], 0.0, float(strength))


@dataclass(frozen=True)
class FieldReadout:
    """What the decoder applies in the wave for one field (``Decoder.readouts``): the readout
    and the field's decision rule (``pcd calibrate --objective``) over its probabilities."""

    readout: Readout
    rule: object | None = None

    @property
    def layers(self) -> tuple[int, ...]:
        """Every layer the readout reads (``Readout.read_layers``)."""
        return self.readout.read_layers

    @property
    def by_rule(self) -> bool:
        return self.rule is not None

    def non_finite(self, read: dict) -> str | None:
        """The layers of ``read`` (``{layer: (hidden,)}``) this readout reads whose hidden state
        holds a NaN or an infinity, in words (``regression_name``: ``"layer 30 & the record-mean
        of layer 20"``), for the decoder's error; ``None`` when every one is finite."""
        bad = [layer for layer in self.layers if not np.isfinite(read[layer]).all()]
        return regression_name(bad) if bad else None

    def decide(self, read: dict, model_probs: np.ndarray) -> tuple[int, np.ndarray]:
        """``(label index written, (k,) readout probabilities)`` from ``{layer: (hidden,)}`` and the
        decoder's ``(k,)`` probabilities: the rule's choice, or the argmax."""
        probs = self.readout.read_probs(read, model_probs)
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


def _ranked(sets: dict, rows: np.ndarray, gold: np.ndarray, model: np.ndarray, k: int, labels, seed: int
            ) -> list[tuple[tuple[int, ...], float]]:
    """Every feature set with its best ``C``, best first: ``[(layers, C), ...]``. A pair's
    figure is its inner cross-validated macro-F1 on ``rows``, pooled over each shuffle's held-out
    folds and averaged over ``INNER_REPEATS`` seeded shuffles (ties: lower mean NLL; then the
    earlier candidate, the earlier set)."""
    n = len(rows)
    inner = max(2, min(INNER_FOLDS, n // 4))
    shuffles = [np.array_split(np.random.default_rng(seed + 1 + 1000 * r).permutation(n), inner)
                for r in range(INNER_REPEATS)]
    best: list[tuple[tuple, int, tuple[int, ...], float]] = []  # (key, -order, layers, C)
    for order, (layers, x) in enumerate(sets.items()):
        mine = None
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
            if mine is None or key > mine[0]:
                mine = (key, -order, tuple(layers), C)
        best.append(mine)
    best.sort(key=lambda t: (t[0], t[1]), reverse=True)
    return [(layers, C) for _, _, layers, C in best]


def _fit_chosen(sets: dict, chosen, rows: np.ndarray, gold: np.ndarray, labels) -> Readout:
    """The chosen ``(layers, C)`` pairs (``_ranked``), each fitted on ``rows``: one ``Readout``,
    the first pair's regression with the others as its ``members``."""
    fits = [(layers, C, *_fit_lr(sets[layers][rows], gold[rows], C)) for layers, C in chosen]
    weight = _absent_weight(fits[0][3], len(labels), len(rows))
    regressions = [Readout(tuple(layers), tuple(labels), classes, *params, absent_weight=weight, C=float(C))
                   for layers, C, params, classes in fits]
    return replace(regressions[0], members=tuple(regressions[1:]))


def floor_problem(name: str, gold: np.ndarray, labels) -> str | None:
    """Why ``name``'s gold rows are too few for a readout (``MIN_ROWS`` in all, ``MIN_PER_LABEL``
    for every label that has any), or ``None``."""
    counts = np.bincount(gold, minlength=len(labels))
    thin = [f"{labels[i]} ({c})" for i, c in enumerate(counts) if 0 < c < MIN_PER_LABEL]
    if len(gold) < MIN_ROWS or thin:
        return (f"field {name!r}: the linear readout needs at least {MIN_ROWS} gold rows and {MIN_PER_LABEL} of "
                f"each label that has any; it has {len(gold)} rows"
                + ((f", and only {thin[0]} of that label" if len(thin) == 1 else
                    f", and {len(thin)} labels have fewer than {MIN_PER_LABEL}: {', '.join(thin)}") if thin else "")
                + " (add gold rows; leave the field's column out of the gold file to fit the other fields' readouts "
                "without it; or use --readout logits)")
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
        top = _ranked(features, train, gold, model_probs, k, labels, seed + j)[:ENSEMBLE]
        chosen.append([{"layers": list(layers), "C": C} for layers, C in top])
        fold = _fit_chosen(features, top, train, gold, labels)
        held[part] = fold._averaged([features[r.layers][part] for r in fold.regressions], model_probs[part])
    top = _ranked(features, np.arange(n), gold, model_probs, k, labels, seed)[:ENSEMBLE]
    return replace(_fit_chosen(features, top, np.arange(n), gold, labels), cv={"chosen": chosen}), held
