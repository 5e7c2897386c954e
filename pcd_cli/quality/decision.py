"""Decision rules: which label to write from calibrated probabilities, fitted for the user's
objective (``pcd calibrate --objective``; docs/quality.md, "Decision rules").

Probabilities answer "how sure"; a label answers "what do I do". The default (``likelihood``)
writes the most probable label (argmax). Any other objective fits, per field, a rule on the
gold rows' cross-validated calibrated probabilities:

* a boolean field (labels ``true``/``false``) and each option of a multi-select field: a
  threshold ``t`` on P(true): ``true`` is written when P(true) >= t (the cut-off tuned for a
  scorer, as scikit-learn's ``TunedThresholdClassifierCV``); every cut point between two
  distinct probabilities is tried (exhaustive);
* an enum, ordinal, integer or nullable field: one additive offset per label on the
  log-probabilities, the label written is ``argmax_j(log p_j + o_j)``, fitted by coordinate
  ascent (each offset in turn, over every value where a row's decision changes, until no
  offset improves the objective).

Objectives (one table, ``OBJECTIVES``: a row per kind, read by ``parse_objective``, the scores,
the checks and the ``--objective`` help): ``likelihood``, ``macro-f1``, ``balanced-accuracy``,
``f1:LABEL``, ``precision:LABEL>=P`` (the rule with the highest recall of LABEL among those
whose precision is at least P; refused, naming the best precision reached, when none is),
``recall:LABEL>=R`` (the highest precision among rules with recall at least R), and
``cost:FILE`` (the lowest mean cost under a cost matrix: ``read_costs``).

A rule is fitted only on enough gold rows: ``floor_problem`` (at least ``MIN_GOLD_PER_LABEL``
gold rows of each label in play, two labels or more); the same floor decides whether an
error budget (``pcd eval/review --error-budget``) can be fitted (``budget_floor_problem``).
Nor is it fitted on gold that cannot tell rules apart (``constant_problem``: the objective's
figure is the same whatever label is written, e.g. ``f1:POSITIVE`` with no POSITIVE gold row);
``fit_problem`` is both checks, refused with exit 2 before anything is fitted.

A rule is kept only where it shows a gain: ``fit_rule`` measures the rule's gain over argmax
on held-out folds with a 95 % cluster-bootstrap interval (``gain_figures``); where the interval
holds zero, the field keeps argmax (``kept_argmax``) unless the user forces the rule
(``--force-rule``). Folds and resamples are drawn by model input (``pcd_cli.quality.folds``):
copies of one text are one group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import CalibrationError, InputError
from . import metrics as M
from .folds import bootstrap_weights, group_index

#: The floor: a rule (or an error budget) is fitted only on at least this many gold rows of
#: each label in play (a label with at least one gold row), and on two labels or more.
MIN_GOLD_PER_LABEL = 10
#: At most this many candidate values per coordinate (quantiles of the breakpoints beyond it).
MAX_CANDIDATES = 512
#: Bootstrap resamples for the intervals of the held-out figures (95 %, percentile).
BOOTSTRAP = 1000


@dataclass(frozen=True)
class Objective:
    """What a decision rule is fitted for: one row of ``OBJECTIVES`` with its arguments.

    Attributes:
        kind: the row's key in ``OBJECTIVES`` (``likelihood``, ``macro-f1``, ``f1``, ``cost`` ...).
        label: the label of a row that needs one (``f1``/``precision``/``recall``; as the schema
            spells it; booleans ``true``/``false``).
        number: the number the form carries: P of ``precision:LABEL>=P``, R of
            ``recall:LABEL>=R`` (the floor); a new row's own (e.g. a beta).
        costs: a row that reads a file (``cost``): field -> gold label -> written label -> cost
            (``read_costs``); ``{}`` for a recorded one (``recorded_objective``).
        name: the objective as written (``cost:`` with the file's name), recorded in the calibration.
    """

    kind: str
    name: str
    label: str | None = None
    number: float | None = None
    costs: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def row(self) -> "ObjectiveKind":
        """Its row of ``OBJECTIVES``."""
        return OBJECTIVES[self.kind]

    @property
    def fits_rule(self) -> bool:
        """Whether a rule is fitted (every objective but ``likelihood``)."""
        return self.row.fits_rule


@dataclass(frozen=True)
class Tally:
    """What a score reads off C confusion matrices (``tally``): ``cms`` (C, k, k) (row: gold,
    column: written), ``n`` and ``accuracy`` (C,), and per label (C, k) ``precision``,
    ``recall``, ``f1`` (0 where undefined, as ``metrics.label_scores``), ``support`` (gold rows)
    and ``predicted`` (rows written)."""

    cms: np.ndarray
    n: np.ndarray
    accuracy: np.ndarray
    precision: np.ndarray
    recall: np.ndarray
    f1: np.ndarray
    support: np.ndarray
    predicted: np.ndarray


#: ``ObjectiveKind.score``: ``(objective, tally, labels, costs) -> (feasible, value)``, (C,) each.
Score = Callable[[Objective, Tally, tuple, "np.ndarray | None"], tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class ObjectiveKind:
    """One row of ``OBJECTIVES``: everything pcd knows of an objective kind. Parsing
    (``parse_objective``), scoring (``scores``, ``figure``), the held-out figures, the checks
    (``applies_to``, ``check_objective_labels``, ``constant_problem``) and the ``--objective``
    help of ``pcd calibrate`` and ``pcd tune`` (``objective_forms``) read it; nothing else
    names a kind. docs/architecture.md, "Where a new ... goes", has the recipe for a new row.

    Attributes:
        kind: the text before ``:`` (the whole text for a row without arguments).
        form: how it is written in the help, e.g. ``f1:LABEL``, ``likelihood (the most probable label)``.
        parse: ``(kind, text, rest) -> Objective``, ``rest`` the text after ``kind:`` (``""``
            for a row without arguments): ``plain``, ``with_label``, ``with_floor``,
            ``with_file`` or the row's own; raises ``InputError`` naming ``text``.
        score: what the rule fitted maximises (``Score``): the rule is the lexicographic
            maximum of ``(feasible, value, accuracy)``.
        figure_name: the name of its figure (``metric_name``), ``{label!r}`` filled in.
        figure: the figure reported, ``(objective, tally, labels, costs) -> (C,)``; ``None``:
            the score's value.
        arguments: ``""`` (none), else what follows ``kind:`` (``LABEL``, ``LABEL>=P``, ``FILE``).
        needs_label: its ``label`` must be a label of the field (else the field keeps argmax).
        reads_file: a cost file (``costs``); a field not in it keeps argmax.
        trades: a floor row (``precision``/``recall``): the figure it trades for its floor
            (recall/precision); the gain is measured in it where argmax meets the floor.
        lower_is_better: its figure is better lower (a mean cost).
        fits_rule: ``False`` for ``likelihood`` only (the argmax).
    """

    kind: str
    form: str
    parse: Callable[[str, str, str], Objective]
    score: Score
    figure_name: str
    figure: Callable[[Objective, Tally, tuple, "np.ndarray | None"], np.ndarray] | None = None
    arguments: str = ""
    needs_label: bool = False
    reads_file: bool = False
    trades: str | None = None
    lower_is_better: bool = False
    fits_rule: bool = True


def tally(cms: np.ndarray) -> Tally:
    """The ``Tally`` of (C, k, k) confusion matrices (row: gold, column: written)."""
    tp = np.diagonal(cms, axis1=1, axis2=2).astype(np.float64)
    support = cms.sum(axis=2).astype(np.float64)
    predicted = cms.sum(axis=1).astype(np.float64)
    n = cms.sum(axis=(1, 2)).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(predicted > 0, tp / np.maximum(predicted, 1), 0.0)
        r = np.where(support > 0, tp / np.maximum(support, 1), 0.0)
        f1 = np.where(p + r > 0, 2 * p * r / np.maximum(p + r, 1e-300), 0.0)
    accuracy = tp.sum(axis=1) / np.maximum(n, 1)
    return Tally(cms, n, accuracy, p, r, f1, support, predicted)


# --- the parsers of a row's arguments ------------------------------------------------------------


def plain(kind: str, text: str, rest: str) -> Objective:
    """A row without arguments (``macro-f1``)."""
    return Objective(kind, text)


def with_label(kind: str, text: str, rest: str) -> Objective:
    """``kind:LABEL``."""
    return Objective(kind, text, label=rest)


def with_floor(kind: str, text: str, rest: str) -> Objective:
    """``kind:LABEL>=P``, P in (0, 1] (the last ``>=`` splits: a label may hold one).

    Raises:
        InputError: no ``>=`` or no label, P not a number or outside (0, 1]."""
    label, ge, floor = rest.rpartition(">=")
    if not ge or not label:
        raise InputError(f"--objective {text!r}: expected {kind}:LABEL>=P, e.g. {kind}:true>=0.9")
    try:
        value = float(floor)
    except ValueError:
        raise InputError(f"--objective {text!r}: {floor!r} is not a number") from None
    if not 0 < value <= 1:
        raise InputError(f"--objective {text!r}: the floor must be in (0, 1], got {value:g}")
    return Objective(kind, text, label=label, number=value)


def with_file(kind: str, text: str, rest: str) -> Objective:
    """``kind:FILE``, a cost matrix read here (``read_costs``); named by the file's name."""
    return Objective(kind, f"{kind}:{Path(rest).name}", costs=read_costs(rest))


# --- the scores of the rows ----------------------------------------------------------------------


def _everywhere(t: Tally) -> np.ndarray:
    return np.ones(len(t.n), dtype=bool)


def _accuracy(o: Objective, t: Tally, labels, costs) -> tuple[np.ndarray, np.ndarray]:
    """Accuracy (``likelihood``: no rule is fitted; accuracy stands for it)."""
    return _everywhere(t), t.accuracy


def _macro_f1(o: Objective, t: Tally, labels, costs) -> tuple[np.ndarray, np.ndarray]:
    """Macro-F1 over labels in the gold or the predictions (``metrics.macro_f1``)."""
    used = (t.support > 0) | (t.predicted > 0)
    return _everywhere(t), (t.f1 * used).sum(axis=1) / np.maximum(used.sum(axis=1), 1)


def _balanced_accuracy(o: Objective, t: Tally, labels, costs) -> tuple[np.ndarray, np.ndarray]:
    """Mean recall over labels in the gold (scikit-learn's ``balanced_accuracy_score``)."""
    used = t.support > 0
    return _everywhere(t), (t.recall * used).sum(axis=1) / np.maximum(used.sum(axis=1), 1)


def _precision_at_floor(o: Objective, t: Tally, labels, costs) -> tuple[np.ndarray, np.ndarray]:
    """Recall of the label, feasible where its precision is >= P and it is written on at least
    ``MIN_GOLD_PER_LABEL`` rows (one lucky row is no evidence); infeasible rules are ranked by
    their precision."""
    j = labels.index(o.label)
    enough = t.predicted[:, j] >= MIN_GOLD_PER_LABEL
    feasible = enough & (t.precision[:, j] >= o.number - 1e-12)
    return feasible, np.where(feasible, t.recall[:, j], np.where(enough, t.precision[:, j], -1.0))


def _recall_at_floor(o: Objective, t: Tally, labels, costs) -> tuple[np.ndarray, np.ndarray]:
    """Precision of the label, feasible where its recall is >= R; infeasible rules are ranked
    by their recall."""
    j = labels.index(o.label)
    feasible = t.recall[:, j] >= o.number - 1e-12
    return feasible, np.where(feasible, t.precision[:, j], t.recall[:, j])


def _f1_of_label(o: Objective, t: Tally, labels, costs) -> tuple[np.ndarray, np.ndarray]:
    """F1 of the label."""
    return _everywhere(t), t.f1[:, labels.index(o.label)]


def _mean_cost(o: Objective, t: Tally, labels, costs) -> np.ndarray:
    """Mean cost per row under the (k, k) cost matrix ``costs`` (``cost_matrix``)."""
    return (t.cms * costs[None]).sum(axis=(1, 2)) / np.maximum(t.n, 1)


def _less_cost(o: Objective, t: Tally, labels, costs) -> tuple[np.ndarray, np.ndarray]:
    """Minus the mean cost (the rule maximises the score)."""
    return _everywhere(t), -_mean_cost(o, t, labels, costs)


def _of_label(per_label: str):
    """The figure ``per_label`` (a ``Tally`` attribute) of the objective's label."""
    return lambda o, t, labels, costs: getattr(t, per_label)[:, labels.index(o.label)]


#: The objective kinds (``ObjectiveKind``), in the order the help lists them. A new objective is
#: a row here and its test (docs/architecture.md, "Where a new ... goes").
OBJECTIVES: dict[str, ObjectiveKind] = {row.kind: row for row in (
    ObjectiveKind("likelihood", "likelihood (the most probable label)", plain, _accuracy, "accuracy", fits_rule=False),
    ObjectiveKind("macro-f1", "macro-f1", plain, _macro_f1, "macro-F1"),
    ObjectiveKind("balanced-accuracy", "balanced-accuracy", plain, _balanced_accuracy, "balanced accuracy"),
    ObjectiveKind("f1", "f1:LABEL", with_label, _f1_of_label, "F1 of {label!r}", arguments="LABEL", needs_label=True),
    ObjectiveKind("precision", "precision:LABEL>=P", with_floor, _precision_at_floor, "precision of {label!r}",
                  figure=_of_label("precision"), arguments="LABEL>=P", needs_label=True, trades="recall"),
    ObjectiveKind("recall", "recall:LABEL>=R", with_floor, _recall_at_floor, "recall of {label!r}",
                  figure=_of_label("recall"), arguments="LABEL>=R", needs_label=True, trades="precision"),
    ObjectiveKind("cost", "cost:FILE", with_file, _less_cost, "mean cost", figure=_mean_cost, arguments="FILE",
                  reads_file=True, lower_is_better=True),
)}
#: ``likelihood``: the argmax, no rule (the default everywhere).
LIKELIHOOD = Objective("likelihood", "likelihood")


def objective_forms() -> str:
    """The objectives as the help and the refusals list them: ``likelihood (the most probable
    label), macro-f1, ..., recall:LABEL>=R or cost:FILE`` (``OBJECTIVES``' forms, in order)."""
    forms = [row.form for row in OBJECTIVES.values()]
    return ", ".join(forms[:-1]) + f" or {forms[-1]}" if len(forms) > 1 else forms[0]


def calibrate_objective_help() -> str:
    """``pcd calibrate --objective``'s help."""
    return (f"What the labels written are chosen for: {objective_forms()} (docs/quality.md). Any but likelihood fits "
            "a decision rule per field (a threshold, per-label offsets) on the gold rows by cross-validation; needs "
            f"{MIN_GOLD_PER_LABEL} gold rows of each label in play.")


def tune_objective_help() -> str:
    """``pcd tune --objective``'s help."""
    return ("As pcd calibrate --objective: also fit a decision rule per field on the holdout's calibrated "
            "probabilities, written in the folder's pcd-calibration.json (a field below "
            f"{MIN_GOLD_PER_LABEL} holdout rows per label keeps argmax, said).")


def parse_objective(text: str) -> Objective:
    """Parse ``--objective`` by its row of ``OBJECTIVES`` (the text before ``:``); a
    ``cost:FILE`` is read here (``read_costs``). Called where an objective enters as text (the
    CLI, the Python API); everything else passes the ``Objective``.

    Raises:
        InputError: an unknown objective, arguments missing or not expected, a missing label, a
            floor outside (0, 1], an unreadable or malformed cost file; the message lists the forms.
    """
    text = (text or "").strip()
    kind, sep, rest = text.partition(":")
    row = OBJECTIVES.get(kind)
    if row is None or bool(sep) != bool(row.arguments) or (sep and not rest):
        raise InputError(f"--objective {text!r}: expected {objective_forms()}")
    return row.parse(kind, text, rest)


def recorded_objective(name: str, where: str = "the calibration") -> Objective:
    """The objective a calibration file or a labelled file records (``Objective.name``), read
    back: as ``parse_objective``, except that a file is not read (``costs`` stays ``{}``:
    ``cost:`` records only the file's name).

    Raises:
        CalibrationError: a name no row parses (names ``where`` and the problem)."""
    kind, sep, rest = name.partition(":")
    row = OBJECTIVES.get(kind)
    if row is not None and row.reads_file and rest:
        return Objective(kind, name)
    try:
        return parse_objective(name)
    except InputError as exc:
        raise CalibrationError(f"{where}: objective {name!r}: {exc}") from None


def check_objective_labels(objective: Objective, fields) -> None:
    """Refuse, before any model loads, an objective naming a label no decision field has.

    ``fields``: the schema's decision fields (``Schema.fields``: a multi-select field's options
    are boolean fields ``<field>.<option>`` with the labels ``true``/``false``).

    Raises:
        InputError: an objective whose row needs a label (``f1:LABEL``, ``precision:LABEL>=P``
            ...) whose LABEL is the label of no field; the message lists the labels there are (exit 2).
    """
    if not objective.row.needs_label:
        return
    labels = list(dict.fromkeys(label for f in fields for label in f.labels))
    if objective.label not in labels:
        raise InputError(f"--objective {objective.name}: no field of the schema has the label {objective.label!r} "
                         f"(the labels: {', '.join(labels)})")


def read_costs(path: str | Path) -> dict[str, dict[str, dict[str, float]]]:
    """Read a cost matrix file (YAML or JSON; docs/quality.md)::

        is_spam:          # a field (a multi-select option: "topics.billing")
          "true":         # the gold label
            "false": 5    # the cost of writing "false" when the gold label is "true"
          "false":
            "true": 1

    A pair not listed costs 0 when the written label is the gold one, else 1. Labels are
    checked against each field when the rule is fitted (``fit_rule``).

    Raises:
        InputError: unreadable file, not a mapping of mappings of mappings, a cost that is not a
            finite number >= 0 (each names the path and the place).
    """
    import yaml

    where = repr(str(path))
    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"--objective cost:{path}: cannot read {where} ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise InputError(f"--objective cost:{path}: {where} is not YAML or JSON ({exc})") from None
    if not isinstance(doc, dict) or not doc:
        raise InputError(f"--objective cost:{path}: {where} must map field names to {{gold label: {{written label: "
                         "cost}}}}")
    out: dict[str, dict[str, dict[str, float]]] = {}
    for fname, rows in doc.items():
        if not isinstance(rows, dict):
            raise InputError(f"{where}: field {fname!r}: expected a mapping gold label -> {{written label: cost}}")
        out[str(fname)] = {}
        for gold, cells in rows.items():
            if not isinstance(cells, dict):
                raise InputError(f"{where}: field {fname!r}, gold {_spell(gold)!r}: expected a mapping written "
                                 "label -> cost")
            out[str(fname)][_spell(gold)] = {}
            for written, cost in cells.items():
                if isinstance(cost, bool) or not isinstance(cost, (int, float)) or not math.isfinite(cost) or cost < 0:
                    raise InputError(f"{where}: field {fname!r}, gold {_spell(gold)!r}, written {_spell(written)!r}: "
                                     f"the cost must be a number >= 0, got {cost!r}")
                out[str(fname)][_spell(gold)][_spell(written)] = float(cost)
    return out


def _spell(key) -> str:
    """A YAML key as the schema spells labels (YAML reads ``true`` as a boolean)."""
    if isinstance(key, bool):
        return "true" if key else "false"
    return "null" if key is None else str(key)


def _costs(objective: Objective, name: str, labels: tuple[str, ...]) -> np.ndarray | None:
    """Field ``name``'s cost matrix where ``objective`` reads a file (``cost_matrix``), else ``None``."""
    return cost_matrix(objective, name, labels) if objective.row.reads_file else None


def cost_matrix(objective: Objective, name: str, labels: tuple[str, ...]) -> np.ndarray | None:
    """(k, k) costs of field ``name`` (row: gold, column: written), ``None`` when the file has no
    entry for it.

    Raises:
        CalibrationError: a label in its entry that the field does not have (names both)."""
    entry = objective.costs.get(name)
    if entry is None:
        return None
    k = len(labels)
    matrix = 1.0 - np.eye(k)
    for gold, cells in entry.items():
        for written, cost in cells.items():
            for label in (gold, written):
                if label not in labels:
                    raise CalibrationError(f"{objective.name}: field {name!r} has no label {label!r} (its labels: "
                                           f"{', '.join(labels)})")
            matrix[labels.index(gold), labels.index(written)] = cost
    return matrix


# --- the floor ---------------------------------------------------------------------------------


def label_counts(gold: np.ndarray, labels: tuple[str, ...]) -> dict[str, int]:
    """Gold rows per label in play (labels with at least one gold row), in label order."""
    counts = np.bincount(np.asarray(gold, dtype=np.int64), minlength=len(labels))
    return {label: int(c) for label, c in zip(labels, counts) if c}


def floor_problem(name: str, gold: np.ndarray, labels: tuple[str, ...], *,
                  minimum: int = MIN_GOLD_PER_LABEL) -> str | None:
    """Why field ``name``'s gold rows are too few to fit a rule or an error budget on, or ``None``.

    The floor (one definition for ``pcd calibrate --objective`` and ``--error-budget``): at
    least ``minimum`` gold rows of each label in play, and two labels or more in play.
    """
    counts = label_counts(gold, labels)
    n = int(sum(counts.values()))
    if len(counts) < 2:
        only = f"all of one class ({next(iter(counts))!r})" if counts else "none"
        return f"field {name!r}: only {n} gold row{'s' if n != 1 else ''}, {only}; too few to fit on (at least " \
               f"{minimum} gold rows of each label in play, two labels or more)"
    low = {label: c for label, c in counts.items() if c < minimum}
    if low:
        return (f"field {name!r}: too few gold rows of " + ", ".join(f"{label!r} ({c})" for label, c in low.items()) +
                f" to fit on: at least {minimum} gold rows of each label in play (counts: " +
                ", ".join(f"{label!r} {c}" for label, c in counts.items()) + ")")
    return None


def budget_floor_problem(name: str, gold: np.ndarray, labels: tuple[str, ...], budget: float) -> str | None:
    """Why an error budget ``budget`` cannot be fitted on field ``name``'s gold rows: the
    floor (``floor_problem``), and at least ``ceil(1 / budget)`` rows (fewer cannot show an
    error rate of ``budget``); ``None`` when it can."""
    problem = floor_problem(name, gold, labels)
    n = len(gold)
    need = math.ceil(1 / budget) if budget > 0 else None
    if problem is None and need is not None and n < need:
        problem = f"field {name!r}: only {n} gold rows, too few to show a {budget:.1%} error rate (at least " \
                  f"1/E = {need} rows)"
    elif problem is not None and need is not None and n < need:
        problem += f"; a {budget:.1%} error budget also needs at least 1/E = {need} rows"
    return problem


def constant_problem(objective: Objective, name: str, gold: np.ndarray, labels: tuple[str, ...]) -> str | None:
    """Why ``objective``'s figure cannot tell rules apart on field ``name``'s gold rows, or ``None``.

    The figure (``figure``: F1, precision or recall of the label, macro-F1, balanced accuracy,
    mean cost) is computed for the perfect labels and for every way of writing all gold rows of
    one label as another (``1 + m (k - 1)`` labelings, ``m`` labels in play); when it is the
    same for all of them no rule can be chosen for it: ``f1:L``, ``precision:L>=P`` or
    ``recall:L>=R`` with no gold row of ``L`` (always 0), a cost file giving each gold label
    one cost whatever is written. For a figure that sums over rows (a cost) these labelings
    span every change, so "the same for all" is "constant"; for the others a figure that moves
    on the perfect labels is not constant. One check for every objective kind.
    """
    if not objective.fits_rule:
        return None
    k = len(labels)
    counts = np.bincount(np.asarray(gold, dtype=np.int64), minlength=k)
    perfect = np.diag(counts)
    probes = [perfect]
    for g in np.flatnonzero(counts):
        for w in range(k):
            if w != g:
                cm = perfect.copy()
                cm[g, g], cm[g, w] = 0, counts[g]
                probes.append(cm)
    costs = _costs(objective, name, labels)
    values = figure(objective, np.stack(probes), labels, costs)
    if float(values.max() - values.min()) > 1e-12:
        return None
    shown = ", ".join(f"{label!r} {c}" for label, c in label_counts(gold, labels).items())
    metric = metric_name(objective)
    if objective.label is not None and objective.label in labels and not counts[labels.index(objective.label)]:
        return (f"field {name!r}: no gold row has the label {objective.label!r} (gold counts: {shown}), so its "
                f"{metric} is {values[0]:.3f} whatever label is written: no rule can be chosen for it; add gold rows "
                f"of {objective.label!r} or choose another objective")
    return (f"field {name!r}: the {metric} is {values[0]:.3f} whatever label is written on these {len(gold)} gold "
            f"rows (gold counts: {shown}): no rule can be chosen for it; choose another objective")


def fit_problem(objective: Objective, name: str, gold: np.ndarray, labels: tuple[str, ...]) -> str | None:
    """Why no rule for ``objective`` can be fitted on field ``name``'s gold rows (``floor_problem``,
    then ``constant_problem``), as the whole refusal message; ``None`` when one can."""
    floor = floor_problem(name, gold, labels)
    if floor is not None:
        return f"--objective {objective.name}: {floor}; add gold rows or use --objective likelihood"
    constant = constant_problem(objective, name, gold, labels)
    return None if constant is None else f"--objective {objective.name}: {constant}"


# --- scoring -----------------------------------------------------------------------------------


def _confusions(gold: np.ndarray, preds: np.ndarray, k: int) -> np.ndarray:
    """(C, k, k) confusion matrices of (C, n) predictions against (n,) gold indices."""
    c = preds.shape[0]
    flat = (np.arange(c)[:, None] * k * k + gold[None, :] * k + preds).ravel()
    return np.bincount(flat, minlength=c * k * k).reshape(c, k, k)


def scores(objective: Objective, cms: np.ndarray, labels: tuple[str, ...],
           costs: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(feasible, value, accuracy)`` of each (C, k, k) confusion matrix under ``objective``
    (its row's ``score``: ``OBJECTIVES``): the rule fitted maximises ``(feasible, value,
    accuracy)`` lexicographically. ``costs``: (k, k), a row that reads a file (``cost_matrix``).
    """
    t = tally(cms)
    feasible, value = objective.row.score(objective, t, labels, costs)
    return feasible, value, t.accuracy


def figure(objective: Objective, cms: np.ndarray, labels: tuple[str, ...],
           costs: np.ndarray | None = None) -> np.ndarray:
    """The figure ``objective`` reports (``metric_name``) of each (C, k, k) confusion matrix:
    its row's ``figure`` (precision or recall of the label whatever the ranking, the mean cost:
    lower is better), else the value of ``scores``."""
    row = objective.row
    if row.figure is not None:
        return row.figure(objective, tally(cms), labels, costs)
    return scores(objective, cms, labels, costs)[1]


def _best(feasible: np.ndarray, value: np.ndarray, accuracy: np.ndarray, closeness: np.ndarray) -> int:
    """Index of the lexicographic maximum of (feasible, value, accuracy, closeness); values within
    1e-12 count as equal."""
    key = np.round(value, 12), np.round(accuracy, 12)
    order = np.lexsort((closeness, key[1], key[0], feasible))
    return int(order[-1])


# --- rules -------------------------------------------------------------------------------------


def is_threshold_field(labels: tuple[str, ...]) -> bool:
    """A boolean decision (``true``/``false``, not nullable): its rule is a threshold on P(true)."""
    return tuple(labels) == ("true", "false")


@dataclass(frozen=True)
class DecisionRule:
    """How one field's label is chosen from its calibrated probabilities.

    Attributes:
        objective: the objective it was fitted for (``Objective.name``).
        labels: the field's labels (schema order).
        threshold: a boolean field: ``true`` is written when P(true) >= threshold; else ``None``.
        offsets: otherwise, one additive offset per label on ``log(max(p, 1e-12))``: the label
            written is ``argmax_j(log p_j + offsets_j)`` (ties: the first label).
        cv: what it gives on held-out folds beside argmax (``fit_rule``), ``{}`` when not measured.
    """

    objective: str
    labels: tuple[str, ...]
    threshold: float | None = None
    offsets: tuple[float, ...] | None = None
    cv: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def kept_argmax(self) -> bool:
        """Whether this is argmax kept in place of a rule that showed no held-out gain (``fit_rule``)."""
        return self.cv.get("kept") == "argmax"

    def fitted(self) -> "DecisionRule":
        """The rule that was fitted: itself, or where argmax was kept (``kept_argmax``) the rule
        its ``cv["fitted"]`` records (its threshold or offsets)."""
        if not self.kept_argmax:
            return self
        return DecisionRule.from_dict({"objective": self.objective, **self.cv["fitted"]}, self.labels,
                                      "the fitted rule")

    def decide(self, probs: np.ndarray) -> np.ndarray:
        """Label indices: (n, k) calibrated probabilities -> (n,) int; (k,) -> a 0-d array."""
        probs = np.asarray(probs, dtype=np.float64)
        if self.threshold is not None:
            return np.where(probs[..., 0] >= self.threshold, 0, 1)
        logp = np.log(np.maximum(probs, M.PROB_FLOOR)) + np.asarray(self.offsets)
        return np.argmax(logp, axis=-1)

    def describe(self) -> str:
        """One line, e.g. ``"true when P(true) >= 0.8312"`` or ``"offsets ham +0.00, spam +1.20"``."""
        if self.kept_argmax:
            return "argmax (the rule fitted showed no held-out gain)"
        if self.threshold is not None:
            return f"true when P(true) >= {self.threshold:.4f}"
        return "log-prob offsets " + ", ".join(f"{label} {o:+.3f}" for label, o in zip(self.labels, self.offsets))

    def to_dict(self) -> dict:
        """The calibration file's ``rule`` entry (docs/quality.md)."""
        return {"objective": self.objective,
                **({"threshold": self.threshold} if self.threshold is not None else
                   {"offsets": dict(zip(self.labels, self.offsets))}),
                "cv": self.cv}

    @classmethod
    def from_dict(cls, raw, labels: tuple[str, ...], at: str) -> "DecisionRule":
        """Read a ``rule`` entry of field with ``labels``.

        Raises:
            CalibrationError: not an object, no objective, neither a threshold in [0, 1] (a
                boolean field) nor finite offsets for every label (each names ``at``)."""
        if not isinstance(raw, dict) or not isinstance(raw.get("objective"), str):
            raise CalibrationError(f"{at}: 'rule' must be an object with an 'objective'")
        cv = raw.get("cv", {})
        if not isinstance(cv, dict):
            raise CalibrationError(f"{at}: the rule's 'cv' must be an object")
        if "threshold" in raw:
            t = raw["threshold"]
            if not is_threshold_field(labels) or isinstance(t, bool) or not isinstance(t, (int, float)) \
                    or not math.isfinite(t):
                raise CalibrationError(f"{at}: a rule 'threshold' needs a boolean field and a number, got {t!r}")
            return cls(raw["objective"], tuple(labels), threshold=float(t), cv=cv)
        offsets = raw.get("offsets")
        if not isinstance(offsets, dict) or set(offsets) != set(labels) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in offsets.values()):
            raise CalibrationError(f"{at}: the rule needs a 'threshold' or finite 'offsets' for every label "
                                   f"({', '.join(labels)})")
        return cls(raw["objective"], tuple(labels), offsets=tuple(float(offsets[x]) for x in labels), cv=cv)


