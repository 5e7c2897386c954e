"""One labelling job, whatever the front-end.

``pcd label`` (local or ``--engine ray``), ``pcd serve`` and a notebook describe a labelling run
with one frozen ``LabelJob``, build its ``Labeler`` with ``build_labeler`` (the one place that
lists the ``Labeler``'s keywords) and read what is worth saying about it as ``JobWarning`` values
(``Labeler.warnings``), which each front-end shows its own way: the CLI prints them, ``pcd serve``
logs them at start-up and lists them in ``GET /v1/schemas``, the Ray engine prints them once.

A new labelling option is a field here and a keyword in ``build_labeler``; every front-end that
builds its job from this class has it (DESIGN.md, "One job, many front-ends").

    >>> from pcd_cli.job import LabelJob, build_labeler
    >>> job = LabelJob(model="out/airline.tuned", abstain_below=0.6)
    >>> labeler = build_labeler("schemas/airline_sentiment.yaml", job)
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
        calibration: a ``pcd calibrate`` file; ``None``: none, or the tuned folder's own.
        tuned_calibration: apply the ``pcd-calibration.json`` of a tuned ``model``/``adapter``
            folder when ``calibration`` is ``None`` (``--no-calibration`` sets it false).
        abstain_below, abstain_unless_single: leave a field without a label (``Labeler``).
        examples, shots, seed: few-shot examples drawn from a gold file (``None``: the
            schema's own examples); ``drawn_examples`` holds them once drawn
            (``with_examples``), so that every worker of a run reads the same ones.
        max_tokens_per_pass: token budget of one forward pass.
        trace: keep per-field traces (``pcd label --trace``).

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
    drawn_examples: tuple | None = None

    def __post_init__(self) -> None:
        for name in ("model", "adapter", "calibration", "examples"):  # paths as text: hashable, picklable
            value = getattr(self, name)
            if isinstance(value, Path):
                object.__setattr__(self, name, str(value))
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
            if value is None:
                return None
            path = Path(value).expanduser()
            return str(path.resolve()) if path.exists() else value

        return replace(self, model=absolute(self.model), adapter=absolute(self.adapter),
                       calibration=absolute(self.calibration), examples=absolute(self.examples))

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


def build_labeler(schema, job: LabelJob, *, backend=None):
    """The ``Labeler`` of ``job`` for ``schema``: the one place a front-end builds one.

    Args:
        schema: a ``Schema``, a schema file path or a Pydantic model class.
        job: the labelling options; its ``examples`` file is drawn here unless already drawn.
        backend: an already loaded backend to share (``pcd serve`` loads the model once for
            every schema); ``None`` loads ``job.model`` with ``job.backend``. A backend that
            ``load_model`` loaded with ``job.adapter`` merged is not merged again.

    Returns:
        A ``pcd_cli.api.Labeler``; ``labeler.warnings`` holds the job's ``JobWarning`` values.

    Raises:
        SchemaError, ModelError, CompileError, CalibrationError, InputError: as ``Labeler``
        and ``LabelJob.with_examples``.
    """
    from .api import Labeler
    from .schema.load import load_schema
    from .schema.model import Schema

    if isinstance(schema, type):  # a Pydantic model class
        from .schema.load import schema_from_model

        schema = schema_from_model(schema)
    elif not isinstance(schema, Schema):
        schema = load_schema(schema)
    job = job.with_examples(schema)
    return Labeler(schema, model=job.model, device=job.device, dtype=job.dtype, scoring=job.scoring,
                   max_tokens_per_pass=job.max_tokens_per_pass, trace=job.trace,
                   backend=backend if backend is not None else job.backend, truncate=job.truncate,
                   examples=job.drawn_examples, template=job.template, calibration=job.calibration,
                   adapter=job.adapter, abstain_unless_single=job.abstain_unless_single,
                   abstain_below=job.abstain_below, prior_correction=job.prior_correction,
                   permutations=job.permutations, tuned_calibration=job.tuned_calibration,
                   isolate_fields=job.isolate_fields)


def load_model(job: LabelJob):
    """The backend of ``job`` (its ``model`` on its ``backend``, ``device`` and ``dtype``), with
    ``job.adapter`` merged in, loaded once to be shared by several ``build_labeler`` calls.

    Returns:
        ``(backend, warnings)``: the warnings are the adapter's (``ADAPTER_MISMATCH``), which
        each labeler built over it repeats.

    Raises:
        ModelError: the model or adapter cannot be loaded.
    """
    from .api import _with_adapter
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
    from .api import _load_calibration, tuned_calibration_path

    if job.calibration is not None:
        return _load_calibration(job.calibration)
    if not job.tuned_calibration or job.prior_correction:
        return None
    path = tuned_calibration_path(job.adapter or job.model)
    return _load_calibration(path) if path is not None else None


def planned_output_schema(schema, job: LabelJob, *, all_probs: bool):
    """The Arrow schema of ``job``'s output for ``schema`` without loading a model (an empty
    input): the columns ``Labeler.output_schema`` gives, by the same rule
    (``pcd_cli.api.output_columns``), the calibration being ``planned_calibration(job)``.

    Raises:
        CalibrationError: ``abstain_unless_single`` without label sets.
    """
    import pyarrow as pa

    from .api import output_columns
    from .io.output import output_schema

    columns = output_columns(schema, planned_calibration(job), abstain_below=job.abstain_below,
                             abstain_unless_single=job.abstain_unless_single, permutations=job.permutations)
    return output_schema(schema, job.id_field or "row", pa.string() if job.id_field else pa.int64(),
                         all_probs=all_probs, **columns)


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
