"""The Python API: load a model and a schema once, label any iterable of texts or records.

    >>> from pcd_cli import Labeler
    >>> labeler = Labeler("schemas/sms_spam.yaml")               # embedded default model
    >>> for result in labeler.label(["WIN A FREE PRIZE!!! Click now", "see you at 6?"]):
    ...     print(result.id, result.fields[0].value, result.fields[0].prob, result.fields[0].mass)

The CLI (``pcd label``) is a thin layer over this class.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import replace
from itertools import islice
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from .backends.select import takes_adapters
from .decoding.compile import CompiledSchema
from .decoding.decode import Decoder
from .decoding.examples import resolve_examples
from .io.output import base_metadata
from .io.readers import InputSpec, _row_to_record
from .io.values import RepeatedIds
from .job import LabelJob
from .job_fingerprint import MODEL_PARTS_KEY
from .job_warnings import (ADAPTER_MISMATCH, CALIBRATION_WORSE, DTYPE_MISMATCH, TUNE_MISMATCH,
                           TUNED_CALIBRATION_SKIPPED, WEAK_LABEL_SET, JobWarning)
from .results import FieldResult, Record, RecordFailure, RecordResult
from .schema.load import load_schema
from .schema.model import Example, Schema, field_alone, fields_subset


class RepeatedIdWarning(UserWarning):
    """Items given to ``Labeler.label`` repeated an id (each was labelled on its own)."""


#: Records handed to the decoder at a time (it packs them into passes by token budget).
CHUNK_RECORDS = 64


class Labeler:
    """A schema compiled for a model, with the prompt head's KV cached.

    Args:
        schema: a ``Schema``, a path to a schema file, or a Pydantic model class
            (``pcd_cli.schema.pydantic``).
        job: the labelling options, a ``pcd_cli.job.LabelJob`` (``None``: its defaults); its
            attributes say what each option does. Its ``examples`` gold file is drawn here
            (``LabelJob.with_examples``) unless already drawn.
        backend: an already loaded backend (then the job's ``model``, ``device``, ``dtype`` and
            ``backend`` are not loaded again; an adapter ``pcd_cli.api.load_model`` merged is not
            merged again), or which kind to load, as ``LabelJob.backend`` (``auto``: MLX on Apple
            silicon when mlx-lm is installed, else torch; ``torch``; ``mlx``); ``None``: the job's.
        pack_records: pack several records into one pass (default); ``False`` decodes one
            record per pass pair (for comparisons).
        **options: ``LabelJob`` fields, applied over ``job`` (``Labeler(schema, model=...,
            calibration="cal.json", permutations=4)``): ``model`` (``None``: the embedded
            SmolLM2-135M-Instruct), ``device``, ``dtype``, ``scoring`` (``marginal`` follows each
            path until the label is identified, ``exact`` to the end of the line),
            ``max_tokens_per_pass``, ``trace`` (per-field traces on ``RecordResult.traces``),
            ``truncate`` (``middle``, ``head``, ``tail`` or ``error``; see ``Decoder``),
            ``template`` (examples given as ``columns`` are rendered with it), ``adapter`` (a
            ``pcd tune --adapter-only`` folder merged into the weights once at load, torch
            backend), ``calibration`` (a ``pcd calibrate`` file or a loaded
            ``pcd_cli.quality.Calibration`` for this schema, model, prompt head and scoring:
            ``prob``/``probs`` become calibrated, the label their argmax, ``raw_probs`` keeps
            the decoder's, the mass unchanged; fitted with ``--coverage`` it also gives each
            field's conformal ``label_set``), ``abstain_unless_single`` (with such a calibration,
            a field whose label set is not a single label gets ``value = None``),
            ``abstain_below`` (no label below this probability, calibrated if calibrated; a
            field's own ``abstain_below`` wins), ``permutations`` (``K >= 2``: each field's
            probabilities combined over K label orderings listed after the record, one branch
            each, ``FieldResult.order_spread``; ``pcd_cli.decoding.permute``),
            ``prior_correction`` (divide by the probabilities of content-free records, measured
            once on this head; ``pcd_cli.decoding.prior``; not with ``calibration``),
            ``tuned_calibration`` (apply a ``pcd tune`` folder's ``pcd-calibration.json`` when
            ``calibration`` is ``None``; skipped with a ``tuned_calibration_skipped`` warning for
            another schema, head or scoring, and with ``prior_correction``), ``isolate_fields``
            (every field in its own branch seeing only its own key and values: its
            probabilities are those of its one-field schema; refused with ``permutations``,
            few-shot examples and ``depends_on``), ``examples`` with ``shots`` and ``seed`` (a
            gold file to draw few-shot examples from), and, as before the job existed,
            ``examples`` as the ``Example`` values themselves (``()``: none; ``None``: the
            schema's own ``examples:``), i.e. ``drawn_examples``, ``record_quoting`` (``json``: the
            record quoted as data, the default; ``none``: as it is; ``None``: the schema's) and
            ``steering_check`` (on by default: a field whose label moves once the sentences
            addressing the labeller are taken out gets the label without them and
            ``FieldResult.steered``; ``pcd_cli.steering``, docs/security.md).

    ``warnings`` lists ``pcd_cli.job.JobWarning`` values: what does not stop the run but a user
    should hear (each front-end shows them). ``job`` holds the options the labeler was built
    with (its examples drawn). Front-ends build their ``LabelJob`` once and pass it whole.

    A schema's rules between fields (``pcd_cli.schema.rules``) are applied to every record after
    calibration or prior correction and before abstaining: a field a rule moves gets
    ``changed_by_rules`` and the record its ``joint_prob``.

    Raises:
        SchemaError, ModelError, CompileError: see ``pcd_cli.errors``. A calibration made for
        another schema, model, prompt head or scoring mode raises ``CalibrationError`` (a
        ``SchemaError``) naming what differs, before any record is labelled. An option that is
        not a ``LabelJob`` field raises ``TypeError`` naming it; a bad value, ``InputError``
        (``LabelJob``).
    """

    def __init__(self, schema: Schema | str | Path, job: LabelJob | None = None, *, backend=None,
                 pack_records: bool = True, **options):
        if isinstance(schema, Schema):
            self.schema = schema
        elif isinstance(schema, type):  # a Pydantic model class
            from .schema.load import schema_from_model

            self.schema = schema_from_model(schema)
        else:
            self.schema = load_schema(schema)
        if isinstance(backend, str):  # which kind to load: the job's option
            options["backend"], backend = backend, None
        #: the options this labeler was built with (a ``pcd_cli.job.LabelJob``, its examples drawn)
        self.job = job = _with_options(job or LabelJob(), options).with_examples(self.schema)
        if job.record_quoting is not None and job.record_quoting != self.schema.record_quoting:
            self.schema = replace(self.schema, record_quoting=job.record_quoting)
        model, adapter, scoring = job.model, job.adapter, job.scoring
        abstain_below, abstain_unless_single = job.abstain_below, job.abstain_unless_single
        permutations, prior_correction = job.permutations, job.prior_correction
        examples = job.drawn_examples
        self.examples = tuple(self.schema.examples if examples is None else examples)
        shots = resolve_examples(self.examples, job.template)
        self.calibration = _load_calibration(job.calibration)
        if permutations > 1 and self.calibration is not None and self.calibration.readouts():  # before the model loads
            from .errors import CalibrationError

            raise CalibrationError(f"--permutations {permutations} and a calibration with a linear readout: the "
                                   "readout reads the hidden state of the one prompt it was fitted on; label without "
                                   "--permutations")
        #: where the calibration came from: ``"file"`` (``calibration``), the tuned folder's name
        #: (``tuned_calibration``), or ``None`` without one
        self.calibration_source: str | None = "file" if self.calibration is not None else None
        if prior_correction and self.calibration is not None:
            from .errors import CalibrationError

            raise CalibrationError("--prior-correction and --calibration: a calibration already fits per-label "
                                   "biases on gold rows; use one of them")
        self.abstain_unless_single = abstain_unless_single
        #: field name -> probability below which it is left without a label (the schema's own first)
        self.abstain_thresholds = abstain_thresholds(self.schema, abstain_below)
        if abstain_unless_single and self.calibration is not None:  # a file without sets: refused before loading
            output_columns(self.schema, self.calibration, abstain_below=abstain_below,
                           abstain_unless_single=True, permutations=permutations)
        #: every field decided in its own branch (``isolate_fields`` or the schema's)
        self.isolate_fields = bool(job.isolate_fields or self.schema.isolate_fields)
        if self.isolate_fields:  # refused before the model loads
            check_isolation(self.schema, permutations, shots)
        if permutations > 1:  # a K the schema cannot take is refused before the model loads
            from .decoding.permute import orderings_for

            orderings_for(self.schema, permutations)
        if adapter is not None and backend is None and takes_adapters(job.backend):
            from .backends.torch_tune import check_adapter_folder

            check_adapter_folder(adapter, model)  # a model folder as --adapter: refused before the model loads
        if backend is None:
            from .backends import load_backend

            backend = load_backend(model, backend=job.backend, device=job.device, dtype=job.dtype)
        #: what a user should know about this run that does not stop it (``pcd_cli.job.JobWarning``
        #: values: the adapter's misfits, a tuned folder read for another prompt, a calibration that
        #: scored worse, weak label sets); each front-end shows them its own way
        self.warnings: list[JobWarning] = []
        if adapter is not None:
            merged = getattr(backend, "merged_adapter", None)
            if merged is not None and merged[0] == _folder_key(adapter):  # merged once at load (pcd serve)
                said = merged[1]
            else:
                backend, said = _with_adapter(backend, adapter, model)
            self.warnings += [JobWarning(ADAPTER_MISMATCH, w) for w in said]
        self.backend = backend
        #: the ``pcd-tune.json`` card of a tuned model folder or adapter (``None`` otherwise)
        self.tune_card, self._tune_source = _tune_card(adapter if adapter is not None else model)
        self.permutations = permutations
        orderings: list[CompiledSchema] = []
        if permutations > 1:
            from .decoding.permute import compile_orderings

            orderings = compile_orderings(self.schema, backend.tokenizer, permutations, scoring=scoring,
                                          logits_width=backend.logits_width, examples=shots)
        branches: list[CompiledSchema] = []
        if self.isolate_fields:
            branches = [CompiledSchema(field_alone(self.schema, i, self.schema.isolated_key), backend.tokenizer,
                                       scoring=scoring, logits_width=backend.logits_width, catalog_after=True)
                        for i in range(len(self.schema.declared))]
        self.compiled = orderings[0] if orderings else branches[0] if branches else CompiledSchema(
            self.schema, backend.tokenizer, scoring=scoring, logits_width=backend.logits_width, examples=shots)
        self.decoder = Decoder(backend, self.compiled, orderings=orderings, field_branches=branches,
                               max_tokens_per_pass=job.max_tokens_per_pass, trace=job.trace,
                               pack_records=pack_records, truncate=job.truncate)
        #: field name -> (k,) mean probabilities on content-free records (``prior_correction``)
        self.priors: dict[str, np.ndarray] | None = None
        if prior_correction:
            from .decoding.prior import content_free_priors

            passes = self.decoder.record_passes
            self.priors = content_free_priors(self.decoder, self.schema)
            self.decoder.record_passes = passes  # the content-free records are not the input's
        #: ``label_fields``: field names -> (their schema, their decoder), built on first use
        self._field_parts: dict[tuple[str, ...], tuple[Schema, Decoder]] = {}
        #: (schema name, field names) -> its steering check's vocabularies (``_steering_groups``), built on first use
        self._vocabularies: dict = {}
        #: the schema's rules between fields, ready to apply (``None`` without rules)
        self.rules = None
        if self.schema.rules:
            from .schema.rules import RuleSolver

            self.rules = RuleSolver(self.schema)
        # everything metadata() reads exists from here on
        if self.calibration is not None:
            self.calibration.check(self.metadata())
            self.warnings += [JobWarning(DTYPE_MISMATCH, w) for w in self.calibration.dtype_warnings(self.metadata())]
        if self.tune_card is not None:  # what differs between the tuned model's card and this run
            from .backends.tune_folder import card_mismatches

            self.warnings += [JobWarning(TUNE_MISMATCH, f"{self._tune_source} was tuned for another {m} (train "
                                         "what you will read: pcd tune with the same schema, --examples, "
                                         "--template and --scoring)")
                              for m in card_mismatches(self.tune_card, self.metadata())]
        if self.calibration is None and job.tuned_calibration and not prior_correction:
            self._apply_tuned_calibration(adapter if adapter is not None else model)
        self._install_readouts()
        if abstain_unless_single:  # with the calibration that applies, the tuned folder's included
            output_columns(self.schema, self.calibration, abstain_below=abstain_below, abstain_unless_single=True,
                           permutations=permutations)
        self.warnings += self._calibration_warnings()

    def _install_readouts(self) -> None:
        """Hand the calibration's linear readouts (``pcd calibrate --readout linear``) to the
        decoder, which applies them in the wave (``Decoder.readouts``): the label a readout
        decides is the one later waves see.

        Raises:
            CalibrationError: readouts with ``--permutations`` (a readout reads one prompt's hidden
                state; K orderings are K prompts), on a backend without a feature read, or reading
                a layer this model lacks.
        """
        if self.calibration is None or not any(fc.readout is not None for fc in self.calibration.fields.values()):
            return
        from .errors import CalibrationError
        from .quality.readout import FieldReadout

        if self.permutations > 1:
            raise CalibrationError(f"--permutations {self.permutations} and a calibration with a linear readout: the "
                                   "readout reads the hidden state of the one prompt it was fitted on; label without "
                                   "--permutations")
        n_layers = getattr(self.backend, "n_layers", None)
        if n_layers is None or not hasattr(self.backend, "forward_features"):
            raise CalibrationError(f"the {getattr(self.backend, 'kind', '')} backend cannot read the model's hidden "
                                   "state, which the calibration's linear readout needs")
        readouts = {}
        for name, fc in self.calibration.fields.items():
            if fc.readout is None:
                continue
            deep = [layer for layer in fc.readout.read_layers if abs(layer) > n_layers]
            if deep:
                from .quality.readout import regression_name

                raise CalibrationError(f"field {name!r}: the calibration's readout reads {regression_name(deep[:1])} "
                                       f"('layers' {deep[0]}), and this model has {n_layers} layers: the file was "
                                       "fitted on another model or edited; refit it with pcd calibrate --readout linear")
            readouts[name] = FieldReadout(fc.readout, fc.rule)
        self.decoder.readouts = readouts
        for decoder in (d for _, d in self._field_parts.values()):
            decoder.readouts = readouts

    def _calibration_warnings(self) -> list[JobWarning]:
        """Warnings about the calibration that applies: a field it made worse on held-out gold
        rows, a temperature at its bound, a conformal threshold fitted on too few rows."""
        if self.calibration is None:
            return []
        from .quality.calibration import worse_calibration_warnings
        from .quality.conformal import weak_set_warnings

        source = "--calibration" if self.calibration_source == "file" else \
            f"the calibration of {self.calibration_source} (--no-calibration leaves it out)"
        return [JobWarning(CALIBRATION_WORSE, w) for w in worse_calibration_warnings(self.calibration, source)] + \
            [JobWarning(WEAK_LABEL_SET, w) for w in weak_set_warnings(self.calibration.fields)]

    def _apply_tuned_calibration(self, source) -> None:
        """Load the ``pcd-calibration.json`` a ``pcd tune`` folder holds, if any, and use it when
        it was fitted for this run's schema, prompt head and scoring (its model is the folder,
        whatever the folder is called now); else say why in ``warnings``."""
        path = tuned_calibration_path(source)
        if path is None:
            return
        from .errors import CalibrationError

        try:
            calibration = _load_calibration(path)
            # it travels with the tuned weights it was fitted on (in memory, while tuning): their key is the run's
            ours = {k: v for k, v in self.model_parts().items() if k in ("model", "adapter")}
            calibration = replace(calibration, model=self.backend.model_id,
                                  fitted_for={**calibration.fitted_for, **ours} if calibration.fitted_for else {})
            calibration.check(self.metadata())
        except CalibrationError as exc:
            self.warnings.append(JobWarning(TUNED_CALIBRATION_SKIPPED,
                                            f"{self._tune_source}: its calibration is not applied ({exc})"))
            return
        self.calibration, self.calibration_source = calibration, self._tune_source
        self.warnings += [JobWarning(DTYPE_MISMATCH, w) for w in calibration.dtype_warnings(self.metadata())]

    @property
    def set_fields(self) -> tuple[str, ...]:
        """Fields that get a conformal label set (``<f>__set``): those whose calibration has one."""
        return label_set_fields(self.schema, self.calibration)

    @property
    def forward_passes(self) -> int:
        """Forward passes spent on records so far (the one-off head prefill excluded), those of
        ``label_fields`` included."""
        return self.decoder.record_passes + sum(d.record_passes for _, d in self._field_parts.values())

    def metadata(self) -> dict[str, str]:
        """Key-value metadata recorded in outputs: versions, model, hashes, scoring, UTC date.

        ``pcd.schema_json`` is the compact JSON ``{field: [labels...]}`` (``pcd eval`` reads the
        labels from it when no schema is given).
        """
        return base_metadata(self.backend.model_id, self.schema) | {
            "pcd.prompt_head_sha256": self.compiled.prompt.head_sha256,
            MODEL_PARTS_KEY: json.dumps(self.model_parts(), ensure_ascii=False),
            "pcd.scoring": self.compiled.scoring,
            "pcd.layout": self.compiled.layout.name,
            "pcd.chat_template": str(self.compiled.prompt.chat_template).lower(),
            "pcd.truncate": self.decoder.truncate,
            "pcd.examples": str(len(self.examples)),
            "pcd.head_tokens": str(len(self.compiled.prompt.head_ids)),
            "pcd.dtype": self.backend.dtype_name,
        } | ({"pcd.calibration_sha256": self.calibration.sha256, "pcd.objective": self.calibration.objective}
             if self.calibration is not None else {}) \
          | ({"pcd.decision_rules": json.dumps(self.calibration.rules(), ensure_ascii=False)}
             if self.calibration is not None and self.calibration.rules() else {}) \
          | ({"pcd.readout": json.dumps(self.calibration.readouts(), ensure_ascii=False)}
             if self.calibration is not None and self.calibration.readouts() else {}) \
          | ({"pcd.label_sets": json.dumps({name: self.calibration.fields[name].conformal.coverage
                                            for name in self.set_fields}),
              "pcd.abstain_unless_single": str(self.abstain_unless_single).lower()} if self.set_fields else {}) \
          | ({"pcd.prior_correction": json.dumps({name: [round(float(p), 6) for p in prior]
                                                   for name, prior in self.priors.items()})}
             if self.priors is not None else {}) \
          | ({"pcd.abstain_below": json.dumps(self.abstain_thresholds),
              "pcd.abstain_fields": json.dumps(list(self.abstain_fields))} if self.abstain_fields else {}) \
          | ({"pcd.tuned": self._tune_source, "pcd.tune_card_sha256": self._tune_card_sha}
             if self.tune_card is not None else {}) \
          | self._permutations_metadata() \
          | ({"pcd.isolate_fields": "true"} if self.isolate_fields else {}) \
          | {"pcd.record_quoting": self.schema.record_quoting,
             "pcd.steering_check": str(self.job.steering_check).lower()}

    def model_parts(self) -> dict[str, str]:
        """What this labeler's model reads and how, by content (``pcd_cli.job_fingerprint.model_parts``):
        weights, tokenizer and chat template, adapter, backend, dtype, schema, the rendered prompt,
        scoring. A calibration file is checked against them (``Calibration.check``)."""
        from .job_fingerprint import model_parts

        return model_parts(self)

    def dtype_note(self, *, auto: bool) -> str | None:
        """The line a finished run says once about its dtype (``pcd_cli.backends.dtype_speed``):
        with the dtype left to ``auto`` (``auto``), the bfloat16 note (this CPU runs float32 where
        ``pcd bench`` measured bfloat16 faster for this model), else the note on a half precision
        that is a poor choice for the device; ``None`` when there is nothing to say."""
        from .backends.dtype_speed import bfloat16_note, dtype_note

        return bfloat16_note(self.backend) if auto else dtype_note(self.backend)

    def job_parts(self) -> dict[str, str]:
        """This job's fingerprint (``pcd_cli.job_fingerprint.job_parts``): every part that changes
        a row's values; ``pcd label --reuse`` copies a row only from an output whose parts equal these."""
        from .job_fingerprint import job_parts

        return job_parts(self)

    def per_field_names(self) -> tuple[str, ...]:
        """The declared fields when each is decided alone (``pcd_cli.job_fingerprint.per_field_names``):
        an earlier output may then lend fields one by one; ``()`` otherwise."""
        from .job_fingerprint import per_field_names

        return per_field_names(self)

    def output_schema(self, id_column: str, id_type, *, all_probs: bool):
        """The Arrow schema of this labeler's output (``pcd_cli.io.output.output_schema`` with its
        calibration, label sets, abstention and ``--permutations`` columns)."""
        from .io.output import output_schema

        return output_schema(self.schema, id_column, id_type, all_probs=all_probs, **self.columns())

    def columns(self) -> dict:
        """Which optional columns this labeler writes (``output_columns``)."""
        return {"calibrated": self.calibration is not None, "sets": self.set_fields,
                "abstain": self.abstain_fields, "spread": self.permutations > 1, "steered": self.job.steering_check}

    def _permutations_metadata(self) -> dict[str, str]:
        """``pcd.permutations``: K and, per permuted field, its label lists in each ordering."""
        if self.permutations < 2:
            return {}
        orders = {f.name: [[f.labels[i] for i in c.label_orders[f.name]] for c in self.decoder.orderings]
                  for f in self.schema.declared if f.name in self.compiled.label_orders}
        return {"pcd.permutations": json.dumps({"k": self.permutations, "orders": orders}, ensure_ascii=False)}

    @property
    def _tune_card_sha(self) -> str:
        import hashlib

        return hashlib.sha256(json.dumps(self.tune_card, sort_keys=True).encode()).hexdigest()

    def label(self, items: Iterable[str | dict | Record | RecordFailure]) -> Iterator[RecordResult | RecordFailure]:
        """Label ``items`` lazily, in order; one result (or failure) per item.

        Items may be strings (ids are their positions), ``{"id": ..., "text": ...}`` dicts,
        ``Record`` values, or ``RecordFailure`` values (passed through, so that a reader's
        failures stay in order). Texts and ids follow the file readers' rule
        (``pcd_cli.io.values``): numbers and booleans in their JSON spelling (``7``, ``true``), a
        list or object fails its item with a message naming it. Items that repeat an id are
        labelled on their own; once all are done, a ``RepeatedIdWarning`` counts them.
        """
        if isinstance(items, (str, bytes)):
            raise TypeError("label() takes an iterable of texts or records, not a single string; "
                            "wrap it in a list: label([text])")
        iterator = iter(_as_record(i, item) for i, item in enumerate(items))
        repeated = RepeatedIds()
        while True:
            chunk = list(islice(iterator, CHUNK_RECORDS))
            if not chunk:
                break
            for item in chunk:
                repeated.add(item.id)
            yield from self.label_batch(chunk)
        if repeated.count:
            warnings.warn(repeated.message(), RepeatedIdWarning, stacklevel=2)

    def label_batch(self, batch: list[Record | RecordFailure]) -> list[RecordResult | RecordFailure]:
        """Label one batch eagerly; failures in the batch are passed through in place."""
        return self._finish(batch, self.decoder, self.schema)

    def label_fields(self, batch: list[Record | RecordFailure], names: Sequence[str]
                     ) -> list[RecordResult | RecordFailure]:
        """Label one batch on the declared fields ``names`` only (``isolate_fields``): each
        result holds those fields, in schema order (``pcd_cli.schema.model.fields_subset``), as
        ``label_batch`` gives them (prior correction, calibration, abstention), within the
        packing bound; the other fields' branches are not fed (``Decoder.field_subset``). What
        ``pcd label --reuse`` decodes on a row whose other fields it copies.

        Raises:
            ValueError: the fields are not isolated, or the schema has rules between fields (a
                field's label may then depend on the others).
            KeyError: a name that is not a declared field.
        """
        if not self.isolate_fields or self.rules is not None:
            raise ValueError("label_fields: fields are decided alone only with isolate_fields and no rules between "
                             "fields")
        wanted = tuple(f.name for f in self.schema.declared if f.name in set(names))
        if len(wanted) != len(set(names)):
            fields_subset(self.schema, names)  # raises naming the unknown field
        if wanted not in self._field_parts:
            indices = [i for i, f in enumerate(self.schema.declared) if f.name in wanted]
            self._field_parts[wanted] = (fields_subset(self.schema, wanted), self.decoder.field_subset(indices))
        schema, decoder = self._field_parts[wanted]
        return self._finish(batch, decoder, schema)

    def _finish(self, batch: list[Record | RecordFailure], decoder, schema: Schema
                ) -> list[RecordResult | RecordFailure]:
        """Decode ``batch``'s records with ``decoder`` (of ``schema``'s fields) and apply the
        job's steps after decoding, in order, then the steering check (``steering_check``);
        failures passed through in place."""
        out = self._decoded(batch, decoder, schema)
        if self.job.steering_check:
            out = self._steering_checked(batch, out, decoder, schema)
        return out

    def _steering_checked(self, batch: list[Record | RecordFailure], out: list[RecordResult | RecordFailure],
                          decoder, schema: Schema) -> list[RecordResult | RecordFailure]:
        """The steering check (``pcd_cli.steering``): each record with sentences addressing the
        labeller is decoded again without them (same steps after decoding, rules included) and
        written as that decode: labels and probabilities without those sentences, so they move
        neither a label nor a probability; a field whose label differs from the first decode's is
        ``steered``. A record whose second decode fails keeps its first.

        With ``isolate_fields`` each declared field is checked with its own vocabulary (that of
        its one-field schema, ``field_alone``) and takes its fields from the decode of the record
        without the sentences that address it, so a field's label still does not depend on the
        other fields (one more decode per distinct erased text of a record)."""
        from .steering import erased

        groups = self._steering_groups(schema)
        todo = []  # (index in batch, the record without its addressing sentences, decision indices it decides)
        for k, (item, res) in enumerate(zip(batch, out)):
            if isinstance(item, Record) and isinstance(res, RecordResult):
                by_text: dict[str, list[int]] = {}
                for vocabulary, decisions in groups:
                    text = erased(item.text, vocabulary)
                    if text is not None:
                        by_text.setdefault(text, []).extend(decisions)
                todo.extend((k, Record(item.id, text, item.row, item.line), tuple(sorted(decisions)))
                            for text, decisions in by_text.items())
        if not todo:
            return out
        out = list(out)
        every = tuple(range(len(schema.fields)))
        for (k, _, decisions), again in zip(todo, self._decoded([r for _, r, _ in todo], decoder, schema)):
            if isinstance(again, RecordFailure):
                continue
            first = out[k]
            moved = {i: (first.fields[i].label != again.fields[i].label or first.fields[i].value != again.fields[i].value)
                     for i in decisions}
            if decisions == every:  # the whole record is its decode without the sentences
                fields = tuple(replace(b, steered=moved[i]) for i, b in enumerate(again.fields))
                out[k] = replace(again, fields=fields, truncated=first.truncated or again.truncated)
            else:  # isolated fields: only the fields these sentences address
                fields = tuple(replace(again.fields[i], steered=moved[i]) if i in moved else f
                               for i, f in enumerate(first.fields))
                out[k] = replace(first, fields=fields, truncated=first.truncated or again.truncated)
        return out

    def _steering_groups(self, schema: Schema) -> list:
        """``(Vocabulary, decision indices)`` pairs of the steering check for ``schema``: one, the
        whole schema's, or with ``isolate_fields`` one per declared field (its ``field_alone``
        schema's, over its decisions); built once per schema."""
        from .steering import Vocabulary

        key = (schema.name, tuple(f.name for f in schema.fields))
        groups = self._vocabularies.get(key)
        if groups is None:
            if self.isolate_fields:
                groups = [(Vocabulary.of(field_alone(schema, i, schema.isolated_key)), tuple(parts))
                          for i, parts in enumerate(schema.parts)]
            else:
                groups = [(Vocabulary.of(schema), tuple(range(len(schema.fields))))]
            self._vocabularies[key] = groups
        return groups

    def _decoded(self, batch: list[Record | RecordFailure], decoder, schema: Schema
                 ) -> list[RecordResult | RecordFailure]:
        """Decode ``batch``'s records and apply the job's steps after decoding (prior correction,
        calibration, rules, abstention), in order; failures passed through in place."""
        records = [r for r in batch if isinstance(r, Record)]
        decoded = iter(decoder.decode(records))
        out = [item if isinstance(item, RecordFailure) else next(decoded) for item in batch]
        if self.priors is not None:
            out = [r if isinstance(r, RecordFailure) else self._prior_corrected(r, schema) for r in out]
        if self.calibration is not None:
            out = [r if isinstance(r, RecordFailure) else self._calibrated(r, schema) for r in out]
        if self.rules is not None:  # on the final distributions, before abstaining
            out = [r if isinstance(r, RecordFailure) else self.rules.apply(r) for r in out]
        if self.abstain_unless_single and self.set_fields:  # on the sets as the rules left them
            out = [r if isinstance(r, RecordFailure) else self._abstain_unsure(r) for r in out]
        if self.abstain_thresholds:
            out = [r if isinstance(r, RecordFailure) else self._abstain_low(r, schema) for r in out]
        return out

    @property
    def abstain_fields(self) -> tuple[str, ...]:
        """Fields that may be left without a label, and get an ``<f>__abstained`` column: those
        with an ``abstain_below`` threshold, and with ``abstain_unless_single`` those with label sets."""
        return abstain_fields(self.schema, self.abstain_thresholds,
                              self.set_fields if self.abstain_unless_single else ())

    def _prior_corrected(self, result: RecordResult, schema: Schema) -> RecordResult:
        """Probabilities divided by the content-free priors and renormalised; the label their argmax."""
        from .decoding.prior import correct

        return replace(result, fields=tuple(_reweighted(f, res, correct(res.probs, self.priors[f.name]))
                                            for f, res in zip(schema.fields, result.fields)))

    def _abstain_low(self, result: RecordResult, schema: Schema) -> RecordResult:
        """Null the label of each field whose (calibrated) probability is below its threshold."""
        fields = tuple(replace(res, value=None, abstained=True)
                       if f.name in self.abstain_thresholds and res.prob < self.abstain_thresholds[f.name] else res
                       for f, res in zip(schema.fields, result.fields))
        return replace(result, fields=fields)

    def _abstain_unsure(self, result: RecordResult) -> RecordResult:
        """``abstain_unless_single``: null the label of each field whose conformal set (after the
        rules, which add a label they write outside it) holds more than one label."""
        fields = tuple(replace(res, value=None, abstained=True)
                       if res.label_set is not None and len(res.label_set) != 1 else res for res in result.fields)
        return replace(result, fields=fields)

    def _calibrated(self, result: RecordResult, schema: Schema) -> RecordResult:
        """Each calibrated field's probabilities through its calibration, and its conformal set.

        The decoder's probabilities are first rounded to float32, the precision of the
        ``<f>__probs`` column that ``pcd calibrate`` fits on: a gold row labelled again gets
        the very score its threshold was computed from (no precision lost between fit and label).
        """
        fields = []
        for f, res in zip(schema.fields, result.fields):
            cal = self.calibration.fields.get(f.name)
            if cal is None or res.readout:  # no calibration, or a readout applied in the wave (the decoder)
                fields.append(res)
                continue
            stored = np.asarray(res.probs, dtype=np.float32).astype(np.float64)  # as <f>__probs holds them
            probs = np.asarray(cal.apply(stored), dtype=np.float64)
            label_set = cal.conformal.label_set(probs) if cal.conformal is not None else None
            fields.append(_reweighted(f, res, probs, label_set=label_set, label=cal.decide(probs),
                                      by_rule=cal.by_rule))
        return replace(result, fields=tuple(fields))

    def label_frame(self, df, *, text_field: str = "text", template: str | None = None,
                    id_field: str | None = None, all_probs: bool = True):
        """Label the rows of a pandas DataFrame; return a DataFrame with exactly the columns of
        ``pcd label``'s Parquet output (one row per labelled input row, in input order).

        Rows become records by the same rules as ``pcd label`` (``text_field`` or ``template``
        over columns, ``id_field`` or row numbers from 0 in a ``row`` column). Rows that
        cannot be labelled are left out of the frame and listed in ``result.attrs["errors"]``
        (``{"row", "record", "error"}`` dicts); ``result.attrs["metadata"]`` holds the
        Parquet key-value metadata (``metadata()``); with ``decoder.feature_layers`` set
        (``pcd calibrate --readout linear``), ``result.attrs["features"]`` holds, per row of the
        frame, ``{decision name: {layer: hidden state}}`` at each decision point.

        Raises:
            InputError: ``template`` is malformed, or a needed column is missing from ``df``.
        """
        from .errors import InputError
        from .io.output import results_table
        from .io.readers import InputSpec, row_to_record

        spec = InputSpec(text_field=text_field, template=template, id_field=id_field)
        missing = [c for c in spec.columns_needed() if c not in df.columns]
        if missing:
            raise InputError(f"DataFrame has no column {missing[0]!r} (columns: {', '.join(map(str, df.columns))})")
        frame = df.astype(object).where(df.notna(), None)
        items = [row_to_record(row, i, None, spec) for i, row in enumerate(frame.to_dict("records"))]
        labelled, errors = [], []
        for item, res in zip(items, self.label(items)):
            if isinstance(res, RecordFailure):
                errors.append({"row": item.row, "record": res.id, "error": res.error})
            else:
                labelled.append(res)
        if self.decoder.feature_layers:  # pcd calibrate --readout linear: the hidden states read
            features = [{f.name: res.fields[i].features for i, f in enumerate(self.schema.fields)} for res in labelled]
        arrow_schema = self.output_schema(id_field or "row", _id_type(id_field), all_probs=all_probs)
        result = results_table(labelled, self.schema, arrow_schema).to_pandas()
        result.attrs["errors"] = errors
        result.attrs["metadata"] = self.metadata()
        if self.decoder.feature_layers:
            result.attrs["features"] = features
        return result