def _fit_threshold(objective: Objective, probs: np.ndarray, gold: np.ndarray, labels: tuple[str, ...],
                   costs: np.ndarray | None) -> tuple[float, bool, float]:
    """Exhaustive search over every cut point of P(true): (threshold, feasible, value)."""
    p = probs[:, 0]
    uniq = np.unique(p)
    cuts = np.concatenate([[uniq[0] / 2], (uniq[1:] + uniq[:-1]) / 2,
                           [(uniq[-1] + 1) / 2 if uniq[-1] < 1 else np.nextafter(1.0, 2.0)]])
    preds = np.where(p[None, :] >= cuts[:, None], 0, 1)
    feasible, value, accuracy = scores(objective, _confusions(gold, preds, 2), labels, costs)
    best = _best(feasible, value, accuracy, -np.abs(cuts - 0.5))
    return float(cuts[best]), bool(feasible[best]), float(value[best])


def _fit_offsets(objective: Objective, probs: np.ndarray, gold: np.ndarray, labels: tuple[str, ...],
                 costs: np.ndarray | None, rounds: int = 50) -> tuple[np.ndarray, bool, float]:
    """Coordinate ascent on per-label offsets from 0 (argmax): (offsets, feasible, value)."""
    k = len(labels)
    logp = np.log(np.maximum(probs, M.PROB_FLOOR))
    offsets = np.zeros(k)
    current = scores(objective, _confusions(gold, np.argmax(logp, axis=1)[None], k), labels, costs)
    cur = (bool(current[0][0]), round(float(current[1][0]), 12), round(float(current[2][0]), 12))
    for _ in range(rounds):
        moved = False
        for j in range(k):
            others = logp + offsets
            others[:, j] = -np.inf
            rival = np.argmax(others, axis=1)
            margin = others[np.arange(len(gold)), rival]
            breaks = np.unique(margin - logp[:, j])
            if len(breaks) > MAX_CANDIDATES:
                breaks = np.unique(np.quantile(breaks, np.linspace(0, 1, MAX_CANDIDATES)))
            cand = np.concatenate([[breaks[0] - 1.0], (breaks[1:] + breaks[:-1]) / 2, [breaks[-1] + 1.0]])
            take = (logp[None, :, j] + cand[:, None]) > margin[None, :]
            preds = np.where(take, j, rival[None, :])
            feasible, value, accuracy = scores(objective, _confusions(gold, preds, k), labels, costs)
            best = _best(feasible, value, accuracy, -np.abs(cand - offsets[j]))
            key = (bool(feasible[best]), round(float(value[best]), 12), round(float(accuracy[best]), 12))
            if key > cur:
                offsets[j], cur, moved = cand[best], key, True
        if not moved:
            break
    offsets -= offsets.mean()
    return offsets, cur[0], cur[1]


