"""``evaluate(predictions, gold) -> EvalReport``: how right a pcd output is, per field.

    >>> from pcd_cli.quality import evaluate, read_gold, read_predictions
    >>> predictions, _ = read_predictions("out/airline.labels.parquet")
    >>> report = evaluate(predictions, read_gold("sample_data/airline_tweets.jsonl"))
    >>> report.fields[0].accuracy, report.fields[0].ece

``pcd eval`` is a thin layer over this function; ``EvalReport.to_dict()`` is its ``--json``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from dataclasses import field as dc_field

import numpy as np
import pandas as pd

from ..errors import InputError
from ..schema.model import Schema
from . import metrics as M
from ..io.annotations import GOLD_ATTR, agreement
from .data import METADATA_ATTR, FieldData, MultiFieldData, field_specs, join, near_label

#: Coverages of the selective-prediction figures.
COVERAGES = (0.5, 0.8, 1.0)


@dataclass(frozen=True)
class Selective:
    """Selective prediction: keep the rows the ``score`` ranks highest.

    Attributes:
        score: ``prob`` (``<f>__prob``) or ``mass`` (``<f>__mass``).
        points: accuracy at 50 %, 80 % and 100 % coverage.
        target: threshold and coverage reaching ``--target-accuracy`` (``None`` without it).
    """

    score: str
    points: tuple[M.SelectivePoint, ...]
    target: M.TargetPoint | None


@dataclass(frozen=True)
class FieldReport:
    """Every figure of one field on its ``n`` evaluated rows (gold matched, not null, a label).

    Attributes:
        field, labels: the field and its labels (schema order; confusion rows/columns follow it).
        n: rows evaluated. gold_null: matched rows with no gold value. gold_invalid: matched
            rows whose gold value is not a label; invalid_values: up to 5 (value, count).
        accuracy, macro_f1: see ``metrics``; majority_label, majority_accuracy: the
            majority-class baseline on the same rows.
        mean_prob: mean ``<f>__prob``; mean_mass: mean ``<f>__mass``; below_min_mass: share of
            the rows whose ``<f>__mass`` is below ``min_mass`` (``pcd eval --min-mass``).
        ece: 15-bin expected calibration error of ``<f>__prob``; bins: its reliability bins.
        ece_floor: ``(mean, upper)`` ECE a perfectly calibrated model shows on these rows by
            chance (``metrics.ece_noise_floor``): an ``ece`` under ``upper`` cannot be told
            from perfect calibration on so few rows.
        brier: Brier score; brier_form: ``multiclass`` (from ``<f>__probs``, 0..2) or
            ``top_label`` (chosen label correct or not, 0..1).
        nll: mean -log p(gold), ``None`` without ``<f>__probs``.
        auroc: AUROC of ``<f>__prob`` for "the label is correct" (``None``: one class only).
        per_label: precision/recall/F1/support per label; confusion: (k, k) counts, row = gold.
        by_prob, by_mass: selective prediction ranked by probability and by candidate mass.
        intervals: ``{"accuracy", "macro_f1", "ece", "auroc"} -> (low, high)`` at
            ``interval_level`` (95 %): Wilson for the accuracy, the percentile bootstrap
            (``metrics.BOOTSTRAP_RESAMPLES`` resamples of the rows, seeded) for the others;
            ``None`` where undefined.
        ids, correct: the evaluated rows' ids and whether each was right (for the paired
            test of ``pcd eval --compare``; not in ``to_dict``).
        abstained: rows whose label is null (``--abstain-unless-single``); the figures above
            are on the decided rows only, ``n`` of ``n + abstained``.
        label_sets: with ``<f>__set`` columns: ``{"rows", "covered", "coverage",
            "coverage_interval", "mean_size", "asked", "per_label": {label: {"rows",
            "coverage"}}}`` (``coverage``: share of rows whose set holds the gold label, with
            its Wilson interval; ``asked``: the coverage the calibration was fitted for).
        type: the field's type (``boolean``, ``enum``, ``ordinal``, ``integer``).
        scale_rows, scale_excluded, mae, within_one, qwk: ordinal and integer fields only
            (``None`` otherwise): on the ``scale_rows`` evaluated rows whose gold and predicted
            labels are both on the scale (``scale_excluded``: rows where either is the null
            option or the ``none_label``), the mean absolute error and the share off by at most
            one step (in values for an integer, label positions for an ordinal) and the
            quadratic weighted kappa over the scale's positions; their intervals are in
            ``intervals`` (Wilson for ``within_one``, the bootstrap for ``mae`` and ``qwk``).
    """

    field: str
    labels: tuple[str, ...]
    n: int
    gold_null: int
    gold_invalid: int
    invalid_values: tuple[tuple[str, int], ...]
    accuracy: float | None
    macro_f1: float | None
    majority_label: str | None
    majority_accuracy: float | None
    mean_prob: float | None
    mean_mass: float | None
    ece: float | None
    bins: tuple[M.ReliabilityBin, ...]
    brier: float | None
    brier_form: str
    nll: float | None
    auroc: float | None
    per_label: tuple[M.LabelScores, ...]
    confusion: tuple[tuple[int, ...], ...]
    by_prob: Selective
    by_mass: Selective | None
    intervals: dict = dc_field(default_factory=dict)
    interval_level: float = M.INTERVAL_LEVEL
    abstained: int = 0
    label_sets: dict | None = None
    type: str = "enum"
    scale_rows: int | None = None
    scale_excluded: int | None = None
    mae: float | None = None
    within_one: float | None = None
    qwk: float | None = None
    min_mass: float = 0.5
    below_min_mass: float | None = None
    ece_floor: tuple[float, float] | None = None
    decision_rule: dict | None = None
    ids: tuple = dc_field(default=(), repr=False, compare=False)
    correct: tuple = dc_field(default=(), repr=False, compare=False)

    def to_dict(self) -> dict:
        d = _report_dict(self, "labels", "per_label")
        d["confusion"] = [list(row) for row in self.confusion]
        return _finite(d)


@dataclass(frozen=True)
class MultiFieldReport:
    """Every figure of one multi-select field on its ``n`` evaluated rows (gold matched, a list
    of its options), ``k`` options.

    Attributes:
        field, options: the field and its options (schema order).
        n, gold_null, gold_invalid, invalid_values, abstained: as ``FieldReport``.
        subset_accuracy: share of rows whose chosen set is exactly the gold set.
        hamming_loss: share of the ``n * k`` option decisions that are wrong.
        micro_f1: F1 of all (row, option) decisions pooled; macro_f1: mean F1 over the options
            chosen in the gold or the predictions (an option nobody used neither helps nor
            hurts, as ``FieldReport.macro_f1``).
        per_option: precision/recall/F1/support/predicted per option ("chosen" is positive).
        mean_gold_size, mean_pred_size: mean options per row in the gold and the predictions.
        mean_prob, mean_mass: means of ``<f>__prob`` (the whole choice) and ``<f>__mass``.
        brier, nll, ece: of the option decisions pooled: mean ``(P(yes) - [gold yes])^2``, mean
            ``-ln p(gold decision)``, and the 15-bin ECE of the written decision's probability.
        intervals: ``{"subset_accuracy"}`` Wilson, ``{"hamming_loss", "micro_f1", "macro_f1"}``
            the percentile bootstrap over rows, at ``interval_level``.
        ids, correct: the evaluated rows' ids and whether each row's set was exactly right (for
            ``pcd eval --compare``; not in ``to_dict``).
    """

    field: str
    options: tuple[str, ...]
    n: int
    gold_null: int
    gold_invalid: int
    invalid_values: tuple[tuple[str, int], ...]
    subset_accuracy: float | None
    hamming_loss: float | None
    micro_f1: float | None
    macro_f1: float | None
    per_option: tuple[M.LabelScores, ...]
    mean_gold_size: float | None
    mean_pred_size: float | None
    mean_prob: float | None
    mean_mass: float | None
    brier: float | None
    nll: float | None
    ece: float | None
    intervals: dict = dc_field(default_factory=dict)
    interval_level: float = M.INTERVAL_LEVEL
    abstained: int = 0
    type: str = "multi"
    ids: tuple = dc_field(default=(), repr=False, compare=False)
    correct: tuple = dc_field(default=(), repr=False, compare=False)

    def to_dict(self) -> dict:
        return _finite(_report_dict(self, "options", "per_option"))


@dataclass(frozen=True)
class EvalReport:
    """The result of ``evaluate``.

    Attributes:
        id_field: gold id column; id_column: the predictions' id column.
        gold_rows, prediction_rows, matched: row counts.
        gold_without_prediction, predictions_without_gold: unmatched rows (reported, not dropped).
        answered, matched_answered: gold rows with an answer (a gold value for some field; a
            skipped or untouched annotation task has none), and those matched.
        agreement: per field answered by several annotators (an annotation tool's export), over
            the matched rows: ``annotations.agreement``'s ``rows``, ``disagree``, ``ties``,
            ``tie_ids`` and ``agreement``.
        fields: one report per field with gold labels, multi-select fields aside;
            multi_fields: one per multi-select field with gold labels; fields_without_gold: the others.
        metadata: the predictions' ``pcd.*`` metadata (model, schema hash...), if known.
        warnings: the schema given differs from the one the predictions were made with; gold
            rows without prediction; gold values that are not labels; accuracy below the
            majority baseline; AUROC at or below 0.5.
    """

    id_field: str
    id_column: str
    gold_rows: int
    prediction_rows: int
    matched: int
    gold_without_prediction: int
    predictions_without_gold: int
    fields: tuple[FieldReport, ...]
    fields_without_gold: tuple[str, ...]
    metadata: dict
    warnings: tuple[str, ...]
    multi_fields: tuple[MultiFieldReport, ...] = ()
    answered: int = 0
    matched_answered: int = 0
    agreement: dict = dc_field(default_factory=dict)

    def field(self, name: str) -> FieldReport | MultiFieldReport:
        return next(f for f in (*self.fields, *self.multi_fields) if f.field == name)

    def to_dict(self) -> dict:
        """The ``pcd eval --json`` object (shape documented in docs/quality.md); strict JSON values."""
        return {
            "id_field": self.id_field, "id_column": self.id_column, "gold_rows": self.gold_rows,
            "prediction_rows": self.prediction_rows, "matched": self.matched,
            "gold_rows_with_answer": self.answered, "matched_with_answer": self.matched_answered,
            "gold_without_prediction": self.gold_without_prediction,
            "predictions_without_gold": self.predictions_without_gold,
            "fields": {f.field: f.to_dict() for f in self.fields},
            "multi_fields": {f.field: f.to_dict() for f in self.multi_fields},
            "fields_without_gold": list(self.fields_without_gold),
            "agreement": {k: dict(v) for k, v in self.agreement.items()},
            "metadata": dict(self.metadata), "warnings": list(self.warnings),
        }


#: Fewer evaluated rows than this draw a warning (the accuracy's 95 % interval is wider than ±0.1).
SMALL_SAMPLE = 100


def evaluate(predictions: pd.DataFrame, gold: pd.DataFrame, schema: Schema | None = None, *, id_field: str = "id",
             target_accuracy: float | None = None, min_mass: float = 0.5, calibration=None,
             error_budget: float | None = None) -> EvalReport:
    """Score a pcd output against human gold labels, per field.

    Args:
        predictions: a pcd output (``read_predictions`` or ``Labeler.label_frame``).
        gold: one row per record: ``id_field`` and a column per field with human labels.
        schema: gives the fields and labels; ``None``: from the predictions' metadata
            (``df.attrs["metadata"]["pcd.schema_json"]``) or columns.
        id_field: the gold id column; also the predictions' id column when it has one
            (else ``row``). Ids are compared as strings.
        target_accuracy: also find the ``__prob`` (and ``__mass``) threshold reaching it.
        min_mass: a field's ``below_min_mass`` is the share of its rows with ``__mass`` below this.
        error_budget: ``--error-budget E``: ``target_accuracy`` 1 - E, fitted only on gold rows at
            the floor (``decision.budget_floor_problem``); below it a field gets no threshold (every
            row to review) and a warning. ``--target-accuracy`` alone measures without the floor.
        calibration: a ``Calibration`` with decision rules (``pcd eval --calibration``) to compare
            with argmax on an output labelled without it (``<f>__probs`` needed). An output labelled
            with rules (``pcd.decision_rules`` metadata) is compared without it. Either way a
            field's ``decision_rule`` holds the figures at argmax and at the rule
            (``decision.compare_rule``).

    Returns:
        An ``EvalReport``; every gold row is evaluated or counted (no prediction, null gold,
        gold value not a label).

    Raises:
        InputError: missing id columns, an empty id, no field in both files, predictions
            that do not fit the schema.
        ValueError: ``target_accuracy`` outside (0, 1].
    """
    if error_budget is not None and target_accuracy is None:
        target_accuracy = 1.0 - error_budget
    if target_accuracy is not None and not 0 < target_accuracy <= 1:
        raise ValueError(f"target_accuracy must be in (0, 1], got {target_accuracy}")
    specs = field_specs(predictions, schema)
    joined = join(predictions, gold, specs, id_field=id_field)
    if joined.fields and any(d.gold_invalid for d in joined.fields) and \
            all(len(d.ids) + d.abstained == 0 for d in joined.fields):
        raise InputError("no matched gold value is a label of its field, so nothing can be scored: "
                         + "; ".join(f"field {d.spec.name!r}: {d.gold_invalid} are not labels: {_invalid_examples(d)}"
                                     for d in joined.fields if d.gold_invalid)
                         + " (labels are matched exactly)")
    metadata = dict(predictions.attrs.get(METADATA_ATTR) or {})
    warnings = []
    if schema is not None and metadata.get("pcd.schema_sha256") not in (None, schema.source_sha256):
        warnings.append(f"the predictions were labelled with another schema (sha256 "
                        f"{metadata['pcd.schema_sha256'][:12]}..., this one {schema.source_sha256[:12]}...)")
    notes = gold.attrs.get(GOLD_ATTR) or {}
    warnings.extend(notes.get("warnings") or ())
    warnings.extend(joined.repeated_ids)
    agreements = _agreements(joined, notes, predictions)
    for name, a in agreements.items():
        if a["disagree"]:
            ties = (f"; {a['ties']} tied (no answer most given: no gold, e.g. id {a['tie_ids'][0]!r})"
                    if a["ties"] else "")
            warnings.append(f"field {name!r}: the annotators disagree on {a['disagree']} of the {a['rows']} rows "
                            f"answered more than once (pairwise agreement {a['agreement']:.3f}); the gold is the "
                            f"answer most of them gave{ties}")
    if joined.gold_without_prediction:
        warnings.append(f"{joined.gold_without_prediction} gold rows have no prediction (e.g. id "
                        f"{joined.unmatched_gold_ids[0]!r}); they are not in the figures")
    for data in joined.fields:
        if data.gold_invalid:
            warnings.append(f"field {data.spec.name!r}: {data.gold_invalid} gold values are not labels: "
                            f"{_invalid_examples(data)}")
    asked = json.loads(metadata.get("pcd.label_sets", "{}") or "{}")
    fields = tuple(field_report(d, target_accuracy, asked=asked.get(d.spec.name), min_mass=min_mass)
                   for d in joined.fields if isinstance(d, FieldData))
    single = [d for d in joined.fields if isinstance(d, FieldData)]
    compared = _rule_comparisons(single, metadata, calibration, warnings)
    fields = tuple(replace(f, decision_rule=compared[f.field]) if f.field in compared else f for f in fields)
    if error_budget is not None:  # an error budget needs the floor's gold rows
        fields, floor_warnings = _budget_floor(fields, single, error_budget)
        warnings.extend(floor_warnings)
    multi = tuple(multi_field_report(d) for d in joined.fields if isinstance(d, MultiFieldData))
    for f in fields:
        if f.n and f.accuracy < f.majority_accuracy:
            warnings.append(f"field {f.field!r}: accuracy {f.accuracy:.3f} is below the majority-class baseline "
                            f"{f.majority_accuracy:.3f} (always {f.majority_label!r}); see pcd calibrate")
        dominant = M.one_label({s.label: s.predicted for s in f.per_label}, len(f.labels))
        if dominant:
            only, count, n = dominant
            gold_share = next(s.support for s in f.per_label if s.label == only) / n
            written = "every row was labelled" if count == n else f"{count} of {n} rows were labelled"
            warnings.append(f"field {f.field!r}: {written} {only!r}; the accuracy {f.accuracy:.3f} is near the share "
                            f"of {only!r} in the gold labels ({gold_share:.3f}), not a sign the model tells the "
                            f"labels apart (macro-F1 {f.macro_f1:.3f})")
        if 0 < f.n < SMALL_SAMPLE:
            low, high = f.intervals["accuracy"]
            warnings.append(f"field {f.field!r}: only {f.n} rows: the accuracy is somewhere in [{low:.2f}, {high:.2f}] "
                            f"(95 %, Wilson), "
                            f"and ECE over {M.ECE_BINS} bins is noisy; score a few hundred rows to compare settings")
        sets = f.label_sets
        if sets and sets["asked"] and sets["coverage_interval"][1] < sets["asked"]:
            warnings.append(f"field {f.field!r}: the label sets hold the gold label on {sets['coverage']:.3f} of the "
                            f"rows, below the {sets['asked']:.2f} asked beyond sampling error (95 % interval "
                            f"[{sets['coverage_interval'][0]:.3f}, {sets['coverage_interval'][1]:.3f}]): these rows "
                            "are not drawn like the calibration's gold rows")
        if f.auroc is not None and f.auroc <= 0.5:
            warnings.append(f"field {f.field!r}: AUROC {f.auroc:.3f}: a higher probability is not more often right; "
                            "the probabilities carry no signal about correctness here")
    for f in multi:
        if f.n and f.mean_pred_size == 0 and f.mean_gold_size:
            warnings.append(f"field {f.field!r}: no option was chosen on any row (the gold rows hold "
                            f"{f.mean_gold_size:.2f} options on average); the subset accuracy {f.subset_accuracy:.3f} "
                            "is the share of rows whose gold is empty")
        if 0 < f.n < SMALL_SAMPLE:
            low, high = f.intervals["subset_accuracy"]
            warnings.append(f"field {f.field!r}: only {f.n} rows: the subset accuracy is somewhere in "
                            f"[{low:.2f}, {high:.2f}] (95 %, Wilson); score a few hundred rows to compare settings")
    return EvalReport(
        id_field=id_field, id_column=joined.id_column, gold_rows=joined.gold_rows,
        prediction_rows=joined.prediction_rows, matched=joined.matched,
        gold_without_prediction=joined.gold_without_prediction,
        predictions_without_gold=joined.predictions_without_gold,
        fields=fields, fields_without_gold=joined.fields_without_gold, metadata=metadata, warnings=tuple(warnings),
        multi_fields=multi, answered=joined.answered, matched_answered=joined.matched_answered,
        agreement=agreements)


def _agreements(joined, notes: dict, predictions: pd.DataFrame) -> dict:
    """``annotations.agreement`` per field with gold, over the matched gold rows, for the fields
    some row of which was answered by two annotators or more."""
    answers = notes.get("answers") or {}
    if not answers:
        return {}
    column = predictions[joined.id_column].tolist()
    predicted = {str(int(v)) if isinstance(v, float) and v.is_integer() else str(v) for v in column}
    ids = [rid for rid in answers if rid in predicted]
    columns = dict(joined.gold_column)
    out = {}
    for data in joined.fields:
        name = data.spec.name
        stats = agreement(answers, columns.get(name, name), ids, multi=data.spec.is_multi)
        if stats["rows"]:
            out[name] = stats
    return out


def field_report(data: FieldData, target_accuracy: float | None = None, *,
                 asked: float | None = None, min_mass: float = 0.5) -> FieldReport:
    """Every figure of ``FieldReport`` from one field's aligned rows (``asked``: the coverage
    the label sets were fitted for, from the output's ``pcd.label_sets`` metadata;
    ``min_mass``: the candidate mass below which a row counts in ``below_min_mass``)."""
    labels, k = data.spec.labels, len(data.spec.labels)
    correct = (data.gold == data.pred).astype(np.float64)
    scores = M.label_scores(data.gold, data.pred, labels)
    major = M.majority(data.gold, k)
    if data.probs is not None:
        brier, form, nll = M.brier_multiclass(data.probs, data.gold), "multiclass", M.nll(data.probs, data.gold)
    else:
        brier, form, nll = M.brier_top_label(data.prob, correct), "top_label", None
    has_mass = bool(len(data.mass)) and bool(np.all(np.isfinite(data.mass)))
    scale = scale_figures(data)
    return FieldReport(
        field=data.spec.name, labels=labels, n=len(data.gold), gold_null=data.gold_null,
        gold_invalid=data.gold_invalid, invalid_values=data.invalid_values,
        accuracy=M.accuracy(data.gold, data.pred), macro_f1=M.macro_f1(scores),
        majority_label=labels[major[0]] if major else None, majority_accuracy=major[1] if major else None,
        mean_prob=float(data.prob.mean()) if len(data.prob) else None,
        mean_mass=float(data.mass.mean()) if has_mass else None,
        min_mass=min_mass, below_min_mass=float((data.mass < min_mass).mean()) if has_mass else None,
        ece=M.ece(data.prob, correct), bins=tuple(M.reliability_bins(data.prob, correct)),
        ece_floor=M.ece_noise_floor(data.prob), brier=brier, brier_form=form, nll=nll,
        auroc=M.auroc(data.prob, correct.astype(bool)),
        per_label=tuple(scores), confusion=tuple(map(tuple, M.confusion_matrix(data.gold, data.pred, k).tolist())),
        by_prob=selective("prob", data.prob, correct, target_accuracy),
        by_mass=selective("mass", data.mass, correct, target_accuracy) if has_mass else None,
        intervals=intervals(data, correct) | scale.pop("intervals", {}), abstained=data.abstained,
        label_sets=label_set_report(data, asked), type=data.spec.type, **scale,
        ids=tuple(data.ids.tolist()), correct=tuple(correct.astype(bool).tolist()))


def scale_figures(data: FieldData) -> dict:
    """``FieldReport``'s ordered-scale figures of an ordinal or integer field (``{}`` otherwise):
    ``scale_rows``, ``scale_excluded``, ``mae``, ``within_one``, ``qwk`` and their ``intervals``."""
    if not data.spec.is_scale:
        return {}
    values = data.spec.scale_values()
    on = np.isfinite(values)
    position = np.full(len(values), -1, dtype=np.int64)
    position[on] = np.arange(int(on.sum()))
    keep = on[data.gold] & on[data.pred]
    gold, pred = values[data.gold[keep]], values[data.pred[keep]]
    gold_pos, pred_pos = position[data.gold[keep]], position[data.pred[keep]]
    k = int(on.sum())
    near = np.abs(pred - gold) <= 1 + 1e-9
    return {"scale_rows": int(keep.sum()), "scale_excluded": int((~keep).sum()),
            "mae": M.mean_absolute_error(gold, pred), "within_one": M.within_one(gold, pred),
            "qwk": M.quadratic_weighted_kappa(gold_pos, pred_pos, k),
            "intervals": {"mae": M.bootstrap_interval(M.mean_absolute_error, (gold, pred)),
                          "within_one": M.wilson_interval(int(near.sum()), len(near)),
                          "qwk": M.bootstrap_interval(lambda g, p: M.quadratic_weighted_kappa(g, p, k),
                                                      (gold_pos, pred_pos))}}


def multi_field_report(data: MultiFieldData) -> MultiFieldReport:
    """Every figure of ``MultiFieldReport`` from one multi-select field's aligned rows."""
    options, gold, pred, p_yes = data.spec.labels, data.gold, data.pred, data.p_yes
    scores = M.option_scores(gold, pred, options)
    n = len(gold)
    written = np.where(pred, p_yes, 1 - p_yes)  # the probability of each written decision
    p_gold = np.where(gold, p_yes, 1 - p_yes)
    right = (gold == pred).astype(np.float64)
    exact = np.all(gold == pred, axis=1)
    has_mass = bool(n) and bool(np.all(np.isfinite(data.mass)))
    return MultiFieldReport(
        field=data.spec.name, options=options, n=n, gold_null=data.gold_null, gold_invalid=data.gold_invalid,
        invalid_values=data.invalid_values, subset_accuracy=M.subset_accuracy(gold, pred),
        hamming_loss=M.hamming_loss(gold, pred), micro_f1=M.micro_f1(gold, pred), macro_f1=M.macro_f1(scores),
        per_option=tuple(scores), mean_gold_size=float(gold.sum(axis=1).mean()) if n else None,
        mean_pred_size=float(pred.sum(axis=1).mean()) if n else None,
        mean_prob=float(data.prob.mean()) if n else None, mean_mass=float(data.mass.mean()) if has_mass else None,
        brier=float(np.mean((p_yes - gold) ** 2)) if n else None,
        nll=float(np.mean(-np.log(np.maximum(p_gold, M.PROB_FLOOR)))) if n else None,
        ece=M.ece(written.ravel(), right.ravel()),
        intervals={
            "subset_accuracy": M.wilson_interval(int(exact.sum()), n),
            "hamming_loss": M.bootstrap_interval(M.hamming_loss, (gold, pred)),
            "micro_f1": M.bootstrap_interval(M.micro_f1, (gold, pred)),
            "macro_f1": M.bootstrap_interval(lambda g, p: M.macro_f1(M.option_scores(g, p, options)), (gold, pred)),
        },
        abstained=data.abstained, ids=tuple(data.ids.tolist()), correct=tuple(exact.tolist()))