def _with_options(job: LabelJob, options: dict) -> LabelJob:
    """``job`` with ``options`` (``LabelJob`` fields given to ``Labeler`` as keywords) applied;
    ``examples`` given as ``Example`` values (the keyword's meaning before the job existed) are
    its ``drawn_examples``.

    Raises:
        TypeError: an option that is not a ``LabelJob`` field (named, with the fields).
    """
    if not options:
        return job
    unknown = sorted(set(options) - set(LabelJob.options()))
    if unknown:
        raise TypeError(f"Labeler() got an unexpected keyword argument {unknown[0]!r} (its options are "
                        f"pcd_cli.job.LabelJob's: {', '.join(LabelJob.options())})")
    examples = options.get("examples")
    if examples is not None and not isinstance(examples, (str, Path)):
        options = {**options, "examples": None, "drawn_examples": tuple(examples)}
    return replace(job, **options)


def build_labeler(schema, job: LabelJob, *, backend=None) -> Labeler:
    """The ``Labeler`` of ``job`` for ``schema`` (``Labeler(schema, job, backend=backend)``).

    Args:
        schema: a ``Schema``, a schema file path or a Pydantic model class.
        job: the labelling options; its ``examples`` file is drawn here unless already drawn.
        backend: an already loaded backend to share (``pcd serve`` loads the model once for
            every schema, ``load_model``); ``None`` loads ``job.model`` with ``job.backend``. A
            backend that ``load_model`` loaded with ``job.adapter`` merged is not merged again.

    Raises:
        SchemaError, ModelError, CompileError, CalibrationError, InputError: as ``Labeler``
        and ``LabelJob.with_examples``.
    """
    return Labeler(schema, job, backend=backend)