def fit_once(objective: Objective, name: str, probs: np.ndarray, gold: np.ndarray,
             labels: tuple[str, ...]) -> tuple[DecisionRule, bool]:
    """The rule maximising ``objective`` on these rows (no cross-validation): ``(rule, feasible)``;
    ``feasible`` is ``False`` when a precision/recall floor is not met (the rule is then the one
    closest to it)."""
    costs = _costs(objective, name, labels)
    if is_threshold_field(labels):
        t, ok, _ = _fit_threshold(objective, probs, gold, labels, costs)
        return DecisionRule(objective.name, tuple(labels), threshold=t), ok
    offsets, ok, _ = _fit_offsets(objective, probs, gold, labels, costs)
    return DecisionRule(objective.name, tuple(labels), offsets=tuple(float(o) for o in offsets)), ok


def applies_to(objective: Objective, name: str, labels: tuple[str, ...]) -> str | None:
    """Why ``objective`` fits no rule for field ``name`` (it keeps argmax), or ``None`` when it
    does: its row fits none (``likelihood``), needs a label the field lacks, or reads a file
    without the field."""
    row = objective.row
    if not row.fits_rule:
        return f"{objective.name}: argmax"
    if row.needs_label and objective.label not in labels:
        return f"field {name!r} has no label {objective.label!r} (its labels: {', '.join(labels)}): it keeps argmax"
    if row.reads_file and name not in objective.costs:
        return f"field {name!r} is not in the cost file: it keeps argmax"
    return None