def label_set_report(data: FieldData, asked: float | None) -> dict | None:
    """Empirical coverage and mean size of the ``<f>__set`` label sets, overall (with a Wilson
    interval) and per gold label; ``None`` without sets."""
    if data.sets is None or not data.sets:
        return None
    covered = [g in s for g, s in zip(data.set_gold, data.sets)]
    per_label = {}
    for label in data.spec.labels:
        hits = [c for c, g in zip(covered, data.set_gold) if g == label]
        if hits:
            per_label[label] = {"rows": len(hits), "coverage": float(np.mean(hits))}
    return {"rows": len(covered), "covered": int(sum(covered)), "coverage": float(np.mean(covered)),
            "coverage_interval": list(M.wilson_interval(int(sum(covered)), len(covered))),
            "mean_size": float(np.mean([len(s) for s in data.sets])), "asked": asked, "per_label": per_label}


def intervals(data: FieldData, correct: np.ndarray) -> dict:
    """95 % intervals of one field's accuracy (Wilson), macro-F1, ECE and AUROC (percentile
    bootstrap over rows; ``metrics.bootstrap_interval``)."""
    labels = data.spec.labels
    hit = correct.astype(bool)
    return {
        "accuracy": M.wilson_interval(int(hit.sum()), len(hit)),
        "macro_f1": M.bootstrap_interval(lambda g, p: M.macro_f1(M.label_scores(g, p, labels)), (data.gold, data.pred)),
        "ece": M.bootstrap_interval(M.ece, (data.prob, correct)),
        "auroc": M.bootstrap_interval(lambda s, c: M.auroc(s, c), (data.prob, hit)),
    }