def load_model(job: LabelJob):
    """The backend of ``job`` (its ``model`` on its ``backend``, ``device`` and ``dtype``), with
    ``job.adapter`` merged in, loaded once to be shared by several ``build_labeler`` calls.

    Returns:
        ``(backend, warnings)``: the warnings are the adapter's (``ADAPTER_MISMATCH``), which
        each labeler built over it repeats.

    Raises:
        ModelError: the model or adapter cannot be loaded.
    """
    from .backends import load_backend

    backend = load_backend(job.model, backend=job.backend, device=job.device, dtype=job.dtype)
    said: list[str] = []
    if job.adapter is not None:
        backend, said = _with_adapter(backend, job.adapter, job.model)
    return backend, [JobWarning(ADAPTER_MISMATCH, w) for w in said]


def planned_calibration(job: LabelJob):
    """The calibration ``job`` would apply, read without a model: its ``calibration`` file, or
    the tuned ``adapter``/``model`` folder's own (unless ``tuned_calibration`` is off or
    ``prior_correction`` is on), or ``None``. Used where no model is loaded (an empty input):
    a tuned folder's calibration made for another schema or prompt is only found out once the
    model's tokenizer builds the prompt (``Labeler`` then leaves it out with a warning)."""
    if job.calibration is not None:
        return _load_calibration(job.calibration)
    if not job.tuned_calibration or job.prior_correction:
        return None
    path = tuned_calibration_path(job.adapter or job.model)
    return _load_calibration(path) if path is not None else None