def _boot_confusions(gold: np.ndarray, preds: np.ndarray, k: int, weights: np.ndarray) -> np.ndarray:
    """(P, B, k, k) confusion matrices of (P, n) predictions against (n,) gold under (B, n) row
    weights (``folds.bootstrap_weights``)."""
    b, n = weights.shape
    out = []
    for pred in preds:
        flat = (np.arange(b)[:, None] * k * k + gold[None, :] * k + pred[None, :]).ravel()
        out.append(np.bincount(flat, weights=weights.ravel(), minlength=b * k * k).reshape(b, k, k))
    return np.stack(out)


def held_out_figures(objective: Objective, name: str, gold: np.ndarray, pred: np.ndarray,
                     labels: tuple[str, ...], *, seed: int = 0, groups: np.ndarray | None = None) -> dict:
    """The figures of predictions ``pred`` against ``gold``: the objective's value (``figure``)
    with a 95 % bootstrap interval (``BOOTSTRAP`` resamples, percentile; the rows' groups by
    model input are resampled, ``folds.bootstrap_weights``: copies of one text move together),
    accuracy and macro-F1 (as ``pcd eval``), and for a label objective the label's precision
    and recall.

    Args:
        groups: (n,) group numbers (``folds.group_index``); ``None``: every row its own group."""
    k = len(labels)
    costs = _costs(objective, name, labels)
    weights = bootstrap_weights(group_index(None, len(gold)) if groups is None else groups, BOOTSTRAP, seed)
    cms = _confusions(gold, pred[None], k)
    boot = _boot_confusions(gold, pred[None], k, weights)[0]
    value, values = figure(objective, cms, labels, costs), figure(objective, boot, labels, costs)
    _, _, accuracy = scores(objective, cms, labels, costs)
    out = {"value": float(value[0]), "low": float(np.quantile(values, 0.025)),
           "high": float(np.quantile(values, 0.975)), "accuracy": float(accuracy[0]),
           "macro_f1": M.macro_f1(M.label_scores(gold, pred, labels))}
    if objective.label is not None and objective.label in labels:
        t, j = tally(cms), labels.index(objective.label)
        out |= {"precision": float(t.precision[0, j]), "recall": float(t.recall[0, j])}
    return out