def _rule_comparisons(data: list, metadata: dict, calibration, warnings: list[str]) -> dict[str, dict]:
    """Field -> figures at argmax and at its decision rule (``evaluate``'s ``calibration``)."""
    from .decision import compare_rule, recorded_objective

    written = json.loads(metadata.get("pcd.decision_rules") or "{}")
    labelled_calibrated = bool(metadata.get("pcd.calibration_sha256"))
    if calibration is not None and not labelled_calibrated:
        calibration.check(metadata)
    out = {}
    for d in data:
        name = d.spec.name
        fc = calibration.fields.get(name) if calibration is not None and not labelled_calibrated else None
        if name not in written and (fc is None or not fc.by_rule):
            continue
        if d.probs is None or not len(d.gold):
            warnings.append(f"field {name!r}: no {name}__probs column: label with --all-probs to compare argmax with "
                            "the decision rule")
            continue
        if fc is not None and fc.readout is not None and name not in written:
            warnings.append(f"field {name!r}: the calibration's rule acts on its linear readout, which reads the "
                            "model's hidden state; an output file does not hold it, so the readout cannot be "
                            "recomputed here: label the rows with --calibration and evaluate that output")
            continue
        if name in written:  # the output holds the calibrated probabilities and the rule's labels
            objective = recorded_objective(written[name]["objective"], f"field {name!r}: pcd.decision_rules")
            out[name] = compare_rule(objective, name, d.gold, d.probs, d.pred, d.spec.labels,
                                     d.groups())
        else:
            probs = fc.apply(d.probs)
            objective = recorded_objective(fc.rule.objective, f"field {name!r}: the calibration's rule")
            out[name] = compare_rule(objective, name, d.gold, probs, fc.rule.decide(probs), d.spec.labels,
                                     d.groups())
    return out