def planned_output_schema(schema, job: LabelJob, *, all_probs: bool):
    """The Arrow schema of ``job``'s output for ``schema`` without loading a model (an empty
    input): the columns ``Labeler.output_schema`` gives, by the same rule (``output_columns``),
    the calibration being ``planned_calibration(job)``.

    Raises:
        CalibrationError: ``abstain_unless_single`` without label sets.
    """
    import pyarrow as pa

    from .io.output import output_schema

    columns = output_columns(schema, planned_calibration(job), abstain_below=job.abstain_below,
                             abstain_unless_single=job.abstain_unless_single, permutations=job.permutations,
                             steering_check=job.steering_check)
    return output_schema(schema, job.id_field or "row", pa.string() if job.id_field else pa.int64(),
                         all_probs=all_probs, **columns)


def check_isolation(schema: Schema, permutations: int, examples: Sequence) -> None:
    """Refuse what cannot hold with ``isolate_fields``: each of these shows a field another one.

    Raises:
        SchemaError: ``permutations`` above 1, few-shot ``examples`` (their answer objects hold
            every field), a field with ``depends_on``; the message names the option or field.
    """
    from .errors import SchemaError
    from .schema.load import isolation_problems

    problems = isolation_problems(schema.declared)
    if permutations > 1:
        problems.append(f"--permutations {permutations} cannot be combined with isolate_fields (each ordering lists "
                        "every field's values); use one of them")
    if examples:
        problems.append("few-shot examples cannot be combined with isolate_fields (an example's answer holds every "
                        "field); drop the examples or the isolation")
    if problems:
        raise SchemaError("; ".join(problems))