def gain_figures(objective: Objective, name: str, gold: np.ndarray, rule_pred: np.ndarray, argmax: np.ndarray,
                 labels: tuple[str, ...], *, seed: int = 0, groups: np.ndarray | None = None) -> dict:
    """The rule's gain over argmax on held-out predictions, with a paired 95 % cluster-bootstrap
    interval (both scored on the same ``BOOTSTRAP`` resamples of the groups): ``{"metric",
    "value", "low", "high"}``, positive when the rule does better.

    The gain is in the objective's figure (``figure``; a cost: argmax's mean cost minus the
    rule's); a ``precision:L>=P`` (``recall:L>=R``) objective is measured in the precision
    (recall) of L where argmax misses the floor held out, else in the recall (precision) the
    rule trades for it."""
    k = len(labels)
    costs = _costs(objective, name, labels)
    row = objective.row
    measured, metric = objective, metric_name(objective)
    if row.trades is not None:
        base = figure(objective, _confusions(gold, argmax[None], k), labels)[0]
        if base >= objective.number - 1e-12:
            other = row.trades
            measured = Objective(other, f"{other}:{objective.label}>=1", label=objective.label, number=1.0)
            metric = metric_name(measured)
    sign = -1.0 if row.lower_is_better else 1.0
    preds = np.stack([rule_pred, argmax])
    weights = bootstrap_weights(group_index(None, len(gold)) if groups is None else groups, BOOTSTRAP, seed)
    point = figure(measured, np.stack([_confusions(gold, p[None], k)[0] for p in preds]), labels, costs)
    boot = _boot_confusions(gold, preds, k, weights)
    diffs = sign * (figure(measured, boot[0], labels, costs) - figure(measured, boot[1], labels, costs))
    return {"metric": metric, "value": float(sign * (point[0] - point[1])),
            "low": float(np.quantile(diffs, 0.025)), "high": float(np.quantile(diffs, 0.975))}


