"""One labelling job, whatever the front-end.

``pcd label`` (local or ``--engine ray``), ``pcd serve`` and a notebook describe a labelling run
with one frozen ``LabelJob``; the ``Labeler`` takes it whole (``Labeler(schema, job)``, or
``pcd_cli.api.build_labeler`` to share a loaded backend) and says what is worth saying about it
as ``JobWarning`` values (``Labeler.warnings``), which each front-end shows its own way: the CLI
prints them, ``pcd serve`` logs them at start-up and lists them in ``GET /v1/schemas``, the Ray
engine prints them once.

A new labelling option is a field here, read by the ``Labeler`` from its job; the CLI declares
it once (``pcd_cli.cli``) and builds every command's job in one helper, so every front-end that
builds its job from this class has it (docs/architecture.md, "Where a new ... goes").

This module is below ``pcd_cli.api``: it describes a job and never builds a ``Labeler``.

    >>> from pcd_cli import Labeler
    >>> from pcd_cli.job import LabelJob
    >>> job = LabelJob(model="out/airline.tuned", abstain_below=0.6)
    >>> labeler = Labeler("schemas/airline_sentiment.yaml", job)
    >>> [w.code for w in labeler.warnings]
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from pathlib import Path

from .decoding.decode import DEFAULT_MAX_TOKENS_PER_PASS
from .errors import InputError

from .job_warnings import (  # noqa: F401 - the codes are part of the job's public face
    ADAPTER_MISMATCH,
    CALIBRATION_WORSE,
    DTYPE_MISMATCH,
    OUTPUT_NOT_PARQUET,
    SCHEMA_WARNING,
    TUNE_MISMATCH,
    TUNED_CALIBRATION_SKIPPED,
    WEAK_LABEL_SET,
    JobWarning,
)

#: Whether a job runs the steering check unless told otherwise (``LabelJob.steering_check``): on, as
#: it costs about 1 % more decoding on clean records (docs/security.md, "Cost of the check"). The one
#: definition every front-end's default comes from (``--steering-check/--no-steering-check``,
#: ``pcd serve``, the Ray engine, Label Studio's backend).
DEFAULT_STEERING_CHECK = True


@dataclass(frozen=True)
class LabelJob:
    """Everything that decides what a labelling run writes, whichever front-end runs it.

    Attributes:
        model: ``None`` (the embedded model), a ``.gguf`` file, a model folder or a model id.
        adapter: a ``pcd tune --adapter-only`` folder merged into the weights at load.
        device, dtype, backend: where and how the model runs (``auto`` picks).
        scoring: ``marginal`` or ``exact`` (``Labeler``).
        template, text_field, id_field: how a row becomes a record (``pcd_cli.io.readers.InputSpec``).
        truncate: ``middle|head|tail|error`` for a text too long for the context.
        permutations: K >= 2 averages K label orderings (``pcd_cli.decoding.permute``).
        prior_correction: divide by the content-free priors (``pcd_cli.decoding.prior``).
        isolate_fields: decide each field in its own branch (``Labeler``; also the schema's
            ``isolate_fields: true``).
        calibration: a ``pcd calibrate`` file (or a loaded ``pcd_cli.quality.Calibration``, from
            Python); ``None``: none, or the tuned folder's own.
        tuned_calibration: apply the ``pcd-calibration.json`` of a tuned ``model``/``adapter``
            folder when ``calibration`` is ``None`` (``--no-calibration`` sets it false).
        abstain_below, abstain_unless_single: leave a field without a label (``Labeler``).
        examples, shots, seed: few-shot examples drawn from a gold file (``None``: the
            schema's own examples); ``drawn_examples`` holds them once drawn
            (``with_examples``), so that every worker of a run reads the same ones.
        max_tokens_per_pass: token budget of one forward pass.
        trace: keep per-field traces (``pcd label --trace``).
        record_quoting: how the record's text is put in the prompt, ``"json"`` (quoted as data,
            docs/security.md) or ``"none"`` (as it is, the prompt of earlier releases: an opt-out);
            ``None``: the schema's ``record_quoting`` (``"json"`` unless the schema says
            otherwise: ``pcd_cli.schema.model.DEFAULT_RECORD_QUOTING``). Decision-changing: it
            changes the prompt (its head and every record's tokens).
        steering_check: decode each record that has sentences addressing the labeller again
            without them and flag every field whose label moves (``pcd_cli.steering``): it gets
            the label without them and ``<field>__steered``. Decision-changing; on by default
            (``DEFAULT_STEERING_CHECK``; ``--no-steering-check`` turns it off, docs/security.md).

    Raises:
        InputError: ``calibration`` with ``tuned_calibration`` off (``--calibration`` and
            ``--no-calibration`` exclude each other).
    """

    model: str | None = None
    adapter: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    backend: str = "auto"
    scoring: str = "marginal"
    template: str | None = None
    text_field: str = "text"
    id_field: str | None = None
    truncate: str = "middle"
    permutations: int = 1
    prior_correction: bool = False
    isolate_fields: bool = False
    calibration: str | None = None
    tuned_calibration: bool = True
    abstain_below: float | None = None
    abstain_unless_single: bool = False
    examples: str | None = None
    shots: int = 4
    seed: int = 0
    max_tokens_per_pass: int = DEFAULT_MAX_TOKENS_PER_PASS
    trace: bool = False
    record_quoting: str | None = None
    steering_check: bool = DEFAULT_STEERING_CHECK
    drawn_examples: tuple | None = None

    def __post_init__(self) -> None:
        for name in ("model", "adapter", "calibration", "examples"):  # paths as text: hashable, picklable
            value = getattr(self, name)
            if isinstance(value, Path):
                object.__setattr__(self, name, str(value))
        if self.record_quoting not in (None, "json", "none"):
            raise InputError(f"--record-quoting {self.record_quoting!r}: expected json or none")
        if self.calibration is not None and not self.tuned_calibration:
            raise InputError("--calibration and --no-calibration exclude each other: choose one")

    @classmethod
    def options(cls) -> tuple[str, ...]:
        """The names of the job's options (``drawn_examples`` excepted: it is derived)."""
        return tuple(f.name for f in fields(cls) if f.name != "drawn_examples")

    def input_spec(self, *, limit: int | None = None, csv_delimiter: str = ","):
        """The ``InputSpec`` rows are read by for this job (``pcd_cli.io.readers``)."""
        from .io.readers import InputSpec

        return InputSpec(text_field=self.text_field, template=self.template, id_field=self.id_field, limit=limit,
                         csv_delimiter=csv_delimiter)

    def with_examples(self, schema) -> "LabelJob":
        """This job with its ``examples`` file drawn into ``drawn_examples`` (itself without one,
        or once drawn). ``pcd_cli.decoding.examples.draw_examples`` draws them.

        Raises:
            InputError: the file cannot be read or has fewer usable rows than ``shots``.
        """
        if self.examples is None or self.drawn_examples is not None:
            return self
        from .decoding.examples import draw_examples

        drawn = draw_examples(self.examples, schema, self.input_spec(), shots=self.shots, seed=self.seed)
        return replace(self, drawn_examples=tuple(drawn))

    def resolved(self) -> "LabelJob":
        """This job with its local paths made absolute (for workers in another folder or process)."""
        def absolute(value):
            if not isinstance(value, str):  # None, or a loaded calibration
                return value
            path = Path(value).expanduser()
            return str(path.resolve()) if path.exists() else value

        return replace(self, model=absolute(self.model), adapter=absolute(self.adapter),
                       calibration=absolute(self.calibration), examples=absolute(self.examples))

    def for_workers(self, schema) -> "LabelJob":
        """This job as it travels to workers on other machines (``pcd label --engine ray``,
        ``label_dataset``): local paths absolute (``resolved``), examples drawn (``with_examples``)
        and the ``calibration`` file loaded, so that its content (rules and linear readouts
        included) goes with the job and the file need not exist on every node; the model folder,
        which every worker loads, must.

        Raises:
            InputError: the examples file (``with_examples``). CalibrationError: the calibration
                file cannot be read (named; before any worker starts).
        """
        job = self.resolved().with_examples(schema)
        if isinstance(job.calibration, str):
            from .quality import Calibration

            job = replace(job, calibration=Calibration.load(job.calibration))
        return job

    def for_questions(self) -> "LabelJob":
        """The job of a schema built from a request's questions (``pcd serve``'s Jev and OpenAI
        routes): the model, scoring, truncation, permutations and prior correction of the served
        job, without what belongs to one schema (its calibration, examples, abstention, isolation:
        an isolated request's schema says so itself, ``questions.isolated_schema``)."""
        return replace(self, calibration=None, tuned_calibration=False, abstain_below=None, isolate_fields=False,
                       abstain_unless_single=False, examples=None, drawn_examples=None, id_field=None)

    def for_question_schema(self, schema) -> "LabelJob":
        """``for_questions``'s job as it applies to one request-built ``schema``: on an isolated
        schema (``questions.isolated_schema``) ``permutations`` is 1, since each question's option
        order is canonical already (``questions.canonical_order``) and ``--permutations`` needs
        every field's values in one list: ``pcd serve --permutations K`` applies to served schemas
        and shared-prompt requests (docs/serve.md)."""
        job = self.for_questions()
        return replace(job, permutations=1) if schema.isolate_fields and job.permutations > 1 else job


def schema_warnings(schema) -> list[JobWarning]:
    """The schema's own load-time warnings (``Schema.warnings``) as ``JobWarning`` values
    (``SCHEMA_WARNING``): the first a run says, before any model loads."""
    return [JobWarning(SCHEMA_WARNING, text) for text in schema.warnings]


def warnings_json(warnings) -> str:
    """``warnings`` as one JSON text (a list of ``{"code", "message"}``), e.g. for a worker's
    result column."""
    return json.dumps([w.to_dict() for w in warnings], ensure_ascii=False)


def warnings_from_json(text: str) -> list[JobWarning]:
    """The inverse of ``warnings_json``."""
    return [JobWarning(**w) for w in json.loads(text)]