def label_set_fields(schema: Schema, calibration) -> tuple[str, ...]:
    """Fields of ``schema`` that get a conformal label set (``<f>__set``): those whose
    ``calibration`` (``None``: none) holds one, in schema order."""
    if calibration is None:
        return ()
    return tuple(f.name for f in schema.fields
                 if (c := calibration.fields.get(f.name)) is not None and c.conformal is not None)


def abstain_thresholds(schema: Schema, abstain_below: float | None) -> dict[str, float]:
    """Field name -> the probability below which it is left without a label: the field's own
    ``abstain_below`` in the schema, else the run's ``abstain_below``; fields with neither are left out."""
    return {f.name: f.abstain_below if f.abstain_below is not None else abstain_below
            for f in schema.fields if f.abstain_below is not None or abstain_below is not None}


def abstain_fields(schema: Schema, thresholds: dict[str, float], set_fields: Sequence[str]) -> tuple[str, ...]:
    """Fields that may be left without a label, in schema order: those with a threshold, and
    those in ``set_fields`` (``abstain_unless_single``: fields with label sets)."""
    return tuple(f.name for f in schema.fields if f.name in thresholds or f.name in set_fields)


def output_columns(schema: Schema, calibration, *, abstain_below: float | None, abstain_unless_single: bool,
                   permutations: int, steering_check: bool = False) -> dict:
    """The optional columns of a run's output (``pcd_cli.io.output.output_schema``'s keywords
    ``calibrated``, ``sets``, ``abstain``, ``spread``, ``steered``): the one rule ``Labeler.output_schema`` and
    an output written without a model (``planned_output_schema``) both follow.

    Raises:
        CalibrationError: ``abstain_unless_single`` and no field has a label set.
    """
    sets = label_set_fields(schema, calibration)
    if abstain_unless_single and not sets:
        from .errors import CalibrationError

        raise CalibrationError("--abstain-unless-single needs label sets: a --calibration fitted with "
                               "pcd calibrate --coverage")
    return {"calibrated": calibration is not None, "sets": sets,
            "abstain": abstain_fields(schema, abstain_thresholds(schema, abstain_below),
                                      sets if abstain_unless_single else ()),
            "spread": permutations > 1, "steered": steering_check}


