"""The ``pcd`` command line: parses options, calls the Python API, formats. No logic here.

Exit codes: 0 done; 1 no record could be labelled; 2 bad schema, input or option;
3 model or compile problem.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape

from . import __version__
from .decode import DEFAULT_MAX_TOKENS_PER_PASS
from .errors import CompileError, InputError, ModelError, PcdError, SchemaError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Label records with closed schemas (booleans, enums) using parallel constrained decoding.")
err = Console(stderr=True)
out = Console()

EXIT_CODES = {SchemaError: 2, InputError: 2, ModelError: 3, CompileError: 3}


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


class Format(str, Enum):
    jsonl = "jsonl"
    csv = "csv"
    parquet = "parquet"


MODEL_OPT = typer.Option(None, "--model", "-m", help="transformers model id, local model folder or .gguf file "
                         "(default: the embedded SmolLM2-135M-Instruct).")
DEVICE_OPT = typer.Option(Device.auto, "--device", help="Where to run the model.")
DTYPE_OPT = typer.Option(DType.auto, "--dtype", help="Weights dtype (auto: float32 on CPU).")
SCORING_OPT = typer.Option(Scoring.marginal, "--scoring", help="marginal: follow each label until it is identified; "
                           "exact: score every label to the end of its line.")
BUDGET_OPT = typer.Option(DEFAULT_MAX_TOKENS_PER_PASS, "--max-tokens-per-pass", min=16, help="Token budget of one forward pass "
                          "(bounds memory; records are packed up to it).")


def _fail(exc: PcdError) -> typer.Exit:
    err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
    return typer.Exit(next((code for cls, code in EXIT_CODES.items() if isinstance(exc, cls)), 1))


def _version(value: bool) -> None:
    if value:
        out.print(f"pcd {__version__}")
        raise typer.Exit()


@app.callback()
def main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                      help="Print the version and exit.")) -> None:
    """pcd: fast, typed, calibrated-where-measured labels from a local LLM."""


@app.command()
def label(
    input: Path = typer.Argument(..., help="Input file: .jsonl, .csv or .parquet."),
    schema: Path = typer.Option(..., "--schema", "-s", help="Schema file (YAML or JSON)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Output Parquet file "
                                          "(default: <input stem>.labels.parquet next to the input)."),
    model: Optional[str] = MODEL_OPT,
    device: Device = DEVICE_OPT,
    dtype: DType = DTYPE_OPT,
    scoring: Scoring = SCORING_OPT,
    fmt: Optional[Format] = typer.Option(None, "--format", help="Input format (default: from the extension)."),
    text_field: str = typer.Option("text", "--text-field", help="Column holding the text."),
    template: Optional[str] = typer.Option(None, "--template", help="Compose the text from columns, "
                                           "e.g. 'Subject: {subject}\\n\\n{body}'."),
    id_field: Optional[str] = typer.Option(None, "--id-field", help="Column holding the record id "
                                           "(default: row numbers from 0, column 'row')."),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="Label only the first N rows."),
    all_probs: bool = typer.Option(False, "--all-probs", help="Add <field>__probs (label -> probability) columns."),
    trace: Optional[Path] = typer.Option(None, "--trace", help="Write one JSON line per record and field "
                                         "with the context, lines, probabilities and mass."),
    errors: Optional[Path] = typer.Option(None, "--errors", help="Where failed records go "
                                          "(default: <output stem>.errors.jsonl)."),
    min_mass: float = typer.Option(0.5, "--min-mass", min=0.0, max=1.0, help="Report fields whose candidate "
                                   "mass is below this."),
    max_tokens_per_pass: int = BUDGET_OPT,
    progress: Optional[bool] = typer.Option(None, "--progress/--no-progress", help="Progress bar "
                                            "(default: only on a terminal)."),
) -> None:
    """Label every record of INPUT with SCHEMA and write a Parquet file."""
    from .api import Labeler
    from .io import InputSpec, detect_format
    from .job import default_errors, default_output, id_column, label_file
    from .schema import load_schema

    try:
        spec = InputSpec(text_field=text_field, template=template, id_field=id_field, limit=limit)
        parsed = load_schema(schema)
        parsed.check_output_columns(id_column(spec))
        for warning in parsed.warnings:
            err.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False)
        if not input.is_file():
            raise InputError(f"{str(input)!r}: no such input file")
        detect_format(input, fmt.value if fmt else None)
        output = output or default_output(input)
        if output.is_dir():
            raise InputError(f"-o {str(output)!r} is a folder; give a file name, e.g. "
                             f"{str(output / default_output(input).name)!r}")
        if output.suffix.lower() not in (".parquet", ".pq"):
            err.print(f"[yellow]warning:[/] {escape(str(output))}: pcd writes Parquet whatever the extension",
                      highlight=False)
        errors = errors or default_errors(output)
        labeler = Labeler(parsed, model=model, device=device.value, dtype=dtype.value, scoring=scoring.value,
                          max_tokens_per_pass=max_tokens_per_pass, trace=trace is not None)
        stats = label_file(labeler, input, spec, output=output, errors_path=errors,
                           fmt=fmt.value if fmt else None, trace_path=trace, all_probs=all_probs,
                           min_mass=min_mass, progress=progress)
    except PcdError as exc:
        raise _fail(exc) from None
    stats.render(out)
    out.print(f"wrote {stats.records} rows to {escape(str(output))}", highlight=False)
    if stats.failures:
        err.print(f"[yellow]warning:[/] {stats.failures} records failed; see {escape(str(errors))}", highlight=False)
    if stats.records == 0 and stats.failures:
        raise typer.Exit(1)


@app.command("inspect-schema")
def inspect_schema(
    schema: Path = typer.Argument(..., help="Schema file (YAML or JSON)."),
    model: Optional[str] = MODEL_OPT,
    scoring: Scoring = SCORING_OPT,
) -> None:
    """Probe the model's tokenizer for label collisions, long labels and layout traps."""
    from .inspect import inspect, render_inspection
    from .schema import load_schema

    try:
        parsed = load_schema(schema)
        report = inspect(parsed, model=model, scoring=scoring.value)
    except PcdError as exc:
        raise _fail(exc) from None
    render_inspection(report, out)