def metric_name(objective: Objective) -> str:
    """The figure the objective reports (its row's ``figure_name``): ``macro-F1``, ``precision
    of 'spam'``, ``mean cost`` ..."""
    return objective.row.figure_name.format(label=objective.label)


def fit_rule(objective: Objective, name: str, probs: np.ndarray, gold: np.ndarray, labels: tuple[str, ...],
             parts: list[np.ndarray], *, seed: int = 0, groups: np.ndarray | None = None,
             force: bool = False) -> DecisionRule:
    """Fit field ``name``'s rule on ``probs`` (n, k), cross-validated calibrated probabilities of
    its gold rows (each row's from a calibration fit that did not see it), and measure it by the
    same folds: each part's rule is fitted on the other parts' rows and applied to it; the pooled
    held-out figures under the rule and at argmax (``held_out_figures``) and the rule's gain
    over argmax (``gain_figures``) go in ``rule.cv``.

    Where the gain's 95 % interval holds zero (or lies below it) the rule is not used: the rule
    returned is ``kept_argmax`` (zero offsets: the argmax), its ``cv`` holding ``kept: argmax``,
    the figures and the rule fitted (``fitted``), unless ``force`` (``--force-rule``: the rule
    is written, ``cv["forced"]`` set).

    Args:
        gold: (n,) label indices. parts: the folds (row indices), as the calibration's
            (``folds.grouped_folds``). groups: (n,) group numbers by model input
            (``folds.group_index``) for the bootstrap; ``None``: every row its own.
        force: write the rule even where it shows no held-out gain.

    Raises:
        CalibrationError: ``fit_problem`` (the gold rows are below the floor, or the
            objective's figure is the same whatever is written); a ``precision``/``recall``
            floor no rule meets on all rows (names the best precision or recall reached and the
            recall or precision there); a cost file naming a label the field does not have.
    """
    problem = fit_problem(objective, name, gold, labels)
    if problem is not None:
        raise CalibrationError(problem)
    rule, feasible = fit_once(objective, name, probs, gold, labels)
    if not feasible:
        pred = rule.decide(probs)
        figures = held_out_figures(objective, name, gold, pred, labels, seed=seed, groups=groups)
        other = objective.row.trades
        raise CalibrationError(
            f"--objective {objective.name}: field {name!r}: no decision rule reaches {objective.kind} >= "
            f"{objective.number:g} for {objective.label!r} on its {len(gold)} gold rows; the best {objective.kind} "
            f"reached is {figures[objective.kind]:.3f} ({other} {figures[other]:.3f} there, {rule.describe()}); "
            f"lower the floor, add gold rows or use a better model")
    held = np.zeros(len(gold), dtype=np.int64)
    for part in parts:
        train = np.setdiff1d(np.arange(len(gold)), part)
        fold_rule, _ = fit_once(objective, name, probs[train], gold[train], labels)
        held[part] = fold_rule.decide(probs[part])
    argmax = np.argmax(probs, axis=1)
    texts = len(np.unique(groups)) if groups is not None else len(gold)
    cv = {"folds": len(parts), "n": len(gold), **({"texts": texts} if texts != len(gold) else {}),
          "metric": metric_name(objective),
          "argmax": held_out_figures(objective, name, gold, argmax, labels, seed=seed, groups=groups),
          "rule": held_out_figures(objective, name, gold, held, labels, seed=seed, groups=groups),
          "gain": gain_figures(objective, name, gold, held, argmax, labels, seed=seed, groups=groups)}
    if cv["gain"]["low"] > 0:
        return DecisionRule(rule.objective, rule.labels, rule.threshold, rule.offsets, cv)
    if force:
        return DecisionRule(rule.objective, rule.labels, rule.threshold, rule.offsets, cv | {"forced": True})
    return kept_argmax(rule, cv)


