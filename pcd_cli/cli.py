"""The ``pcd`` command line: the commands and their options. Each body parses, builds its options
(a ``pcd_cli.job.LabelJob`` where it labels), calls one library function and renders what it
returns with ``pcd_cli.console``. No logic here.

Exit codes: 0 done; 1 more failures than --max-errors, or no record could be labelled
(``inspect-schema --strict``: any warning); 2 bad schema, input or option; 3 model or
compile problem; 4 internal error (a bug: one line on stderr, the traceback in the
``--log-format json`` log); 5 the machine could not do it (no space, read-only folder,
permission, I/O error; names the path); 130 interrupted (resumable); 141 stdout or stderr
closed by its reader (``| head``), quietly.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Optional

import typer
import typer.core
from rich.markup import escape

from .console import (  # noqa: F401 - EXIT_*, write_json: part of the CLI's public face (tests, scripts)
    EXIT_BROKEN_PIPE,
    EXIT_INTERNAL,
    EXIT_MACHINE,
    Group,
    Reporter,
    TuneProgress,
    err,
    label_done,
    label_errors,
    out,
    render_error_budget,
    said_written,
    write_json,
)
from .backends.select import BACKENDS
from .decoding.decode import DEFAULT_MAX_TOKENS_PER_PASS
from .engines.local import DEFAULT_BATCH_RECORDS
from .engines.reuse import DEFAULT_DEDUP_KEYS
from .job import DEFAULT_STEERING_CHECK
from .quality.calibration import DEFAULT_UNLABELLED_SAMPLE
from .errors import InputError, PcdError, exit_code
from .quality.decision import calibrate_objective_help, tune_objective_help
from .server import limits as L
from .tune import DEFAULT_MASS_WEIGHT
from .version import __version__

app = typer.Typer(add_completion=False, no_args_is_help=True, cls=Group,
                  help="Label records with closed schemas (booleans, enums) using parallel constrained decoding.")

#: Columns of the help when stdout is not a terminal (``pcd label --help | less``, a file): rich
#: falls back to 80 there, which split option names and wrapped every description to a few words.
#: A terminal keeps its own width; ``COLUMNS`` or ``TERMINAL_WIDTH`` (typer's) still decide.
PIPED_HELP_WIDTH = 100


def _help_width() -> None:
    """Set typer's help width once for every command (``typer.rich_utils.MAX_WIDTH``, read when
    help is printed) to ``PIPED_HELP_WIDTH`` when stdout is not a terminal and no variable says."""
    import os
    import sys

    import typer.rich_utils

    if typer.rich_utils.MAX_WIDTH is None and not os.environ.get("COLUMNS") and not sys.stdout.isatty():
        typer.rich_utils.MAX_WIDTH = PIPED_HELP_WIDTH


_help_width()



class Scoring(str, Enum):
    marginal = "marginal"
    exact = "exact"


class Device(str, Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"
    mps = "mps"


class DType(str, Enum):
    auto = "auto"
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


#: ``--backend``'s choices: the backends ``pcd_cli.backends.select`` names (``auto`` first).
BackendKind = Enum("BackendKind", {name: name for name in BACKENDS}, type=str)


class RecordQuoting(str, Enum):
    json = "json"
    none = "none"


class Truncate(str, Enum):
    middle = "middle"
    head = "head"
    tail = "tail"
    error = "error"


class Format(str, Enum):
    jsonl = "jsonl"
    csv = "csv"
    parquet = "parquet"
    jsonl_gz = "jsonl.gz"
    jsonl_zst = "jsonl.zst"
    csv_gz = "csv.gz"
    csv_zst = "csv.zst"


MODEL_OPT = typer.Option(None, "--model", "-m", help="transformers model id, local model folder or .gguf file "
                         "(default: the embedded SmolLM2-135M-Instruct).")
DEVICE_OPT = typer.Option(Device.auto, "--device", help="Where to run the model.")
DTYPE_OPT = typer.Option(DType.auto, "--dtype", help="Weights dtype (auto: float32 on CPU).")
BACKEND_OPT = typer.Option(BackendKind.auto, "--backend", help="torch (transformers) or mlx (mlx-lm: "
                           "pip install 'pcd-cli\\[mlx]'); auto: mlx on Apple silicon when installed, else torch.")
SCORING_OPT = typer.Option(Scoring.marginal, "--scoring", help="marginal: follow each label until it is identified; "
                           "exact: score every label to the end of its line.")
BUDGET_OPT = typer.Option(DEFAULT_MAX_TOKENS_PER_PASS, "--max-tokens-per-pass", min=16, help="Token budget of one forward pass "
                          "(bounds memory; records are packed up to it).")


CALIBRATION_OPT = typer.Option(None, "--calibration", help="Calibration file from `pcd calibrate` for this schema, "
                               "model, prompt head and scoring: probabilities become calibrated (the raw one is kept "
                               "in <field>__raw_prob); a field with a linear readout (--readout linear) gets its "
                               "label and <field>__prob from the readout, <field>__mass stays the model's.")
PERMUTATIONS_OPT = typer.Option(1, "--permutations", min=1, help="K >= 2: combine each field's probabilities over "
                                "K orderings of the booleans' and enums' labels (cyclic shifts and their "
                                "reversals), listed after the record; the record is fed once, each ordering is a "
                                "branch; writes <field>__order_spread. Less lean toward a label for its place in "
                                "the list.")
EXAMPLES_OPT = typer.Option(None, "--examples", help="Gold file (JSONL/CSV/Parquet with the text and one column per "
                            "field, or a Label Studio / Argilla export) to draw few-shot examples from; they replace "
                            "the schema's own examples.")
SHOTS_OPT = typer.Option(4, "--shots", min=1, help="Examples drawn from --examples, balanced over each field's labels.")
CSV_DELIMITER_OPT = typer.Option(",", "--csv-delimiter", help="CSV field separator, e.g. ';' or '\\t'.")


class EncodingErrors(str, Enum):
    strict = "strict"
    replace = "replace"


ENCODING_ERRORS_OPT = typer.Option(EncodingErrors.strict, "--encoding-errors", help="A JSONL or CSV row with bytes "
                                   "that are not UTF-8: strict fails the row (pcd label: into the errors file); "
                                   "replace reads each such byte as U+FFFD and keeps the row, a warning naming the "
                                   "rows (pcd label: also its done event; --engine local).")
TEXT_FIELD_OPT = typer.Option("text", "--text-field", help="Column holding the text.")
TEMPLATE_OPT = typer.Option(None, "--template", help="Compose the text from columns, e.g. 'Subject: {subject}\\n\\n{body}'.")
ADAPTER_OPT = typer.Option(None, "--adapter", help="LoRA adapter folder from `pcd tune --adapter-only`, merged "
                           "into --model's weights at load (torch backend).")
SEED_OPT = typer.Option(0, "--seed", help="Seed of the --examples draw (the same seed draws the same examples).")
TRUNCATE_OPT = typer.Option(Truncate.middle, "--truncate", help="A text too long for the model's context loses its "
                            "middle, head or tail (marked in __truncated), or fails (error).")
NO_CALIBRATION_OPT = typer.Option(False, "--no-calibration", help="Write the raw probabilities of a --model or "
                                  "--adapter folder from pcd tune (by default its pcd-calibration.json is applied).")
ABSTAIN_UNLESS_SINGLE_OPT = typer.Option(False, "--abstain-unless-single", help="With a --calibration fitted with "
                                         "--coverage: write a null label where the field's label set is not a "
                                         "single label.")
PRIOR_CORRECTION_OPT = typer.Option(False, "--prior-correction", help="Divide each field's probabilities by those "
                                    "of content-free records ('N/A', '[MASK]', '(empty)'), measured once: less lean "
                                    "toward the labels a small model prefers anyway.")
ISOLATE_FIELDS_OPT = typer.Option(False, "--isolate-fields", help="Decide each field in its own branch after the "
                                  "record, seeing only its own key and values: a field's label does not change when "
                                  "other fields are added, removed or moved (the schema's isolate_fields: true). "
                                  "Costs each field's catalog line per record.")
RECORD_QUOTING_OPT = typer.Option(None, "--record-quoting", help="How the record's text is put in the prompt: json "
                                  "(quoted as one JSON string, the prompt saying it is data to judge, never "
                                  "instructions; the default, or the schema's record_quoting) or none (as it is: the "
                                  "prompt of earlier releases). docs/security.md.")
STEERING_CHECK_OPT = typer.Option(DEFAULT_STEERING_CHECK, "--steering-check/--no-steering-check", help="Decode each record that has "
                                  "sentences addressing the labeller (role tags, answer objects, the prompt's and "
                                  "labels' own words) again without them; a field whose label moves gets the label "
                                  "without them and <field>__steered true. docs/security.md.")
ABSTAIN_BELOW_OPT = typer.Option(None, "--abstain-below", min=0.0, max=1.0, help="Leave a field without a label "
                                 "(null, <field>__abstained true) when its probability is below P; a field's own "
                                 "abstain_below wins.")


def _panel(option, panel: str):
    """A copy of a shared option shown in the help panel ``panel`` of one command."""
    import copy

    option = copy.copy(option)
    option.rich_help_panel = panel
    return option


def _label_job(params: dict, *, besides: tuple[str, ...] = (), **given):
    """The ``LabelJob`` of one command's options: the one place the CLI builds a job.

    Each of the command's parameters (``params``: its ``locals()``) named as a ``LabelJob`` option
    (``LabelJob.options()``, declared once above: ``MODEL_OPT``, ``SCORING_OPT``, ...) is that
    option, an ``Enum`` as its value; ``--no-calibration`` is ``tuned_calibration`` false. Then
    ``given``: what a command sets otherwise. ``besides``: the command's parameters that share a
    job option's name but mean something else (``pcd tune``'s ``--scoring``, the gold file's
    ``--id-field``, ``pcd label``'s ``--trace`` file, ``pcd serve``'s NAME=PATH lists).

    Raises:
        InputError: as ``LabelJob`` (``--calibration`` with ``--no-calibration``).
    """
    from .job import LabelJob

    options = {name: params[name].value if isinstance(params[name], Enum) else params[name]
               for name in LabelJob.options() if name in params and name not in besides}
    if "no_calibration" in params:
        options["tuned_calibration"] = not params["no_calibration"]
    return LabelJob(**options | given)


_display_type_rich = typer.core.TyperOption.display_type_rich


def _flag_without_placeholder(self, ctx):
    """Help shows ``--all-probs``, not ``--all-probs <bool>``: flags take no value."""
    return None if self.is_flag else _display_type_rich(self, ctx)


typer.core.TyperOption.display_type_rich = _flag_without_placeholder


def _fail(exc: PcdError) -> typer.Exit:
    err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
    return typer.Exit(exit_code(exc))


def _version(value: bool) -> None:
    if value:
        out.print(f"pcd {__version__}")
        raise typer.Exit()


@app.callback()
def main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                      help="Print the version and exit.")) -> None:
    """pcd: fast, typed, calibrated-where-measured labels from a local LLM."""


class Engine(str, Enum):
    local = "local"
    ray = "ray"


class LogFormat(str, Enum):
    text = "text"
    json = "json"


@app.command()
def label(
    input: str = typer.Argument(..., help="Input: a .jsonl, .csv or .parquet file (.jsonl/.csv may end in .gz "
                                "or .zst), a folder or a glob of them (hive key=value folders become columns), any of "
                                "these as a URI (s3://, gs://, file://; docs/inputs.md), or - for standard input "
                                "(with --format)."),
    schema: Path = typer.Option(..., "--schema", "-s", help="Schema file (YAML or JSON), or models.py:Model "
                                "(a Pydantic model)."),
    output: Optional[str] = typer.Option(None, "--output", "-o", help="Output Parquet file, a path or a URI "
                                         "(s3://...: uploaded whole at the end) (default: <input stem>.labels.parquet "
                                         "next to the input; --engine ray: a folder, or one Parquet object at a URI).",
                                         rich_help_panel='Output'),
    model: Optional[str] = _panel(MODEL_OPT, 'Model'),
    device: Device = _panel(DEVICE_OPT, 'Model'),
    dtype: DType = _panel(DTYPE_OPT, 'Model'),
    backend: BackendKind = _panel(BACKEND_OPT, 'Model'),
    scoring: Scoring = _panel(SCORING_OPT, 'Model'),
    fmt: Optional[Format] = typer.Option(None, "--format", help="Input format (default: from the extension; "
                                         "required for -).", rich_help_panel='Input'),
    csv_delimiter: str = _panel(CSV_DELIMITER_OPT, 'Input'),
    encoding_errors: EncodingErrors = _panel(ENCODING_ERRORS_OPT, 'Input'),
    text_field: str = _panel(TEXT_FIELD_OPT, 'Input'),
    template: Optional[str] = _panel(TEMPLATE_OPT, 'Input'),
    id_field: Optional[str] = typer.Option(None, "--id-field", help="Column holding the record id "
                                           "(default: the input's 'id' column if it has one, else row numbers "
                                           "from 0 in a column 'row').", rich_help_panel='Input'),
    row_ids: bool = typer.Option(False, "--row-ids", help="Number the rows (column 'row') even when the input "
                                 "has an 'id' column.", rich_help_panel='Input'),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="Label only the first N rows.", rich_help_panel='Input'),
    all_probs: bool = typer.Option(False, "--all-probs", help="Add <field>__probs (label -> probability) columns.", rich_help_panel='Output'),
    trace: Optional[Path] = typer.Option(None, "--trace", help="Write one JSON line per record and field "
                                         "with the context, lines, probabilities and mass.", rich_help_panel='Output'),
    errors: Optional[str] = typer.Option(None, "--errors", help="Where failed records go "
                                         "(default: <output stem>.errors.jsonl beside the output).", rich_help_panel='Output'),
    min_mass: float = typer.Option(0.5, "--min-mass", min=0.0, max=1.0, help="Report fields whose candidate "
                                   "mass is below this.", rich_help_panel='Output'),
    max_tokens_per_pass: int = _panel(BUDGET_OPT, 'Model'),
    truncate: Truncate = _panel(TRUNCATE_OPT, 'Model'),
    max_errors: Optional[int] = typer.Option(None, "--max-errors", min=0, help="Stop (exit 1) once more rows "
                                             "than this have failed (default: no limit).", rich_help_panel='Cron'),
    resume: bool = typer.Option(False, "--resume", help="Continue the unfinished run of this same job, if there "
                                "is one (else start afresh). Safe to put in every cron line.", rich_help_panel='Cron'),
    batch_size: int = typer.Option(DEFAULT_BATCH_RECORDS, "--batch-size", min=1, help="Rows per checkpoint "
                                   "(a killed run loses at most the batch in flight).", rich_help_panel='Cron'),
    reuse: Optional[list[str]] = typer.Option(None, "--reuse", help="An earlier pcd output (file, folder or "
                                              "glob; repeatable): a row whose text it labelled under the same job "
                                              "is copied from it, not decoded.", rich_help_panel='Cron'),
    dedup_keys: int = typer.Option(DEFAULT_DEDUP_KEYS, "--dedup-keys", min=0, help="Distinct texts remembered "
                                   "so that a repeated text is decoded once (the oldest out; 0: off).",
                                   rich_help_panel='Cron'),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only warnings and errors.", rich_help_panel='Cron'),
    log_format: LogFormat = typer.Option(LogFormat.text, "--log-format", help="text, or json: one JSON "
                                         "object per line on stderr (events, warnings, errors, summary).", rich_help_panel='Cron'),
    progress: Optional[bool] = typer.Option(None, "--progress/--no-progress", help="Progress bar "
                                            "(default: only on a terminal, never with --quiet or json logs).", rich_help_panel='Cron'),
    calibration: Optional[Path] = _panel(CALIBRATION_OPT, 'Quality'),
    no_calibration: bool = _panel(NO_CALIBRATION_OPT, 'Quality'),
    abstain_unless_single: bool = _panel(ABSTAIN_UNLESS_SINGLE_OPT, 'Quality'),
    prior_correction: bool = _panel(PRIOR_CORRECTION_OPT, 'Quality'),
    permutations: int = _panel(PERMUTATIONS_OPT, 'Quality'),
    isolate_fields: bool = _panel(ISOLATE_FIELDS_OPT, 'Quality'),
    record_quoting: Optional[RecordQuoting] = _panel(RECORD_QUOTING_OPT, 'Quality'),
    steering_check: bool = _panel(STEERING_CHECK_OPT, 'Quality'),
    abstain_below: Optional[float] = _panel(ABSTAIN_BELOW_OPT, 'Quality'),
    adapter: Optional[Path] = _panel(ADAPTER_OPT, 'Quality'),
    examples: Optional[Path] = _panel(EXAMPLES_OPT, 'Quality'),
    shots: int = _panel(SHOTS_OPT, 'Quality'),
    seed: int = _panel(SEED_OPT, 'Quality'),
    engine: Engine = typer.Option(Engine.local, "--engine", help="local: this process, checkpointed "
                                  "(--resume); ray: a pool of Ray Data actors, output a folder of Parquet files (one "
                                  "Parquet object at a URI) (pip install 'pcd-cli\\[ray]'; docs/ray.md).", rich_help_panel='Engines'),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", envvar="RAY_ADDRESS", help="Ray cluster to "
                                               "join (default: $RAY_ADDRESS, else a local Ray for the run).", rich_help_panel='Engines'),
    workers: int = typer.Option(1, "--workers", min=1, help="--engine ray: actors, each with its own model.", rich_help_panel='Engines'),
    worker_cpus: float = typer.Option(1.0, "--worker-cpus", min=0.0, help="--engine ray: CPUs per actor.", rich_help_panel='Engines'),
    worker_gpus: float = typer.Option(0.0, "--worker-gpus", min=0.0, help="--engine ray: GPUs per actor.", rich_help_panel='Engines'),
) -> None:
    """Label every record of INPUT with SCHEMA and write a Parquet file.

    Examples:

      pcd label sample_data/sms_spam.jsonl -s schemas/sms_spam.yaml --id-field id -o out/sms.parquet

      zcat export.jsonl.gz | pcd label - --format jsonl -s schema.yaml -o labels.parquet --resume

    Exit codes: 0 done (some rows may be in the errors file); 1 more failures than --max-errors,
    or no row could be labelled; 2 bad option, schema or input; 3 model or compile problem;
    4 internal error (a bug); 5 the machine could not do it (no space left, read-only folder,
    permission, I/O error): free it and rerun with --resume; 130 interrupted (SIGINT/SIGTERM)
    after committing the current batch: rerun with --resume.
    """
    from .engines.local import default_errors, default_errors_uri, default_output
    from .io.readers import DEFAULT_ID_COLUMN, is_stdin
    from .io.storage import uri_scheme

    report = Reporter(log_format, quiet)
    if quiet or report.json:
        progress = False if progress is None or report.json else progress
    try:  # a typo'd URI (s3:/bucket/x) in INPUT or -o is refused here (storage.uri_scheme): exit 2
        output = output or (None if is_stdin(input) else default_output(input))
        if not errors and output:  # beside the output (a URI beside a URI): the summary names it
            errors = default_errors_uri(str(output)) if uri_scheme(output) else default_errors(output)
    except PcdError as exc:
        report("error", {"message": str(exc), "exit_code": exit_code(exc)}, "error")
        raise typer.Exit(exit_code(exc)) from None
    id_detected = False
    if id_field is None and not row_ids and not is_stdin(input) and _has_id_column(input, text_field, template,
                                                                                   csv_delimiter, fmt):
        id_field, id_detected = DEFAULT_ID_COLUMN, True  # said with the result (_done), not before an error
    with label_errors(report, output, engine is Engine.local):
        if row_ids and id_field:
            raise InputError("--row-ids and --id-field exclude each other: choose one")
        job = _label_job(locals(), besides=("trace",))  # the job's trace follows --trace (run_label_job)
        run_args = dict(output=output, errors_path=errors, trace_path=trace, all_probs=all_probs, min_mass=min_mass,
                        fmt=fmt.value if fmt else None, limit=limit, csv_delimiter=csv_delimiter,
                        max_errors=max_errors, resume=resume, on_event=report, reuse=reuse or [],
                        dedup_keys=dedup_keys)
        if engine is Engine.ray:
            from .engines.ray_engine import run_label_job as run_on_ray

            if encoding_errors is EncodingErrors.replace:
                raise InputError("--encoding-errors replace applies to --engine local only (its rows are counted "
                                 "and named by the local reader)")

            run = run_on_ray(schema, input, job, progress=bool(progress), address=ray_address, workers=workers,
                             worker_cpus=worker_cpus, worker_gpus=worker_gpus, batch_size=batch_size, **run_args)
        else:
            from .engines.local import run_label_job, stop_on_signals

            if (workers, worker_cpus, worker_gpus) != (1, 1.0, 0.0):
                raise InputError("--workers, --worker-cpus and --worker-gpus apply to --engine ray only")
            with stop_on_signals() as should_stop:  # from here: SIGINT/SIGTERM stop cleanly, even during loading
                run = run_label_job(schema, input, job, progress=progress, batch_records=batch_size,
                                    should_stop=should_stop, encoding_errors=encoding_errors.value, **run_args)
    label_done(report, run.stats, input, output, errors, quiet, id_field=id_field, id_detected=id_detected,
               notes=run.notes)


def _has_id_column(input: Path, text_field: str, template, csv_delimiter: str, fmt) -> bool:
    """Whether ``pcd label`` takes the input's ``id`` column as the id (``io.has_id_column``);
    a bad option here is left for the checks that report it."""
    from .io.readers import InputSpec, has_id_column

    try:
        spec = InputSpec(text_field=text_field, template=template, csv_delimiter=csv_delimiter)
    except PcdError:
        return False
    return has_id_column(input, spec, fmt.value if fmt else None)


@app.command("inspect-schema")
def inspect_schema(
    schema: Path = typer.Argument(..., help="Schema file (YAML or JSON)."),
    model: Optional[str] = MODEL_OPT,
    scoring: Scoring = SCORING_OPT,
    json_out: bool = typer.Option(False, "--json", help="Print the report as one JSON object (shape: docs/inspect-schema.md)."),
    strict: bool = typer.Option(False, "--strict", help="Exit 1 when there is any warning."),
    template: Optional[str] = typer.Option(None, "--template", help="The --template of pcd label, for the schema's "
                                           "examples given as columns."),
    id_field: Optional[str] = typer.Option(None, "--id-field", help="The --id-field of pcd label: a field whose "
                                           "output column clashes with the id column (default 'row') is refused "
                                           "here as label refuses it."),
) -> None:
    """Probe the model's tokenizer (no weights) for label collisions, naming and layout traps."""
    from .engines.local import id_column
    from .inspect import inspect
    from .inspect_render import render_inspection, report_json
    from .io.output import check_columns
    from .io.readers import InputSpec
    from .schema.load import load_schema

    try:
        parsed = load_schema(schema)
        check_columns(parsed, id_column(InputSpec(id_field=id_field)), all_probs=True)  # what label refuses
        report = inspect(parsed, model=model, scoring=scoring.value, template=template)
    except PcdError as exc:
        raise _fail(exc) from None
    if json_out:
        typer.echo(report_json(report))
    else:
        render_inspection(report, out)
    if strict and report.warnings:
        raise typer.Exit(1)