def _folder_key(path) -> str:
    """A folder named the same whichever way it was written (``~``, relative, symlinks)."""
    return str(Path(str(path)).expanduser().resolve())


def tuned_calibration_path(source) -> Path | None:
    """``pcd-calibration.json`` inside a ``pcd tune`` folder (``--model DIR`` or ``--adapter
    DIR``, the card ``pcd-tune.json`` beside it), or ``None``."""
    if source is None or not Path(str(source)).expanduser().is_dir():
        return None
    from .backends.tune_folder import CALIBRATION_NAME, CARD_NAME

    folder = Path(str(source)).expanduser()
    path = folder / CALIBRATION_NAME
    return path if path.is_file() and (folder / CARD_NAME).is_file() else None


def _tune_card(source) -> tuple[dict | None, str]:
    """The ``pcd-tune.json`` card in a model or adapter folder, and how metadata names it
    (``adapter <folder name>`` or ``model <folder name>``)."""
    if source is None or not Path(str(source)).expanduser().is_dir():
        return None, ""
    from .backends.tune_folder import CARD_NAME

    folder = Path(str(source)).expanduser()
    path = folder / CARD_NAME
    if not path.is_file():
        return None, ""
    try:
        card = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, ""
    kind = "adapter" if card.get("kind") == "adapter" else "tuned model"
    return (card if isinstance(card, dict) else None), f"{kind} {folder.name}"