def kept_argmax(fitted: DecisionRule, cv: dict) -> DecisionRule:
    """The rule written where ``fitted`` shows no held-out gain: zero offsets on every label
    (``argmax_j log p_j``: the argmax exactly), its ``cv`` with ``kept: "argmax"`` and the
    fitted rule (``fitted``: its threshold or offsets), so the file says what was measured."""
    shown = {k: v for k, v in fitted.to_dict().items() if k not in ("objective", "cv")}
    return DecisionRule(fitted.objective, fitted.labels, offsets=(0.0,) * len(fitted.labels),
                        cv=cv | {"kept": "argmax", "fitted": shown})


def compare_rule(objective: Objective, name: str, gold: np.ndarray, probs: np.ndarray, written: np.ndarray,
                 labels: tuple[str, ...], groups: np.ndarray | None = None) -> dict:
    """``pcd eval``'s figures at argmax and at the decision rule, side by side, on the same gold rows.

    Args:
        objective: the rule's objective (``DecisionRule.objective`` read back by
            ``recorded_objective``); one that reads a file without its costs (``cost:``) is
            scored by macro-F1 here (the cost file is not at hand). probs: (n, k) calibrated
            probabilities (argmax is taken of them). written: (n,) the labels the rule wrote.
        groups: (n,) the rows' groups by model input (``folds.group_index``) for the bootstrap.

    Returns:
        ``{"objective", "metric", "argmax": {...}, "rule": {...}}`` (``held_out_figures``).
    """
    parsed = Objective("macro-f1", objective.name) if objective.row.reads_file and not objective.costs else objective
    argmax = np.argmax(probs, axis=1)
    return {"objective": objective.name, "metric": metric_name(parsed),
            "argmax": held_out_figures(parsed, name, gold, argmax, labels, groups=groups),
            "rule": held_out_figures(parsed, name, gold, np.asarray(written, dtype=np.int64), labels, groups=groups)}