class Baseline(str, Enum):
    transformers = "transformers"
    llama_cpp = "llama.cpp"


@app.command()
def bench(
    schema: Path = typer.Option(..., "--schema", "-s", help="Schema file.", rich_help_panel='Input'),
    input: Path = typer.Option(..., "--input", "-i", help="Records (.jsonl/.csv/.parquet, 'text' column).",
                               rich_help_panel='Input'),
    n: int = typer.Option(5, "--n", min=1, help="Records to run.", rich_help_panel='Input'),
    model: Optional[str] = _panel(MODEL_OPT, 'Model'),
    device: Device = _panel(DEVICE_OPT, 'Model'),
    dtype: DType = _panel(DTYPE_OPT, 'Model'),
    backend: BackendKind = _panel(BACKEND_OPT, 'Model'),
    text_field: str = _panel(TEXT_FIELD_OPT, 'Input'),
    template: Optional[str] = _panel(TEMPLATE_OPT, 'Input'),
    csv_delimiter: str = _panel(CSV_DELIMITER_OPT, 'Input'),
    max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens", help="Cap on generated tokens "
                                                 "(default: twice a complete answer object's tokens + 32).",
                                                 rich_help_panel='Baseline'),
    max_tokens_per_pass: int = _panel(BUDGET_OPT, 'Model'),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write per-record rows and the summary as JSON.",
                                            rich_help_panel='Output'),
    gold: Optional[Path] = typer.Option(None, "--gold", help="Human labels (id column + one column per field): "
                                        "adds each method's accuracy per field on the same records.",
                                        rich_help_panel='Output'),
    id_field: Optional[str] = typer.Option(None, "--id-field", help="Column holding the record id, matched with "
                                           "--gold's id column of the same name (default: row numbers, gold 'id').",
                                           rich_help_panel='Input'),
    permutations: int = _panel(PERMUTATIONS_OPT, 'Model'),
    baseline: Baseline = typer.Option(Baseline.transformers, "--baseline", help="What pcd is compared with: "
                                      "transformers generate on the same model, or llama.cpp's grammar-constrained "
                                      "JSON on the same GGUF (--model x.gguf, default the embedded model's file; "
                                      "needs pip install 'pcd-cli\\[bench]').", rich_help_panel='Baseline'),
    compare_dtype: bool = typer.Option(True, "--compare-dtype/--no-compare-dtype", help="On a CPU with bfloat16 "
                                       "(avx512_bf16) running float32: also label the records in bfloat16 and "
                                       "give both dtypes' speed and agreement (loads the model twice).",
                                       rich_help_panel='Baseline'),
) -> None:
    """Compare pcd with token-by-token generation on the same model, machine and records."""
    from .bench import render_bench, run_bench, write_bench_json
    from .io.readers import InputSpec
    from .schema.load import load_schema

    try:
        parsed = load_schema(schema)
        report = run_bench(parsed, input, InputSpec(text_field=text_field, template=template, limit=n,
                                                    id_field=id_field, csv_delimiter=csv_delimiter), model=model,
                           device=device.value, dtype=dtype.value, max_new_tokens=max_new_tokens,
                           max_tokens_per_pass=max_tokens_per_pass, backend=backend.value, permutations=permutations,
                           baseline=baseline.value, compare_dtype=compare_dtype)
    except PcdError as exc:
        raise _fail(exc) from None
    render_bench(report, out)
    if gold is not None:
        from .bench import gold_accuracy, render_gold_accuracy
        from .quality import read_gold

        try:
            report.summary["gold_accuracy"] = gold_accuracy(report, read_gold(gold, id_field=id_field or "id"), parsed,
                                                            id_field=id_field or "id")
        except PcdError as exc:
            raise _fail(exc) from None
        render_gold_accuracy(report.summary["gold_accuracy"], out)
    if json_out:
        write_bench_json(report, json_out)
        out.print(f"wrote {escape(str(json_out))}", highlight=False)