def _with_adapter(backend, adapter, model: str | None = None):
    """``(backend with a LoRA adapter merged in, warnings)`` (a backend that takes adapters,
    ``pcd_cli.backends.select.takes_adapters``: torch; ``pcd_cli.backends.torch_tune.apply_adapter``:
    a misfit raises ``ModelError``)."""
    from .errors import ModelError

    if not takes_adapters(backend):
        raise ModelError("--adapter: adapters are applied on the torch backend; for --backend mlx, write a merged "
                         "model folder with pcd tune (without --adapter-only) and pass it as --model")
    from .backends.torch_tune import apply_adapter

    backend, said = apply_adapter(backend, adapter, model)
    backend.merged_adapter = (_folder_key(adapter), tuple(said))  # a Labeler over it does not merge it again
    from .backends.torch_backend import model_content_key

    backend.adapter_content_key = model_content_key(_folder_key(adapter))  # the job fingerprint's adapter part
    return backend, said


def _id_type(id_field: str | None):
    import pyarrow as pa

    return pa.string() if id_field else pa.int64()


def _reweighted(f, res: FieldResult, probs: np.ndarray, *, label_set: tuple[int, ...] | None = None,
                abstained: bool = False, label: int | None = None, by_rule: bool = False) -> FieldResult:
    """``res`` with new (k,) probabilities (calibrated or prior-corrected): the label is
    ``label`` (a calibration's decision rule, ``FieldCalibration.decide``) or their argmax, and
    ``prob`` that label's probability; the decoder's own probabilities are kept in
    ``raw_probs``, the mass is unchanged; ``abstained`` leaves the value null; ``order_spread``
    (``--permutations``) is kept."""
    label = int(np.argmax(probs)) if label is None else int(label)
    return FieldResult(label=label, value=None if abstained else f.value(label), prob=float(probs[label]),
                       mass=res.mass, probs=tuple(float(p) for p in probs), raw_probs=res.probs,
                       label_set=label_set, abstained=abstained, order_spread=res.order_spread, by_rule=by_rule)


def _load_calibration(calibration):
    """``None``, a loaded calibration, or a path to a calibration file (loaded here)."""
    if calibration is None or not isinstance(calibration, (str, Path)):
        return calibration
    from .quality import Calibration

    return Calibration.load(calibration)


def _as_record(index: int, item) -> Record | RecordFailure:
    """An item of ``Labeler.label`` as a record, by the file readers' rule (``pcd_cli.io.values``):
    a dict is a row with ``text`` and (optional) ``id`` columns; anything else is the text."""
    if isinstance(item, (Record, RecordFailure)):
        return item
    if isinstance(item, dict):
        spec = _DICT_SPEC if "id" in item else _TEXT_SPEC
        return _row_to_record(item, index, None, spec)
    if item is None or isinstance(item, (str, bytes, bool, int, float, list, tuple)):
        return _row_to_record({"text": item}, index, None, _TEXT_SPEC)
    raise TypeError(f"item {index}: expected str, dict or Record, got {type(item).__name__}")


_TEXT_SPEC = InputSpec(text_field="text")
_DICT_SPEC = InputSpec(text_field="text", id_field="id")