@app.command()
def bench(
    schema: Path = typer.Option(..., "--schema", "-s", help="Schema file."),
    input: Path = typer.Option(..., "--input", "-i", help="Records (.jsonl/.csv/.parquet, 'text' column)."),
    n: int = typer.Option(5, "--n", min=1, help="Records to run."),
    model: Optional[str] = MODEL_OPT,
    device: Device = DEVICE_OPT,
    dtype: DType = DTYPE_OPT,
    text_field: str = typer.Option("text", "--text-field", help="Column holding the text."),
    template: Optional[str] = typer.Option(None, "--template", help="Compose the text from columns, "
                                           "e.g. 'Subject: {subject}\\n\\n{body}'."),
    max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens", help="Cap on generated tokens "
                                                 "(default: twice a complete answer object's tokens + 32)."),
    max_tokens_per_pass: int = BUDGET_OPT,
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write per-record rows and the summary as JSON."),
) -> None:
    """Compare pcd with token-by-token generation on the same model, machine and records."""
    from .bench import render_bench, run_bench, write_bench_json
    from .io import InputSpec
    from .schema import load_schema

    try:
        parsed = load_schema(schema)
        report = run_bench(parsed, input, InputSpec(text_field=text_field, template=template, limit=n), model=model,
                           device=device.value, dtype=dtype.value, max_new_tokens=max_new_tokens,
                           max_tokens_per_pass=max_tokens_per_pass)
    except PcdError as exc:
        raise _fail(exc) from None
    render_bench(report, out)
    if json_out:
        write_bench_json(report, json_out)
        out.print(f"wrote {escape(str(json_out))}", highlight=False)


if __name__ == "__main__":  # pragma: no cover
    app()