def _budget_floor(fields: tuple, data: list, budget: float) -> tuple[tuple, list[str]]:
    """The fields' reports with no threshold (``TargetPoint.threshold`` ``None``: every row goes
    to review) where the gold rows are below the floor for an error ``budget``
    (``decision.budget_floor_problem``: at least 10 gold rows of each label in play, two labels
    or more, ``1/budget`` rows), and one warning per such field."""
    from .decision import budget_floor_problem

    out, lines = [], []
    for f, d in zip(fields, data):
        problem = budget_floor_problem(d.spec.name, d.gold, d.spec.labels, budget)
        if problem is None or f.by_prob.target is None:
            out.append(f)
            continue
        lines.append(f"{problem}: no threshold is fitted for a {budget:.1%} error budget, every row of this field "
                     "goes to review")

        def refused(sel):
            if sel is None or sel.target is None:
                return sel
            return replace(sel, target=M.TargetPoint(sel.target.target, None, 0.0, 0, None, reason=problem))

        out.append(replace(f, by_prob=refused(f.by_prob), by_mass=refused(f.by_mass)))
    return tuple(out), lines


def selective(name: str, score: np.ndarray, correct: np.ndarray, target_accuracy: float | None) -> Selective:
    return Selective(name, tuple(M.selective_accuracy(score, correct, c) for c in COVERAGES),
                     M.threshold_for_accuracy(score, correct, target_accuracy) if target_accuracy else None)