PLOT_OPT = typer.Option(None, "--plot", help="Write reliability diagrams (PNG) into this folder "
                        "(needs pip install 'pcd-cli\\[plot]').")
OBJECTIVE_OPT = typer.Option("likelihood", "--objective", help=calibrate_objective_help())
FORCE_RULE_OPT = typer.Option(False, "--force-rule", help="Write each field's decision rule even where its gain "
                              "over argmax on held-out folds has a 95 % interval holding zero (by default such a "
                              "field keeps argmax, with a note naming the gain and its interval).")
GOLD_ID_OPT = typer.Option("id", "--id-field", help="Id column of the gold file (and of the predictions, "
                           "else their 'row' column); ids are matched as strings.")


@app.command("eval", short_help="Measure a pcd output against human gold labels (accuracy, F1, calibration, selective prediction).")
def eval_(
    predictions: Path = typer.Argument(..., help="A pcd output Parquet file."),
    gold: Path = typer.Argument(..., help="Human labels: .jsonl/.csv/.parquet with the id column and one column "
                                "per field, or a Label Studio / Argilla export (pcd review)."),
    id_field: str = GOLD_ID_OPT,
    schema: Optional[Path] = typer.Option(None, "--schema", "-s", help="Schema file (default: the fields and "
                                          "labels recorded in the predictions)."),
    target_accuracy: Optional[float] = typer.Option(None, "--target-accuracy", min=0.0, max=1.0,
                                                    help="Also find the probability (and mass) threshold, and "
                                                    "its coverage, that reach this accuracy."),
    error_budget: Optional[float] = typer.Option(None, "--error-budget", min=0.0, max=1.0, help="The share of "
                                                 "rows that can be decided automatically with at most this error "
                                                 "on the gold rows (e.g. 0.05), with its probability threshold: "
                                                 "--target-accuracy 1-E."),
    min_mass: float = typer.Option(0.5, "--min-mass", min=0.0, max=1.0, help="Report the share of rows whose "
                                   "candidate mass is below M (the model wanted to answer off the menu)."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write the report as JSON (shape: docs/quality.md)."),
    plot: Optional[Path] = PLOT_OPT,
    compare: Optional[Path] = typer.Option(None, "--compare", help="Another pcd output of the same records "
                                           "(e.g. before calibration): print both side by side."),
    calibration: Optional[Path] = typer.Option(None, "--calibration", help="A calibration file with decision "
                                               "rules (pcd calibrate --objective): print the figures at argmax "
                                               "and at its rules side by side (an output labelled with rules "
                                               "shows them without it; needs --all-probs)."),
    csv_delimiter: str = CSV_DELIMITER_OPT,
    encoding_errors: EncodingErrors = ENCODING_ERRORS_OPT,
) -> None:
    """Measure a pcd output against human gold labels: accuracy, macro-F1, calibration (ECE,
    Brier, NLL), AUROC and selective prediction, per field. Exit 2 on a bad file."""
    from .quality import evaluate, read_gold, read_predictions
    from .quality.plots import eval_plots, require_matplotlib
    from .quality.render import render_eval
    from .schema.load import load_schema

    if error_budget is not None:
        if target_accuracy is not None:
            raise typer.BadParameter("give --error-budget E or --target-accuracy 1-E, not both", param_hint="--error-budget")
        if error_budget >= 1:
            raise typer.BadParameter("must be at least 0 and below 1", param_hint="--error-budget")
        target_accuracy = 1.0 - error_budget
    if target_accuracy is not None and target_accuracy <= 0:
        raise typer.BadParameter("must be above 0 and at most 1", param_hint="--target-accuracy")
    try:
        if plot is not None:
            require_matplotlib()
        parsed = load_schema(schema) if schema else None
        frame, _ = read_predictions(predictions)
        gold_frame = read_gold(gold, id_field=id_field, csv_delimiter=csv_delimiter,
                               encoding_errors=encoding_errors.value)
        if calibration is not None:
            from .quality import Calibration

            calibration = Calibration.load(calibration)
        report = evaluate(frame, gold_frame, parsed, id_field=id_field, target_accuracy=target_accuracy,
                          min_mass=min_mass, calibration=calibration, error_budget=error_budget)
        out.print(f"scored {escape(str(predictions))} against {escape(str(gold))}", highlight=False)
        render_eval(report, out)
        if compare is not None:
            from .quality.compare import compare as compare_outputs
            from .quality.compare import render_comparison

            baseline, _ = read_predictions(compare)
            render_comparison(compare_outputs(baseline, report, frame, gold_frame, parsed, id_field=id_field,
                                              min_mass=min_mass),
                              out, before_name=compare.name, after_name=predictions.name)
        if json_out:
            write_json(json_out, report.to_dict())
            out.print(f"wrote {escape(str(json_out))}", highlight=False)
        if plot is not None:
            from .quality.plots import eval_plot_name

            said_written(eval_plots(report, plot, eval_plot_name(predictions, gold)), "reliability diagram", plot)
    except PcdError as exc:
        raise _fail(exc) from None


@app.command(short_help="Fit a per-field calibration (temperature, label biases) on gold rows for pcd label --calibration.")
def calibrate(
    gold: Path = typer.Argument(..., help="Human labels: .jsonl/.csv/.parquet with the id column, one column per "
                                "field and (without --predictions) the text; or a Label Studio / Argilla export "
                                "(pcd review)."),
    schema: Path = typer.Option(..., "--schema", "-s", help="Schema file (YAML or JSON)."),
    output: Path = typer.Option(..., "--output", "-o", help="Calibration file to write (JSON)."),
    predictions: Optional[Path] = typer.Option(None, "--predictions", help="An existing pcd output of the gold "
                                               "rows, labelled with --all-probs (then no model is loaded)."),
    folds: int = typer.Option(5, "--folds", min=2, help="Cross-validation folds for the before/after figures."),
    permutations: int = _panel(PERMUTATIONS_OPT, 'Model'),
    isolate_fields: bool = _panel(ISOLATE_FIELDS_OPT, 'Model'),
    record_quoting: Optional[RecordQuoting] = _panel(RECORD_QUOTING_OPT, 'Model'),
    steering_check: bool = _panel(STEERING_CHECK_OPT, 'Model'),
    coverage: Optional[float] = typer.Option(None, "--coverage", min=0.5, max=0.999, help="Also fit conformal "
                                             "label sets holding the gold label with at least this probability "
                                             "(e.g. 0.9); half of the gold rows then set the threshold instead of "
                                             "the calibration. pcd label writes <field>__set."),
    seed: int = typer.Option(0, "--seed", help="Seed of the fold shuffle and of the --examples draw (give "
                             "pcd label the same --seed to draw the same examples)."),
    unlabelled: bool = typer.Option(False, "--unlabelled", help="No gold labels: GOLD is any input file; fit a "
                                    "per-field prior correction (biases -log of the mean predicted label "
                                    "distribution over --sample rows, batch calibration; docs/quality.md)."),
    sample: int = typer.Option(DEFAULT_UNLABELLED_SAMPLE, "--sample", min=1, help="--unlabelled: rows (a seeded "
                               "random sample) the prior is estimated on."),
    objective: str = OBJECTIVE_OPT,
    force_rule: bool = FORCE_RULE_OPT,
    readout: str = typer.Option("logits", "--readout", metavar="[logits|linear]",
                                help="logits: a temperature and label biases on the model's probabilities. "
                                "linear: also logistic regressions per field on the model's hidden "
                                "state at the field's decision point and over the record (the three best "
                                "layer sets and strengths by nested cross-validation, averaged; needs "
                                "scikit-learn; not with --predictions, --coverage or "
                                "--permutations; docs/quality.md)."),
    id_field: str = GOLD_ID_OPT,
    plot: Optional[Path] = PLOT_OPT,
    model: Optional[str] = MODEL_OPT,
    device: Device = DEVICE_OPT,
    dtype: DType = DTYPE_OPT,
    backend: BackendKind = BACKEND_OPT,
    scoring: Scoring = SCORING_OPT,
    text_field: str = TEXT_FIELD_OPT,
    template: Optional[str] = TEMPLATE_OPT,
    csv_delimiter: str = CSV_DELIMITER_OPT,
    max_tokens_per_pass: int = BUDGET_OPT,
    examples: Optional[Path] = EXAMPLES_OPT,
    shots: int = SHOTS_OPT,
    adapter: Optional[Path] = ADAPTER_OPT,
) -> None:
    """Fit a per-field temperature and label biases on gold rows (with --readout linear, also a
    linear readout of the model's hidden state); print cross-validated before/after accuracy,
    macro-F1, ECE and NLL; write CALIBRATION.json for pcd label --calibration. Exit 2 on a bad
    gold, predictions or schema file."""
    from .fitting import calibrate_on_gold
    from .quality.plots import calibration_plots, file_stem, require_matplotlib
    from .quality.render import render_calibration

    def warn_rows(lines: list[str]) -> None:
        for line in lines:
            err.print(f"[yellow]warning:[/] {escape(line)}", highlight=False)

    try:
        if unlabelled:
            _calibrate_unlabelled(locals())
            return
        if plot is not None:
            require_matplotlib()
        job = _label_job(locals(), besides=("id_field",))  # the gold file's id column: calibrate_on_gold's
        run = calibrate_on_gold(gold, schema, job, output=output, predictions=predictions, folds=folds, seed=seed,
                                coverage=coverage, id_field=id_field, csv_delimiter=csv_delimiter,
                                objective=objective, force_rule=force_rule, readout=readout,
                                on_gold_warnings=warn_rows)  # said before the decoding
        for line in run.notes:
            out.print(escape(line), highlight=False)
        warn_rows(run.row_warnings)
        render_calibration(run.report, out)
        for line in run.warnings:
            out.print(f"[yellow]warning:[/] {escape(line)}", highlight=False)
        saved = run.calibration.save(output)
        out.print(f"wrote {escape(str(output))} (sha256 {saved.sha256[:12]}...)", highlight=False)
        if plot is not None:
            said_written(calibration_plots(run.report, plot, file_stem(output)), "before/after reliability diagram",
                          plot)
    except PcdError as exc:
        raise _fail(exc) from None


def _calibrate_unlabelled(options: dict) -> None:
    """``pcd calibrate --unlabelled``: refuse the gold-only options, fit, print, write."""
    from .fitting import calibrate_unlabelled

    refused = [name for name, given in (("--objective", options["objective"] != "likelihood"),
                                        ("--coverage", options["coverage"] is not None),
                                        ("--readout linear", options["readout"] != "logits"),
                                        ("--plot", options["plot"] is not None)) if given]
    if refused:
        raise InputError(f"--unlabelled with {', '.join(refused)}: without gold labels there is no decision rule, "
                         "label set, readout or reliability diagram to fit; drop it, or calibrate on gold rows")
    job = _label_job(options, besides=("id_field",))
    run = calibrate_unlabelled(options["gold"], options["schema"], job, output=options["output"],
                               predictions=options["predictions"], sample=options["sample"], seed=options["seed"],
                               id_field=options["id_field"], csv_delimiter=options["csv_delimiter"])
    for line in run.notes:
        out.print(escape(line), highlight=False)
    for name, fc in run.calibration.fields.items():
        prior = ", ".join(f"{label} {p:.3f}" for label, p in fc.cv["prior"].items())
        out.print(f"{escape(name)}: mean predicted distribution over {fc.n} rows: {escape(prior)}; the correction "
                  f"changes the label of {run.changed.get(name, 0)} of them", highlight=False)
    saved = run.calibration.save(options["output"])
    out.print(f"wrote {escape(str(options['output']))} (sha256 {saved.sha256[:12]}...)", highlight=False)


@app.command(short_help="Train a LoRA adapter on gold rows through the very decisions pcd label reads.")
def tune(
    gold: Path = typer.Argument(..., help="Human labels: .jsonl/.csv/.parquet with the id column, the text and one "
                                "column per field (a missing or null cell leaves that field out of the loss)."),
    schema: Path = typer.Option(..., "--schema", "-s", help="Schema file (YAML or JSON)."),
    output: Path = typer.Option(..., "--output", "-o", help="Folder to write: a model folder for pcd label "
                                "--model (weights merged), or with --adapter-only the adapter for --adapter."),
    model: Optional[str] = MODEL_OPT,
    device: Device = DEVICE_OPT,
    dtype: DType = typer.Option(DType.float32, "--dtype", help="Weights dtype while training (float32 on the "
                                "CPU; bfloat16 on a GPU)."),
    scoring: Scoring = typer.Option(Scoring.marginal, "--scoring", help="The scoring pcd label will read: train "
                                    "what you will read (marginal or exact)."),
    text_field: str = TEXT_FIELD_OPT,
    template: Optional[str] = TEMPLATE_OPT,
    id_field: str = GOLD_ID_OPT,
    csv_delimiter: str = CSV_DELIMITER_OPT,
    examples: Optional[Path] = EXAMPLES_OPT,
    shots: int = SHOTS_OPT,
    holdout: float = typer.Option(0.2, "--holdout", min=0.0, max=0.9, help="Fraction of gold rows held out "
                                  "(stratified on the first field, never trained on) to pick the best epoch."),
    epochs: Optional[int] = typer.Option(None, "--epochs", min=1, help="Passes over the training rows "
                                         "(default: 6 under 200 gold rows, else 3; the holdout picks the epoch)."),
    rank: int = typer.Option(8, "--rank", min=1, help="LoRA rank."),
    lr: float = typer.Option(5e-4, "--lr", min=0.0, help="AdamW learning rate."),
    mass_weight: float = typer.Option(DEFAULT_MASS_WEIGHT, "--mass-weight", min=0.0, help="Weight of the gold "
                                      "label's full-vocabulary NLL added to the loss: keeps the candidate mass "
                                      "(0: the cross-entropy over the labels alone; docs/quality.md)."),
    permutations: int = typer.Option(1, "--permutations", min=1, help="K >= 2: train over the K label orderings "
                                     "that pcd label --permutations K reads (each a loss term); label with the "
                                     "same K."),
    cross_fit: int = typer.Option(0, "--cross-fit", min=0, help="K >= 2: K fold runs give every gold row an "
                                  "out-of-fold prediction; the calibration is fitted on all of them and the written "
                                  "model trains on all rows for the folds' median kept epoch (K + 1 runs; --holdout "
                                  "is not used). 0: one --holdout picks the epoch and fits the calibration "
                                  "(docs/quality.md)."),
    patience: Optional[int] = typer.Option(None, "--patience", min=0, help="Early stopping: end training once "
                                           "this many epochs in a row did not beat the best holdout NLL (0: run "
                                           "every epoch; default 2)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the holdout split, the shuffle, the adapter's "
                             "initialisation and the --examples draw."),
    objective: str = typer.Option("likelihood", "--objective", help=tune_objective_help()),
    force_rule: bool = FORCE_RULE_OPT,
    max_tokens_per_pass: int = BUDGET_OPT,
    adapter_only: bool = typer.Option(False, "--adapter-only", help="Write only the LoRA adapter (apply it with "
                                      "pcd label --adapter DIR on its base --model)."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bar with the loss and ETA."),
) -> None:
    """Train a LoRA adapter (peft) with cross-entropy over each field's labels, scored exactly as
    pcd label reads them (same prompt head, forest and waves), plus --mass-weight times the gold
    label's full-vocabulary NLL; keep the epoch with the best holdout NLL; fit a calibration on
    that epoch's holdout predictions; write a model folder with a pcd-tune.json card and
    pcd-calibration.json (pcd label --model DIR applies it). An earlier pcd tune folder as -o:
    only the files its card lists are replaced, and a folder holding other files is refused.
    Exit 2 on a bad gold file or option, an -o folder holding other files, or a training that
    diverges (NaN or exploding loss, collapsed candidate mass, flat probabilities: nothing is
    written); 3 on a model problem or without peft; 130 if interrupted (the best adapter so far
    is written first)."""
    from .quality.render import render_tune
    from .fitting import tune_on_gold
    from .quality.decision import parse_objective
    from .tune import DEFAULT_PATIENCE, TuneConfig

    def said(notes, row_warnings, config):
        bar.epochs = config.epochs
        for line in notes:
            out.print(escape(line), highlight=False)
        for line in row_warnings:
            err.print(f"[yellow]warning:[/] {escape(line)}", highlight=False)

    bar = TuneProgress(progress, epochs)
    try:
        # --id-field is the gold file's; --scoring, --max-tokens-per-pass and --permutations are TuneConfig's
        job = _label_job(locals(), besides=("id_field", "scoring", "max_tokens_per_pass", "permutations"))
        config = TuneConfig(epochs=epochs or 0, rank=rank, lr=lr, seed=seed, holdout=holdout, scoring=scoring.value,
                            max_tokens_per_pass=max_tokens_per_pass, mass_weight=mass_weight,
                            permutations=permutations, cross_fit=cross_fit,
                            patience=DEFAULT_PATIENCE if patience is None else patience,
                            objective=parse_objective(objective),  # checked before training
                            force_rule=force_rule)
        try:
            run = tune_on_gold(gold, schema, job, output, config, id_field=id_field, csv_delimiter=csv_delimiter,
                               adapter_only=adapter_only, on_step=bar.step, on_epoch=bar.epoch, on_fold=bar.fold,
                               on_notes=said)
        finally:
            bar.close()
    except PcdError as exc:
        raise _fail(exc) from None
    for warning in run.result.warnings:
        err.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False)
    render_tune(run.result, out, calibration=run.calibration, notes=run.calibration_notes)
    out.print(f"wrote {escape(str(output))} (best epoch {run.result.best_epoch}); label with: {escape(run.use)}",
              highlight=False)
    if run.result.interrupted:
        err.print("[yellow]interrupted:[/] the best adapter so far was written", highlight=False)
        raise typer.Exit(130)


class ReviewTarget(str, Enum):
    label_studio = "label-studio"
    argilla = "argilla"
    csv = "csv"


@app.command(short_help="Write the rows a person should check, most uncertain first, for Label Studio, Argilla or "
             "a spreadsheet.")
def review(
    predictions: Path = typer.Argument(..., help="A pcd output Parquet file."),
    input: Path = typer.Argument(..., help="The records it was labelled from (for their text)."),
    to: ReviewTarget = typer.Option(..., "--to", help="label-studio: tasks with pre-annotations (JSON) and "
                                    "<name>.label_config.xml beside them; argilla: a folder in Dataset.to_disk's "
                                    "layout (rg.Dataset.from_disk imports it); csv: a spreadsheet with empty "
                                    "<field>__gold columns to fill."),
    output: Path = typer.Option(..., "--output", "-o", help="File to write (--to argilla: a folder)."),
    below: Optional[float] = typer.Option(None, "--below", min=0.0, max=1.0, help="Only rows where some field's "
                                          "probability is below P."),
    sets: bool = typer.Option(False, "--sets", help="Only rows where some field's label set (<field>__set: pcd "
                              "label --calibration, fitted with --coverage) holds more than one label."),
    sample: Optional[int] = typer.Option(None, "--sample", min=1, help="A random sample of N rows (seeded by "
                                         "--seed), still most uncertain first: rows like the ones a calibration "
                                         "fitted on their answers will be applied to."),
    seed: int = typer.Option(0, "--seed", help="Seed of --sample."),
    top: Optional[int] = typer.Option(None, "--top", min=1, help="At most N rows, the most uncertain."),
    error_budget: Optional[float] = typer.Option(None, "--error-budget", min=0.0, max=0.999, help="With --gold: "
                                                 "per field, the probability threshold above which the gold rows "
                                                 "have at most this error (as pcd eval --error-budget); only rows "
                                                 "where some field is below it go to review, and the share decided "
                                                 "automatically is printed."),
    gold: Optional[Path] = typer.Option(None, "--gold", help="Gold rows of this output (id column + one column "
                                        "per field, or a review export) to fit --error-budget's thresholds on."),
    id_field: str = typer.Option("id", "--id-field", help="Id column of the output and the input (an output "
                                 "without it: its 'row' column, input rows by position)."),
    schema: Optional[Path] = typer.Option(None, "--schema", "-s", help="Schema file (default: the fields and "
                                          "labels recorded in the output)."),
    text_field: str = TEXT_FIELD_OPT,
    template: Optional[str] = TEMPLATE_OPT,
    csv_delimiter: str = CSV_DELIMITER_OPT,
    encoding_errors: EncodingErrors = ENCODING_ERRORS_OPT,
    fmt: Optional[Format] = typer.Option(None, "--format", help="Input format (default: from the extension)."),
    check: Optional[bool] = typer.Option(None, "--check/--no-check", help="Check the files with label-studio-sdk "
                                         "or argilla's own classes (default: when installed; --check: exit 3 "
                                         "without them; pip install 'pcd-cli\\[review]')."),
) -> None:
    """Write the rows of a pcd output a person should check, most uncertain first (the lowest
    probability over the fields), with the model's labels and probabilities as pre-annotations.
    pcd eval, pcd calibrate and --examples read the tool's export back as gold. Exit 2 on a
    bad file or option (--sets on an output without label sets)."""
    from .quality.review import error_budget_thresholds, select_for_review, write_review
    from .schema.load import load_schema

    try:
        if (error_budget is None) != (gold is None):
            raise InputError("--error-budget and --gold go together: the thresholds are fitted on the gold rows")
        if error_budget is not None and below is not None:
            raise InputError("--error-budget fits each field's threshold; give it or --below P, not both")
        parsed = load_schema(schema) if schema else None
        budget = error_budget_thresholds(predictions, gold, budget=error_budget, schema=parsed, id_field=id_field,
                                         csv_delimiter=csv_delimiter) if gold is not None else None
        selection = select_for_review(predictions, input, schema=parsed, id_field=id_field, text_field=text_field,
                                      template=template, csv_delimiter=csv_delimiter,
                                      fmt=fmt.value if fmt else None, below=below, sets=sets, sample=sample,
                                      encoding_errors=encoding_errors.value,
                                      seed=seed, top=top, below_by_field=budget.thresholds if budget else None)
        written, checked = write_review(selection, to.value, output, check=check)
    except PcdError as exc:
        raise _fail(exc) from None
    shown = " and ".join(escape(str(p)) for p in written[:2]) if to is not ReviewTarget.argilla else \
        escape(str(output))
    note = f" (checked with {checked})" if checked else \
        "" if to is ReviewTarget.csv or check is False else " (not checked: pip install 'pcd-cli\\[review]')"
    out.print(f"wrote {len(selection.rows)} of {selection.total} rows, most uncertain first, to {shown}{note}",
              highlight=False)
    for line in selection.warnings:
        err.print(f"[yellow]warning:[/] {escape(line)}", highlight=False)
    if budget is not None:
        render_error_budget(budget, selection)
    if to is ReviewTarget.argilla:
        from .quality.review import argilla_renamed

        renamed = argilla_renamed(selection)
        if renamed:
            out.print("note: Argilla's server accepts lower case names only (letters, digits, _ and -): question "
                      + ", ".join(f"{k!r} is {v!r}" for k, v in renamed.items())
                      + " (its title keeps the field's name; pcd eval reads the answers back under the field)",
                      highlight=False, markup=False)


@app.command(short_help="Serve schemas over HTTP: /v1/label, the Jev and OpenAI decision APIs, one model shared "
             "(pip install 'pcd-cli\\[serve]'; docs/serve.md).")
def serve(
    schema: list[str] = typer.Option(..., "--schema", "-s", help="NAME=PATH (repeatable), a schema file (named by "
                                     "its stem) or a folder of .yaml/.yml/.json schema files."),
    model: Optional[str] = _panel(MODEL_OPT, 'Model'),
    device: Device = _panel(DEVICE_OPT, 'Model'),
    dtype: DType = _panel(DTYPE_OPT, 'Model'),
    backend: BackendKind = _panel(BACKEND_OPT, 'Model'),
    adapter: Optional[Path] = _panel(ADAPTER_OPT, 'Model'),
    scoring: Scoring = _panel(SCORING_OPT, 'Model'),
    max_tokens_per_pass: int = _panel(BUDGET_OPT, 'Model'),
    truncate: Truncate = _panel(TRUNCATE_OPT, 'Model'),
    text_field: str = _panel(TEXT_FIELD_OPT, 'Input'),
    template: Optional[str] = _panel(TEMPLATE_OPT, 'Input'),
    calibration: Optional[list[str]] = typer.Option(None, "--calibration", help="NAME=PATH (repeatable; a bare PATH "
                                                    "with one schema): a `pcd calibrate` file for that schema.",
                                                    rich_help_panel='Quality'),
    no_calibration: bool = _panel(NO_CALIBRATION_OPT, 'Quality'),
    abstain_unless_single: bool = _panel(ABSTAIN_UNLESS_SINGLE_OPT, 'Quality'),
    prior_correction: bool = _panel(PRIOR_CORRECTION_OPT, 'Quality'),
    permutations: int = _panel(PERMUTATIONS_OPT, 'Quality'),
    isolate_fields: bool = _panel(ISOLATE_FIELDS_OPT, 'Quality'),
    record_quoting: Optional[RecordQuoting] = _panel(RECORD_QUOTING_OPT, 'Quality'),
    steering_check: bool = _panel(STEERING_CHECK_OPT, 'Quality'),
    abstain_below: Optional[float] = _panel(ABSTAIN_BELOW_OPT, 'Quality'),
    examples: Optional[list[str]] = typer.Option(None, "--examples", help="NAME=PATH (repeatable; a bare PATH with "
                                                 "one schema): a gold file to draw that schema's few-shot examples "
                                                 "from, as pcd label --examples.", rich_help_panel='Quality'),
    shots: int = _panel(SHOTS_OPT, 'Quality'),
    seed: int = _panel(SEED_OPT, 'Quality'),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (beyond loopback: an API key is "
                             "required).", rich_help_panel='Network'),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="Port (bound before the model loads).",
                             rich_help_panel='Network'),
    api_key: Optional[list[str]] = typer.Option(None, "--api-key", help="Accept this key (repeatable) as "
                                                "'Authorization: Bearer KEY' on every route but /health and /ready; "
                                                "$PCD_API_KEY adds one.", rich_help_panel='Network'),
    api_key_file: Optional[Path] = typer.Option(None, "--api-key-file", help="File of accepted keys, one a line.",
                                                rich_help_panel='Network'),
    allow_public_without_key: bool = typer.Option(False, "--allow-public-without-key", help="Listen beyond "
                                                  "loopback with no API key: anyone who reaches the port may label.",
                                                  rich_help_panel='Network'),
    cors_origin: Optional[list[str]] = typer.Option(None, "--cors-origin", help="Allow this browser origin "
                                                    "(repeatable); no CORS headers without it.", rich_help_panel='Network'),
    max_body_bytes: int = typer.Option(L.MAX_BODY_BYTES, "--max-body-bytes", min=1024, help="Largest request body; larger is "
                                       "413, refused before it is read whole.", rich_help_panel='Limits'),
    max_records_per_request: int = typer.Option(L.MAX_RECORDS_PER_REQUEST, "--max-records-per-request", min=1, help="Most records (or "
                                                "questions) one request queues; more is 413 (Label Studio's /predict, "
                                                "which cannot split: queued in slices of this many).",
                                                rich_help_panel='Limits'),
    max_queued_records: int = typer.Option(L.MAX_QUEUED_RECORDS, "--max-queued-records", min=1, help="Records waiting beyond which "
                                           "a request gets 429 with Retry-After.", rich_help_panel='Limits'),
    max_queued_requests: int = typer.Option(L.MAX_QUEUED_REQUESTS, "--max-queued-requests", min=1, help="Requests waiting beyond "
                                            "which a request gets 429 with Retry-After.", rich_help_panel='Limits'),
    request_timeout_s: float = typer.Option(L.REQUEST_TIMEOUT_S, "--request-timeout-s", min=0.1, help="A request not answered "
                                            "this long after it arrived gets 503 (the default is below the 100 s Label "
                                            "Studio waits for /predict).", rich_help_panel='Limits'),
    shutdown_timeout_s: float = typer.Option(30.0, "--shutdown-timeout-s", min=0.0, help="On SIGTERM, how long "
                                             "queued and running requests may take to finish.", rich_help_panel='Limits'),
    max_batch_records: int = typer.Option(L.MAX_BATCH_RECORDS, "--max-batch-records", min=1, help="Most records of concurrent "
                                          "requests packed into one decode call.", rich_help_panel='Limits'),
    max_cached_schemas: int = typer.Option(L.MAX_CACHED_SCHEMAS, "--max-cached-schemas", min=1, help="Question sets (Jev, OpenAI) "
                                           "kept compiled, least recently used out.", rich_help_panel='Limits'),
    allowed_host: Optional[list[str]] = typer.Option(None, "--allowed-host", help="Also answer requests whose Host "
                                                     "is this name (repeatable; '*': any Host). On loopback only "
                                                     "loopback names are answered without it (DNS rebinding): 421.",
                                                     rich_help_panel='Network'),
    read_timeout_s: Optional[float] = typer.Option(None, "--read-timeout-s", min=0.1, help="Most seconds to receive "
                                                   "a request's headers (from their first byte) and, separately, its "
                                                   "body; past it 408. Default: --request-timeout-s.",
                                                   rich_help_panel='Limits'),
    max_header_bytes: int = typer.Option(L.MAX_HEADER_BYTES, "--max-header-bytes", min=1024, help="Largest request line and "
                                         "header block; larger is 431.", rich_help_panel='Limits'),
    max_connections: int = typer.Option(L.MAX_CONNECTIONS, "--max-connections", min=1, help="Most open connections; one more is "
                                        "answered 503 and closed.", rich_help_panel='Limits'),
    max_compile_cost: int = typer.Option(L.MAX_COMPILE_COST, "--max-compile-cost", min=1, help="Most estimated label tokens "
                                         "(options x tokens) of a question set compiled for a request; more is 413.",
                                         rich_help_panel='Limits'),
    packing: bool = typer.Option(True, "--packing/--no-packing", help="Pack records of concurrent requests into "
                                 "shared forward passes (--no-packing: one request per decode call, a baseline).",
                                 rich_help_panel='Limits'),
    engine: Engine = typer.Option(Engine.local, "--engine", help="local: this process; ray: --replicas replicas "
                                  "behind Ray Serve's router, each with its own model (docs/ray.md).",
                                  rich_help_panel='Network'),
    replicas: Optional[int] = typer.Option(None, "--replicas", min=1, help="Replicas on Ray Serve (--engine ray; "
                                           "default 1); each loads the model and packs its own requests.",
                                           rich_help_panel='Network'),
    label_studio: bool = typer.Option(False, "--label-studio", help="Also serve as a Label Studio ML backend "
                                      "(/setup, /predict, /webhook, /train, /versions): pre-label tasks, journal "
                                      "annotations as gold, retrain and swap in a model not worse (docs/review.md).",
                                      rich_help_panel='Label Studio'),
    label_studio_url: Optional[str] = typer.Option(None, "--label-studio-url", help="Label Studio's URL for its API "
                                                   "(default: the hostname its /setup sends).",
                                                   rich_help_panel='Label Studio'),
    retrain_every: int = typer.Option(0, "--retrain-every", min=0, help="Retrain after this many new gold rows "
                                      "(0: only on Label Studio's train button).", rich_help_panel='Label Studio'),
    tune_from_rows: int = typer.Option(200, "--tune-from-rows", min=1, help="Gold rows from which a retrain runs "
                                       "pcd tune (fewer: pcd calibrate).", rich_help_panel='Label Studio'),
    state_dir: Optional[Path] = typer.Option(None, "--state-dir", help="Folder of the gold journals and model "
                                             "versions (default ~/.cache/pcd/serve-state).",
                                             rich_help_panel='Label Studio'),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Log only warnings and errors."),
) -> None:
    """Serve SCHEMAS over HTTP until SIGTERM: the model loads once and every schema shares it.

    Examples:

      pcd serve --schema tickets=schemas/support_triage.yaml

      PCD_API_KEY=secret pcd serve --schema schemas/ --host 0.0.0.0 --port 8080

    SIGTERM or Ctrl-C drains: /ready answers 503, new work 503, queued requests finish (at most
    --shutdown-timeout-s), exit 0. Exit codes: 2 bad option or schema (or a public --host without a
    key); 3 model or compile problem, or the server extra missing.
    """
    from .server.command import need_extra, serve_command

    try:
        need_extra()
        from .server.config import AppConfig
        from .server.service import ServiceConfig

        job = _label_job(locals(), besides=("calibration", "examples"))  # NAME=PATH lists: serve_command's
        if no_calibration and calibration:
            raise InputError("--calibration and --no-calibration exclude each other: choose one")
        code = serve_command(
            schemas=schema, job=job, calibration=calibration or [], examples=examples or [], host=host,
            port=port, keys=api_key or [], key_file=api_key_file, allow_public_without_key=allow_public_without_key,
            cors_origins=cors_origin or [], quiet=quiet, shutdown_timeout_s=shutdown_timeout_s,
            engine=engine.value, replicas=replicas, label_studio=label_studio, label_studio_url=label_studio_url,
            retrain_every=retrain_every, tune_from_rows=tune_from_rows, state_dir=state_dir,
            service_config=ServiceConfig(packing=packing, max_batch_records=max_batch_records,
                                         max_queued_records=max_queued_records,
                                         max_queued_requests=max_queued_requests, max_cached_schemas=max_cached_schemas,
                                         request_timeout_s=request_timeout_s, max_compile_cost=max_compile_cost),
            app_config=AppConfig(max_body_bytes=max_body_bytes, max_records_per_request=max_records_per_request,
                                 request_timeout_s=request_timeout_s, read_timeout_s=read_timeout_s,
                                 max_header_bytes=max_header_bytes, max_connections=max_connections,
                                 allowed_hosts=tuple(allowed_host or ())))
    except PcdError as exc:
        raise _fail(exc) from None
    raise typer.Exit(code)


if __name__ == "__main__":  # pragma: no cover
    app()
