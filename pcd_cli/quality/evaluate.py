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
from dataclasses import asdict, dataclass, field as dc_field

import numpy as np
import pandas as pd

from ..schema import Schema
from . import metrics as M
from .data import METADATA_ATTR, FieldData, field_specs, join

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
        mean_prob: mean ``<f>__prob``; mean_mass: mean ``<f>__mass``.
        ece: 15-bin expected calibration error of ``<f>__prob``; bins: its reliability bins.
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
    ids: tuple = dc_field(default=(), repr=False, compare=False)
    correct: tuple = dc_field(default=(), repr=False, compare=False)

    def to_dict(self) -> dict:
        d = asdict(self)
        del d["ids"], d["correct"]
        d["intervals"] = {k: (list(v) if v is not None else None) for k, v in self.intervals.items()}
        d["labels"] = list(self.labels)
        d["invalid_values"] = [{"value": v, "count": c} for v, c in self.invalid_values]
        d["per_label"] = {s.label: {k: v for k, v in asdict(s).items() if k != "label"} for s in self.per_label}
        d["confusion"] = [list(row) for row in self.confusion]
        return _finite(d)


@dataclass(frozen=True)
class EvalReport:
    """The result of ``evaluate``.

    Attributes:
        id_field: gold id column; id_column: the predictions' id column.
        gold_rows, prediction_rows, matched: row counts.
        gold_without_prediction, predictions_without_gold: unmatched rows (reported, not dropped).
        fields: one report per field with gold labels; fields_without_gold: the others.
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

    def field(self, name: str) -> FieldReport:
        return next(f for f in self.fields if f.field == name)

    def to_dict(self) -> dict:
        """The ``pcd eval --json`` object (shape documented in docs/quality.md); strict JSON values."""
        return {
            "id_field": self.id_field, "id_column": self.id_column, "gold_rows": self.gold_rows,
            "prediction_rows": self.prediction_rows, "matched": self.matched,
            "gold_without_prediction": self.gold_without_prediction,
            "predictions_without_gold": self.predictions_without_gold,
            "fields": {f.field: f.to_dict() for f in self.fields},
            "fields_without_gold": list(self.fields_without_gold),
            "metadata": dict(self.metadata), "warnings": list(self.warnings),
        }


#: Fewer evaluated rows than this draw a warning (the accuracy's 95 % interval is wider than ±0.1).
SMALL_SAMPLE = 100


def evaluate(predictions: pd.DataFrame, gold: pd.DataFrame, schema: Schema | None = None, *, id_field: str = "id",
             target_accuracy: float | None = None) -> EvalReport:
    """Score a pcd output against human gold labels, per field.

    Args:
        predictions: a pcd output (``read_predictions`` or ``Labeler.label_frame``).
        gold: one row per record: ``id_field`` and a column per field with human labels.
        schema: gives the fields and labels; ``None``: from the predictions' metadata
            (``df.attrs["metadata"]["pcd.schema_json"]``) or columns.
        id_field: the gold id column; also the predictions' id column when it has one
            (else ``row``). Ids are compared as strings.
        target_accuracy: also find the ``__prob`` (and ``__mass``) threshold reaching it.

    Returns:
        An ``EvalReport``; every gold row is evaluated or counted (no prediction, null gold,
        gold value not a label).

    Raises:
        InputError: missing id columns, duplicate ids, no field in both files, predictions
            that do not fit the schema.
        ValueError: ``target_accuracy`` outside (0, 1].
    """
    if target_accuracy is not None and not 0 < target_accuracy <= 1:
        raise ValueError(f"target_accuracy must be in (0, 1], got {target_accuracy}")
    specs = field_specs(predictions, schema)
    joined = join(predictions, gold, specs, id_field=id_field)
    metadata = dict(predictions.attrs.get(METADATA_ATTR) or {})
    warnings = []
    if schema is not None and metadata.get("pcd.schema_sha256") not in (None, schema.source_sha256):
        warnings.append(f"the predictions were labelled with another schema (sha256 "
                        f"{metadata['pcd.schema_sha256'][:12]}..., this one {schema.source_sha256[:12]}...)")
    if joined.gold_without_prediction:
        warnings.append(f"{joined.gold_without_prediction} gold rows have no prediction (e.g. id "
                        f"{joined.unmatched_gold_ids[0]!r}); they are not in the figures")
    for data in joined.fields:
        if data.gold_invalid:
            examples = ", ".join(f"{v!r} ({c})" for v, c in data.invalid_values)
            warnings.append(f"field {data.spec.name!r}: {data.gold_invalid} gold values are not labels: {examples}")
    asked = json.loads(metadata.get("pcd.label_sets", "{}") or "{}")
    fields = tuple(field_report(d, target_accuracy, asked=asked.get(d.spec.name)) for d in joined.fields)
    for f in fields:
        if f.n and f.accuracy < f.majority_accuracy:
            warnings.append(f"field {f.field!r}: accuracy {f.accuracy:.3f} is below the majority-class baseline "
                            f"{f.majority_accuracy:.3f} (always {f.majority_label!r}); see pcd calibrate")
        if f.n and len({c for row in f.confusion for c, v in enumerate(row) if v}) == 1:
            only = f.labels[next(c for row in f.confusion for c, v in enumerate(row) if v)]
            warnings.append(f"field {f.field!r}: every row was labelled {only!r}; the accuracy {f.accuracy:.3f} is "
                            f"the share of {only!r} in the gold labels, not a sign the model tells the labels apart "
                            f"(macro-F1 {f.macro_f1:.3f})")
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
    return EvalReport(
        id_field=id_field, id_column=joined.id_column, gold_rows=joined.gold_rows,
        prediction_rows=joined.prediction_rows, matched=joined.matched,
        gold_without_prediction=joined.gold_without_prediction,
        predictions_without_gold=joined.predictions_without_gold,
        fields=fields, fields_without_gold=joined.fields_without_gold, metadata=metadata, warnings=tuple(warnings))


def field_report(data: FieldData, target_accuracy: float | None = None, *,
                 asked: float | None = None) -> FieldReport:
    """Every figure of ``FieldReport`` from one field's aligned rows (``asked``: the coverage
    the label sets were fitted for, from the output's ``pcd.label_sets`` metadata)."""
    labels, k = data.spec.labels, len(data.spec.labels)
    correct = (data.gold == data.pred).astype(np.float64)
    scores = M.label_scores(data.gold, data.pred, labels)
    major = M.majority(data.gold, k)
    if data.probs is not None:
        brier, form, nll = M.brier_multiclass(data.probs, data.gold), "multiclass", M.nll(data.probs, data.gold)
    else:
        brier, form, nll = M.brier_top_label(data.prob, correct), "top_label", None
    has_mass = bool(len(data.mass)) and bool(np.all(np.isfinite(data.mass)))
    return FieldReport(
        field=data.spec.name, labels=labels, n=len(data.gold), gold_null=data.gold_null,
        gold_invalid=data.gold_invalid, invalid_values=data.invalid_values,
        accuracy=M.accuracy(data.gold, data.pred), macro_f1=M.macro_f1(scores),
        majority_label=labels[major[0]] if major else None, majority_accuracy=major[1] if major else None,
        mean_prob=float(data.prob.mean()) if len(data.prob) else None,
        mean_mass=float(data.mass.mean()) if has_mass else None,
        ece=M.ece(data.prob, correct), bins=tuple(M.reliability_bins(data.prob, correct)),
        brier=brier, brier_form=form, nll=nll, auroc=M.auroc(data.prob, correct.astype(bool)),
        per_label=tuple(scores), confusion=tuple(map(tuple, M.confusion_matrix(data.gold, data.pred, k).tolist())),
        by_prob=selective("prob", data.prob, correct, target_accuracy),
        by_mass=selective("mass", data.mass, correct, target_accuracy) if has_mass else None,
        intervals=intervals(data, correct), abstained=data.abstained, label_sets=label_set_report(data, asked),
        ids=tuple(data.ids.tolist()), correct=tuple(correct.astype(bool).tolist()))


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


def selective(name: str, score: np.ndarray, correct: np.ndarray, target_accuracy: float | None) -> Selective:
    return Selective(name, tuple(M.selective_accuracy(score, correct, c) for c in COVERAGES),
                     M.threshold_for_accuracy(score, correct, target_accuracy) if target_accuracy else None)


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