def _report_dict(report, labels: str, per_label: str) -> dict:
    """The JSON form shared by a field's and a multi field's report: its dataclass fields
    without the per-row ``ids``/``correct``, intervals as lists, the ``labels`` attribute as a
    list, invalid values as objects and the ``per_label`` scores keyed by label."""
    d = asdict(report)
    del d["ids"], d["correct"]
    d["intervals"] = {k: (list(v) if v is not None else None) for k, v in report.intervals.items()}
    d[labels] = list(getattr(report, labels))
    d["invalid_values"] = [{"value": v, "count": c} for v, c in report.invalid_values]
    d[per_label] = {s.label: {k: v for k, v in asdict(s).items() if k != "label"} for s in getattr(report, per_label)}
    return d


def _finite(value):
    """NaN/inf -> None, numpy scalars -> Python, recursively (strict JSON)."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _invalid_examples(data) -> str:
    """A field's most frequent gold values that are not labels, with their counts and the label
    each spells but for case (``data.near_label``): ``"'positive' (2; the label is 'POSITIVE'),
    'POSITVE' (1)"``."""

    def spelt(value) -> str:
        label = near_label(value, data.spec)
        return f"; the label is {label!r}" if label is not None else ""

    return ", ".join(f"{v!r} ({c}{spelt(v)})" for v, c in data.invalid_values)
