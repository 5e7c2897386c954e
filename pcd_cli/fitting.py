"""Gold rows -> a fitted model: ``pcd calibrate``'s whole job (``calibrate_on_gold``: a
``Calibration`` with its cross-validated before/after report; ``calibrate_unlabelled``: a prior
correction from unlabelled rows) and ``pcd tune``'s
(``tune_on_gold``: a LoRA adapter trained through the decoder's own forest, its calibration and
card, written). The CLI, and ``pcd serve``'s Label Studio loop (``pcd_cli.retrain``), parse their
options into a ``pcd_cli.job.LabelJob`` and call these.

A layer above the stages (beside ``job.py``): it builds labelers (``pcd_cli.api``) and trains
(``pcd_cli.tune``), so ``quality/`` below it never imports either (``tests/test_layout.py``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path

from .errors import InputError
from .api import build_labeler
from .job import LabelJob
from .quality.calibration import DEFAULT_UNLABELLED_SAMPLE

log = logging.getLogger("pcd")


@dataclass
class CalibrateRun:
    """What ``calibrate_on_gold`` did.

    Attributes:
        calibration: the fitted ``Calibration`` (not written yet: ``calibration.save(path)``).
        report: its ``CalibrationReport`` (cross-validated before/after figures per field).
        notes: lines to say before the report (gold rows left out as few-shot examples).
        row_warnings: lines about gold rows not used (they could not be labelled; their gold value
            is not a label, unless ``on_gold_warnings`` said those already).
        warnings: lines about the fit (a field the calibration made worse on held-out rows),
            to say after the report.
        decoded: gold rows the model labelled in this run (``None`` with ``--predictions``); the
            others came from ``store``.
    """

    calibration: object
    report: object
    notes: list[str] = field(default_factory=list)
    row_warnings: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    decoded: int | None = None

def calibrate_on_gold(gold: str | Path, schema, job: LabelJob, *, output: str | Path,
                      predictions: str | Path | None = None, folds: int = 5, seed: int = 0,
                      coverage: float | None = None, id_field: str = "id", csv_delimiter: str = ",",
                      objective=None, force_rule: bool = False, readout: str = "logits",
                      store: str | Path | None = None, on_gold_warnings=None) -> CalibrateRun:
    """Fit a per-field calibration (temperature and label biases; conformal label sets with
    ``coverage``) on ``gold`` rows, from ``predictions`` (a ``pcd label --all-probs`` output of
    them) or by labelling them with ``job``'s model first (its tuned folder's own calibration left
    out: the fit reads raw probabilities).

    Every check that needs no model runs first: ``output`` writable, ``--examples`` with
    ``--predictions``, the schema, the gold file and its values (``check_gold_labels``: a field
    none of whose gold values is a label is refused; rows whose value is not are named in
    ``row_warnings``), enough rows for ``coverage``, the text columns.

    Args:
        schema: a ``Schema`` or a schema file path.
        job: the labelling options of the run the calibration is for (model, scoring, template,
            examples, permutations, budget); its ``id_field`` is ``id_field``.
        folds, seed: the cross-validation of the before/after figures
            (``pcd_cli.quality.calibration.fit_calibration``).
        objective: ``--objective`` (text or ``pcd_cli.quality.decision.Objective``; ``None``:
            likelihood): the decision rule fitted per field (``fit_calibration``); refused
            before the model loads where the gold cannot support it
            (``calibration.check_objective_gold``).
        force_rule: ``--force-rule``: write each rule even where it shows no held-out gain over
            argmax (``fit_calibration``).
        readout: ``logits`` (the temperature and biases on the decoder's probabilities) or
            ``linear``: also a linear readout of the hidden state at each field's decision point
            (``pcd_cli.quality.readout``), read while the gold rows are labelled (the candidate
            layers only); refused with ``predictions`` (the features come from running the
            model), ``coverage`` and ``--permutations``.
        store: a file of gold rows labelled by earlier fits (``pcd_cli.quality.labelled_rows``;
            ``pcd serve --label-studio`` keeps one per schema): rows held there for this job (same
            model input key and job fingerprint) are read from it rather than decoded, and it is
            rewritten with this fit's rows. ``None``: every row is decoded. Not read with
            ``predictions``.
        on_gold_warnings: called with ``check_gold_labels``' lines (gold values that are not
            labels, by row) before the model loads, so a front-end can say them before the
            decoding; ``None``: they are in the run's ``row_warnings``.

    Returns:
        ``CalibrateRun``.

    Raises:
        InputError: a bad option or file (names it). SchemaError, ModelError, CalibrationError:
        as ``build_labeler`` and ``fit_calibration``.
    """
    from .io.readers import check_frame_columns
    from .schema.load import load_schema
    from .schema.model import Schema
    from .quality import fit_calibration, read_gold, read_predictions
    from .quality.calibration import (check_coverage_rows, check_gold_labels, check_objective_gold, check_output_path,
                                      check_readout_gold, rule_fit_warnings, worse_calibration_warnings)
    from .quality.decision import check_objective_labels, parse_objective
    from .quality.data import drop_example_rows

    if readout not in ("logits", "linear"):
        raise InputError(f"--readout {readout!r}: expected logits or linear")
    if readout == "linear":
        from .quality.readout import require_sklearn

        why = ("--predictions" if predictions is not None else "--coverage" if coverage is not None else
               f"--permutations {job.permutations}" if job.permutations > 1 else None)
        if why is not None:
            raise InputError(f"--readout linear and {why}: " + {
                "--predictions": "the readout's features come from running the model over the gold rows, which "
                                 "pcd calibrate does without --predictions; drop --predictions",
                "--coverage": "conformal label sets are fitted on the logits calibration only; drop one of them",
            }.get(why, "the readout reads the hidden state of one prompt, and K orderings are K prompts; drop "
                       "--permutations"))
        require_sklearn()
    if predictions is not None and job.examples is not None:
        raise InputError("--examples and --predictions: the examples act when the gold rows are labelled; "
                         "label them with --examples first (pcd label --all-probs) and pass that output")
    check_output_path(output)
    if isinstance(objective, str):  # a bad objective or cost file: refused before the model loads
        objective = parse_objective(objective)
    parsed = schema if isinstance(schema, Schema) else load_schema(schema)
    if objective is not None:
        check_objective_labels(objective, parsed.fields)  # a label no field has: before the model loads
    gold_frame = read_gold(gold, id_field=id_field, csv_delimiter=csv_delimiter)
    row_warnings: list[str] = check_gold_labels(gold_frame, parsed, id_field=id_field)  # before the model loads
    if on_gold_warnings is not None and row_warnings:
        on_gold_warnings(row_warnings)
        row_warnings = []
    check_coverage_rows(gold_frame, parsed, coverage)  # before the model loads
    check_objective_gold(gold_frame, parsed, objective, id_field=id_field)  # before the model loads
    if readout == "linear":
        check_readout_gold(gold_frame, parsed, id_field=id_field)  # before the model loads
    notes: list[str] = []
    decoded = None
    if predictions is not None:
        frame, metadata = read_predictions(predictions)
    else:
        job = replace(job, id_field=id_field, tuned_calibration=False, calibration=None)
        spec = job.input_spec(csv_delimiter=csv_delimiter)
        check_frame_columns(gold, list(gold_frame.columns), spec)  # before the model loads
        labeler = build_labeler(parsed, job)
        if readout == "linear":
            from .quality.readout import feature_layers

            n_layers = getattr(labeler.backend, "n_layers", None)
            if n_layers is None or not hasattr(labeler.backend, "forward_features"):
                raise InputError(f"--readout linear: the {getattr(labeler.backend, 'kind', '')} backend cannot read "
                                 "the model's hidden state")
            labeler.decoder.feature_layers = feature_layers(n_layers)
        gold_frame, dropped = drop_example_rows(gold_frame, labeler.examples, spec)
        if dropped:
            notes.append(f"{dropped} gold row{'s are' if dropped != 1 else ' is'} a few-shot example in the prompt; "
                         "left out of the fit")
        frame, failed, read, decoded = _label_gold(labeler, gold_frame, spec, job, id_field, store)
        metadata = labeler.metadata()
        if failed:
            row_warnings.append(f"{len(failed)} gold rows could not be labelled (e.g. {failed[0]['error']}); "
                                "they are not used")
    features = None
    if readout == "linear":
        from .quality.data import id_keys

        column = id_field if id_field in frame.columns else "row"
        keys, _ = id_keys(frame[column], "predictions", column)
        features = dict(zip(keys, read))
    calibration, report = fit_calibration(frame, gold_frame, parsed, metadata, id_field=id_field, folds=folds,
                                          seed=seed, coverage=coverage, objective=objective, force_rule=force_rule,
                                          features=features)
    return CalibrateRun(calibration, report, notes, row_warnings,
                        worse_calibration_warnings(calibration, "this calibration", bound=False) +
                        rule_fit_warnings(calibration), decoded=decoded)


def _label_gold(labeler, gold_frame, spec, job: LabelJob, id_field: str, store: str | Path | None):
    """Label ``gold_frame``'s rows with ``labeler`` (raw probabilities, ``all_probs``; the readout's
    features when ``labeler.decoder.feature_layers`` is set), the rows ``store`` already holds for
    this job taken from it instead (``pcd_cli.quality.labelled_rows``: by model input key and job
    fingerprint), and ``store`` rewritten with every labelled row.

    A stored row holds exactly the values its earlier decode wrote, so the frame equals the one
    decoding every row here, but for the packing bound (``max_tokens_per_pass`` moves values within
    1e-5: ``job_fingerprint.DECISION_NEUTRAL``) between rows decoded in different passes.

    Returns:
        ``(frame, failed, features, decoded)``: ``label_frame``'s columns for the rows labelled, in
        gold order, with ``__input_sha256``; the rows that could not be labelled (``{"row",
        "record", "error"}``, ``row`` the gold position); per frame row its features (``{}`` without
        a feature read); how many rows were decoded here (the rest came from the store).
    """
    import pyarrow as pa

    from .io.readers import row_to_record
    from .quality.data import input_keys
    from .quality.labelled_rows import LabelledRows, fingerprint
    from .results import INPUT_KEY_COLUMN

    keys = input_keys(gold_frame, spec)
    arrow_schema = labeler.output_schema(id_field, pa.string(), all_probs=True)  # label_frame's columns
    value_schema = pa.schema(list(arrow_schema)[1:])
    reading = bool(labeler.decoder.feature_layers)
    key = fingerprint(labeler.job_parts(), labeler.decoder.feature_layers, arrow_schema.names)
    stored = LabelledRows(store).read(key) if store is not None else None
    known = stored.keys if stored is not None else {}
    todo = [i for i, k in enumerate(keys) if k is None or k not in known]
    new = labeler.label_frame(gold_frame.iloc[todo].reset_index(drop=True), text_field=job.text_field,
                              template=job.template, id_field=id_field, all_probs=True)
    failed = [{**e, "row": todo[e["row"]]} for e in new.attrs.get("errors") or []]
    lost = {e["row"] for e in failed}
    new_features = new.attrs.get("features") or [{}] * len(new)
    fresh = new.drop(columns=[id_field])
    fresh.attrs = {}  # the features and metadata stay out of the Arrow schema's pandas metadata
    tables = [pa.Table.from_pandas(fresh, schema=value_schema, preserve_index=False)]
    if stored is not None:
        tables.append(stored.table.select(value_schema.names).cast(value_schema))
    records = gold_frame.astype(object).where(gold_frame.notna(), None).to_dict("records")
    at_new = {i: j for j, i in enumerate(i for i in todo if i not in lost)}
    rows, take, read = [], [], []
    for i, k in enumerate(keys):
        if i in lost:
            continue
        rows.append(i)
        if i in at_new:
            take.append(at_new[i])
            read.append(new_features[at_new[i]] if reading else {})
        else:
            take.append(len(new) + known[k])
            read.append((stored.features[known[k]] or {}) if reading else {})
    values = pa.concat_tables(tables).take(pa.array(take, pa.int64()))
    ids = pa.array([row_to_record(records[i], i, None, spec).id for i in rows], arrow_schema.field(0).type)
    frame = values.add_column(0, arrow_schema.field(0), ids).to_pandas()
    frame[INPUT_KEY_COLUMN] = [keys[i] for i in rows]
    if store is not None:
        first = {}  # one row per input key (copies of a text share their values)
        for position, i in enumerate(rows):
            first.setdefault(keys[i], position)
        kept = list(first.values())
        try:
            LabelledRows(store).write(key, list(first), values.take(pa.array(kept, pa.int64())),
                                      [read[p] for p in kept] if reading else None)
        except (OSError, ValueError) as exc:  # a cache: the fit goes on, the next one labels the rows again
            log.warning("labelled gold rows not kept in %s (%s: %s)", store, type(exc).__name__, exc)
    return frame, failed, read, len(todo)


@dataclass
class UnlabelledRun:
    """What ``calibrate_unlabelled`` did.

    Attributes:
        calibration: the fitted ``Calibration`` (not written yet), one prior correction per decision.
        rows: rows read from the input; sampled: rows the prior was estimated on.
        changed: per decision, how many sampled rows' argmax label the correction changes.
        notes: lines to say (rows that could not be labelled, the sample drawn).
    """

    calibration: object
    rows: int
    sampled: int
    changed: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def calibrate_unlabelled(rows: str | Path, schema, job: LabelJob, *, output: str | Path,
                         predictions: str | Path | None = None, sample: int = DEFAULT_UNLABELLED_SAMPLE,
                         seed: int = 0, id_field: str = "id", csv_delimiter: str = ",") -> UnlabelledRun:
    """``pcd calibrate --unlabelled``: a per-decision prior correction estimated, without gold
    labels, on a seeded random sample of ``sample`` rows of ``rows`` (all of them when fewer):
    the sample is labelled with ``job``'s model (or read from ``predictions``, a ``pcd label
    --all-probs`` output), and each field's biases are ``-log`` of its mean predicted label
    distribution (``quality.calibration.fit_unlabelled``). The result is a calibration file like
    any other: a record's label then depends on its own input and the job alone.

    Raises:
        InputError: a bad option or file (names it). SchemaError, ModelError, CalibrationError:
            as ``build_labeler`` and ``fit_unlabelled``.
    """
    import numpy as np

    from .io.readers import check_frame_columns
    from .quality import read_gold, read_predictions
    from .quality.calibration import check_output_path, fit_unlabelled, unlabelled_probabilities
    from .schema.load import load_schema
    from .schema.model import Schema

    if sample < 1:
        raise InputError(f"--sample must be at least 1, got {sample}")
    if predictions is not None and job.examples is not None:
        raise InputError("--examples and --predictions: the examples act when the rows are labelled; label them "
                         "with --examples first (pcd label --all-probs) and pass that output")
    check_output_path(output)
    parsed = schema if isinstance(schema, Schema) else load_schema(schema)
    notes: list[str] = []
    if predictions is not None:
        frame, metadata = read_predictions(predictions)
        total = len(frame)
        if total > sample:
            frame = frame.iloc[np.sort(np.random.default_rng(seed).choice(total, sample, replace=False))]
    else:
        frame_in = read_gold(rows, id_field=id_field, csv_delimiter=csv_delimiter)
        total = len(frame_in)
        if total == 0:
            raise InputError(f"{str(rows)!r}: no rows to estimate the prior on")
        if total > sample:
            frame_in = frame_in.iloc[np.sort(np.random.default_rng(seed).choice(total, sample, replace=False))]
        job = replace(job, id_field=id_field, tuned_calibration=False, calibration=None, prior_correction=False)
        spec = job.input_spec(csv_delimiter=csv_delimiter)
        check_frame_columns(rows, list(frame_in.columns), spec)  # before the model loads
        labeler = build_labeler(parsed, job)
        frame = labeler.label_frame(frame_in, text_field=job.text_field, template=job.template, id_field=id_field,
                                    all_probs=True)
        metadata = frame.attrs.get("metadata") or labeler.metadata()
        failed = frame.attrs.get("errors") or []
        if failed:
            notes.append(f"{len(failed)} rows could not be labelled (e.g. {failed[0]['error']}); they are not used")
    if total > sample:
        notes.append(f"prior estimated on {sample} of {total} rows (seeded sample, --seed {seed}; --sample sets "
                     "how many)")
    calibration = fit_unlabelled(frame, parsed, metadata)
    changed = {name: int((fc.apply(probs).argmax(axis=1) != probs.argmax(axis=1)).sum())
               for (name, (_, probs)), fc in zip(unlabelled_probabilities(frame, parsed).items(),
                                                  calibration.fields.values())}
    return UnlabelledRun(calibration, total, min(total, sample), changed, notes)


@dataclass
class TuneRun:
    """What ``tune_on_gold`` did.

    Attributes:
        result: the training's ``pcd_cli.tune.TuneResult`` (epochs, best epoch, warnings, interrupted).
        calibration: the calibration fitted on the kept epoch's holdout (``None``: none) and
            ``calibration_notes``, what was decided about it.
        notes: lines to say before training (gold rows left out as few-shot examples).
        row_warnings: lines about gold rows not used.
        use: the ``pcd label`` command line that reads the written folder.
    """

    result: object
    calibration: object | None
    calibration_notes: list[str]
    notes: list[str]
    row_warnings: list[str]
    use: str


def tune_on_gold(gold: str | Path, schema, job: LabelJob, output: str | Path, config, *,
                 id_field: str = "id", csv_delimiter: str = ",", adapter_only: bool = False,
                 on_step=None, on_epoch=None, on_fold=None, on_notes=None) -> TuneRun:
    """``pcd tune``'s whole job: gold rows -> a LoRA adapter trained through the decoder's own
    forest (``tune``), the kept epoch's calibration (``fit_tune_calibration``), the card
    (``make_card``), all written to ``output`` (a merged model folder, or the adapter alone).

    Every check that needs no model runs first: peft installed, ``--cross-fit 1``, ``output``
    free of others' files, the schema, the gold file and its text columns.

    Args:
        schema: a ``Schema`` or a schema file path.
        job: the ``pcd_cli.job.LabelJob`` of the runs that will read the model (model, device,
            dtype, scoring, template, examples, permutations, budget); it is built on the torch
            backend, without any calibration.
        config: the training options (``pcd_cli.tune.TuneConfig``); ``config.epochs`` 0 or ``None`` means ``default_epochs``
            of the usable gold rows.
        on_step, on_epoch, on_fold: progress callbacks (``tune``); ``on_notes(notes, row_warnings,
            config)`` is called once the gold rows are read (``config.epochs`` resolved), before training.

    Returns:
        ``TuneRun``; the folder is written (with ``result.interrupted``, the best adapter so far).

    Raises:
        MissingExtra: peft is not installed. InputError: a bad option, gold file or ``output``
        folder; ``TrainingDiverged`` (nothing written). ModelError: the model cannot be loaded.
    """
    from .backends.torch_backend import model_content_key
    from .backends.torch_tune import require_peft
    from .backends.select import TRAINING_BACKEND
    from .backends.tune_folder import CALIBRATION_NAME, check_tune_output
    from .io.readers import check_frame_columns
    from .schema.load import load_schema
    from .schema.model import Schema
    from .tune import (calibration_card, default_epochs, fit_tune_calibration, gold_records, make_card,
                        tune)
    from .quality import read_gold
    from .quality.data import drop_example_rows

    require_peft()
    if config.cross_fit == 1:
        raise InputError("--cross-fit 1: one fold has nothing to hold out; give 0 (one --holdout) or K >= 2 folds")
    check_tune_output(output)  # a team's files in it: refused before the model loads
    parsed = schema if isinstance(schema, Schema) else load_schema(schema)
    if parsed.isolate_fields or job.isolate_fields:  # the trainer reads the shared-catalog prompt only
        raise InputError("pcd tune trains the shared-catalog prompt; isolate_fields is not trained yet: tune "
                         "without it (drop isolate_fields: true / --isolate-fields) and label the same way")
    from .quality.decision import check_objective_labels

    check_objective_labels(config.objective, parsed.fields)  # before the model loads
    job = replace(job, id_field=id_field, backend=TRAINING_BACKEND, calibration=None, tuned_calibration=False,
                  scoring=config.scoring, permutations=config.permutations,
                  max_tokens_per_pass=config.max_tokens_per_pass)
    spec = job.input_spec(csv_delimiter=csv_delimiter)
    gold_frame = read_gold(gold, id_field=id_field, csv_delimiter=csv_delimiter)
    check_frame_columns(gold, list(gold_frame.columns), spec)  # before the model loads
    from .quality.calibration import check_objective_gold

    # a label no gold row has: refused before training (the floor is the holdout's)
    check_objective_gold(gold_frame, parsed, config.objective, id_field=id_field, floor=False)
    labeler = build_labeler(parsed, job)
    gold_frame, dropped = drop_example_rows(gold_frame, labeler.examples, spec)
    notes = [f"{dropped} gold row{'s are' if dropped != 1 else ' is'} a few-shot example in the prompt; left out "
             "of training"] if dropped else []
    records, labels, skipped = gold_records(gold_frame, parsed, spec)
    row_warnings = [f"{len(skipped)} gold rows are not used (e.g. {skipped[0]})"] if skipped else []
    config = replace(config, epochs=config.epochs or default_epochs(len(records)))
    if on_notes is not None:
        on_notes(notes, row_warnings, config)
    result, trainer = tune(labeler.backend, parsed, records, labels, config, examples=labeler.compiled.examples,
                           on_step=on_step, on_epoch=on_epoch, on_fold=on_fold)
    # the pcd.model that pcd label records for the result: a folder's name, or the adapter's base
    label_model = labeler.backend.model_id if adapter_only else Path(output).expanduser().name
    calibration, calibration_notes = fit_tune_calibration(result, parsed, labeler.metadata(), model=label_model,
                                                          seed=config.seed, objective=config.objective,
                                                          force_rule=config.force_rule)
    card = make_card(base_model=labeler.backend.model_id, base_key=model_content_key(job.model),
                     metadata=labeler.metadata(), gold_path=gold, records=records, result=result, config=config,
                     adapter_only=adapter_only,
                     calibration=calibration_card(calibration, calibration_notes, result.holdout_rows,
                                                  result.cross_fit))
    try:
        trainer.save(output, adapter_only=adapter_only, card=card, base_name=labeler.backend.model_id,
                     files={CALIBRATION_NAME: calibration.to_json()} if calibration is not None else None)
    except OSError as exc:
        raise InputError(f"-o {str(output)!r}: cannot write ({exc.strerror or exc})") from None
    if calibration is not None and calibration.fitted_for:
        calibration = _fitted_for_written(calibration, output, base=job.model, adapter_only=adapter_only)
    schema_arg = "SCHEMA" if isinstance(schema, Schema) else str(schema)
    use = (f"pcd label INPUT -s {schema_arg} --adapter {output}" + (f" --model {job.model}" if job.model else "")
           if adapter_only else f"pcd label INPUT -s {schema_arg} --model {output}")
    return TuneRun(result, calibration, list(calibration_notes), notes, row_warnings, use)


def _fitted_for_written(calibration, output, *, base, adapter_only: bool):
    """``calibration`` (fitted while tuning, on the weights in memory) with the model parts a later
    ``pcd label`` of the written folder reads (``Calibration.fitted_for``): the base model's weights
    and the adapter folder's (``--adapter-only``), or the merged folder's weights; rewritten in the
    folder beside them, so that the file checks against them wherever it is applied.

    Raises:
        InputError: the folder's calibration file cannot be rewritten.
    """
    from .backends.torch_backend import model_content_key
    from .backends.tune_folder import CALIBRATION_NAME
    from .io.files import write_atomic

    folder = Path(output).expanduser()
    weights = ({"model": model_content_key(base), "adapter": model_content_key(str(folder))} if adapter_only
               else {"model": model_content_key(str(folder)), "adapter": "none"})
    calibration = replace(calibration, fitted_for={**calibration.fitted_for, **weights})
    try:
        write_atomic(folder / CALIBRATION_NAME, calibration.to_json())
    except OSError as exc:
        raise InputError(f"-o {str(output)!r}: cannot write ({exc.strerror or exc})") from None
    return calibration
