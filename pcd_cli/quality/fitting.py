"""``pcd calibrate``'s whole job: gold rows (and their predictions, or a model to label them) ->
a fitted ``Calibration`` with its cross-validated before/after report. The CLI parses its options
into a ``pcd_cli.job.LabelJob`` and renders what ``calibrate_on_gold`` returns.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import InputError
from ..job import LabelJob, build_labeler


@dataclass
class CalibrateRun:
    """What ``calibrate_on_gold`` did.

    Attributes:
        calibration: the fitted ``Calibration`` (not written yet: ``calibration.save(path)``).
        report: its ``CalibrationReport`` (cross-validated before/after figures per field).
        notes: lines to say before the report (gold rows left out as few-shot examples).
        row_warnings: lines about gold rows not used (they could not be labelled).
        warnings: lines about the fit (a field the calibration made worse on held-out rows),
            to say after the report.
    """

    calibration: object
    report: object
    notes: list[str] = field(default_factory=list)
    row_warnings: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def calibrate_on_gold(gold: str | Path, schema, job: LabelJob, *, output: str | Path,
                      predictions: str | Path | None = None, folds: int = 5, seed: int = 0,
                      coverage: float | None = None, id_field: str = "id", csv_delimiter: str = ",") -> CalibrateRun:
    """Fit a per-field calibration (temperature and label biases; conformal label sets with
    ``coverage``) on ``gold`` rows, from ``predictions`` (a ``pcd label --all-probs`` output of
    them) or by labelling them with ``job``'s model first (its tuned folder's own calibration left
    out: the fit reads raw probabilities).

    Every check that needs no model runs first: ``output`` writable, ``--examples`` with
    ``--predictions``, the schema, the gold file, enough rows for ``coverage``, the text columns.

    Args:
        schema: a ``Schema`` or a schema file path.
        job: the labelling options of the run the calibration is for (model, scoring, template,
            examples, permutations, budget); its ``id_field`` is ``id_field``.
        folds, seed: the cross-validation of the before/after figures
            (``pcd_cli.quality.calibration.fit_calibration``).

    Returns:
        ``CalibrateRun``.

    Raises:
        InputError: a bad option or file (names it). SchemaError, ModelError, CalibrationError:
        as ``build_labeler`` and ``fit_calibration``.
    """
    from ..io.readers import check_frame_columns
    from ..schema.load import load_schema
    from ..schema.model import Schema
    from . import fit_calibration, read_gold, read_predictions
    from .calibration import check_coverage_rows, check_output_path, worse_calibration_warnings
    from .data import drop_example_rows

    if predictions is not None and job.examples is not None:
        raise InputError("--examples and --predictions: the examples act when the gold rows are labelled; "
                         "label them with --examples first (pcd label --all-probs) and pass that output")
    check_output_path(output)
    parsed = schema if isinstance(schema, Schema) else load_schema(schema)
    gold_frame = read_gold(gold, id_field=id_field, csv_delimiter=csv_delimiter)
    check_coverage_rows(gold_frame, parsed, coverage)  # before the model loads
    notes: list[str] = []
    row_warnings: list[str] = []
    if predictions is not None:
        frame, metadata = read_predictions(predictions)
    else:
        job = replace(job, id_field=id_field, tuned_calibration=False, calibration=None)
        spec = job.input_spec(csv_delimiter=csv_delimiter)
        check_frame_columns(gold, list(gold_frame.columns), spec)  # before the model loads
        labeler = build_labeler(parsed, job)
        gold_frame, dropped = drop_example_rows(gold_frame, labeler.examples, spec)
        if dropped:
            notes.append(f"{dropped} gold row{'s are' if dropped != 1 else ' is'} a few-shot example in the prompt; "
                         "left out of the fit")
        frame = labeler.label_frame(gold_frame, text_field=job.text_field, template=job.template, id_field=id_field,
                                    all_probs=True)
        metadata = frame.attrs.get("metadata") or labeler.metadata()
        failed = frame.attrs.get("errors") or []
        if failed:
            row_warnings.append(f"{len(failed)} gold rows could not be labelled (e.g. {failed[0]['error']}); "
                                "they are not used")
    calibration, report = fit_calibration(frame, gold_frame, parsed, metadata, id_field=id_field, folds=folds,
                                          seed=seed, coverage=coverage)
    return CalibrateRun(calibration, report, notes, row_warnings,
                        worse_calibration_warnings(calibration, "this calibration", bound=False))