def _gain_phrase(cv: dict) -> str:
    gain = cv["gain"]
    texts = f", {cv['texts']} distinct texts" if "texts" in cv else ""
    return (f"gain in {gain['metric']} {gain['value']:+.3f}, 95 % interval [{gain['low']:+.3f}, {gain['high']:+.3f}] "
            f"({cv['folds']} folds, {cv['n']} gold rows{texts})")


def rule_warnings(name: str, rule: DecisionRule) -> list[str]:
    """Lines about field ``name``'s rule on held-out folds: argmax kept for want of a gain
    (``kept_argmax``: the figures), a rule forced although it showed none, a rule that misses
    its floor or scores below argmax on its own metric."""
    cv = rule.cv
    if not cv:
        return []
    if rule.kept_argmax:
        return [f"field {name!r}: the decision rule is no better than argmax on held-out folds ({_gain_phrase(cv)}): "
                "argmax kept; add gold rows, or pass --force-rule to write the rule anyway"]
    held, base = cv["rule"], cv["argmax"]
    lines = []
    if cv.get("forced"):
        lines.append(f"field {name!r}: the decision rule is no better than argmax on held-out folds "
                     f"({_gain_phrase(cv)}); written as --force-rule asks")
    objective = recorded_objective(rule.objective)
    if objective.row.trades is not None:
        kind, floor = objective.kind, objective.number
        if held.get(kind, 1.0) < floor:
            lines.append(f"field {name!r}: on held-out folds the rule reached {kind} {held[kind]:.3f} "
                         f"[{held['low']:.3f}, {held['high']:.3f}], below {floor:g}: the floor is met on the gold "
                         "rows the rule saw, not surely on new rows; add gold rows")
    elif not cv.get("forced") and (held["value"] > base["value"] + 1e-9 if objective.row.lower_is_better
                                   else held["value"] < base["value"] - 1e-9):
        lines.append(f"field {name!r}: on held-out folds the rule scores {cv['metric']} {held['value']:.3f}, "
                     f"argmax {base['value']:.3f}: it does not help on rows it did not see")
    return lines
