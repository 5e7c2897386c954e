"""How the ``pcd`` commands talk: the consoles, the JSON log, the run reporter, the exit-code
rules of ``pcd label``, progress bars and end-of-run summaries. ``pcd_cli.cli`` declares the
commands and their options; each command body calls one library function and renders its
result with what is here.
"""

from __future__ import annotations

import datetime as _dt
import shlex
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import orjson
import typer
import typer.core
from rich.console import Console
from rich.markup import escape

from .errors import (
    EXIT_CODES,
    Interrupted,
    MachineError,
    NothingLabelled,
    PcdError,
    TooManyErrors,
    exit_code,
)

err = Console(stderr=True, soft_wrap=True)  # messages stay whole lines (cron mail, grep)
out = Console()

#: Exit code of an unexpected internal exception (a bug), apart from 1 (--max-errors).
EXIT_INTERNAL = 4
#: Exit code when the machine could not do it (no space left, read-only folder, permission
#: denied, I/O error, file too large): not a bug, and not a bad option either.
EXIT_MACHINE = EXIT_CODES[MachineError]
#: Exit code when standard output or error was closed by its reader (128 + SIGPIPE, as the
#: shell reports a tool killed by SIGPIPE).
EXIT_BROKEN_PIPE = 141


def _quiet_after_broken_pipe() -> None:
    """Point stdout and stderr at /dev/null so that Python's flush at exit does not complain
    again (the recipe in the ``signal`` module's docs, "Note on SIGPIPE")."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        try:
            os.dup2(devnull, stream.fileno())
        except (OSError, ValueError):
            pass


def _json_log_requested(args: list[str]) -> bool:
    """Whether the command line asks for ``--log-format json`` (read raw: parsing may have failed)."""
    return "--log-format=json" in args or any(a == "--log-format" and b == "json" for a, b in zip(args, args[1:]))


def _log_json(level: str, event: str, fields: dict) -> None:
    line = {"time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "level": level,
            "event": event, **fields}
    sys.stderr.write(orjson.dumps(line, default=str).decode() + "\n")
    sys.stderr.flush()


try:  # typer >= 0.20 carries its own copy of click
    from typer._click.exceptions import ClickException as _ClickException
    from typer._click.exceptions import UsageError as _UsageError
except ImportError:  # pragma: no cover - older typer on click
    from click import ClickException as _ClickException
    from click import UsageError as _UsageError


class Group(typer.core.TyperGroup):
    """Usage errors as one JSON line when ``--log-format json`` is on the command line; an
    unexpected exception as exit 4 with a one-line message (traceback in the JSON log)."""

    def invoke(self, ctx):
        args = [*getattr(ctx, "_protected_args", getattr(ctx, "protected_args", [])), *ctx.args]
        as_json = _json_log_requested(args)
        try:
            return super().invoke(ctx)
        except _UsageError as exc:
            _nearest_options(exc)
            if not as_json:
                raise
            _log_json("error", "usage_error", {"message": exc.format_message(), "exit_code": exc.exit_code})
            raise typer.Exit(exc.exit_code) from None
        except (typer.Exit, typer.Abort, _ClickException, KeyboardInterrupt):
            raise
        except BrokenPipeError:  # `pcd ... | head`: the reader left; end quietly, as Unix tools do
            _quiet_after_broken_pipe()
            raise typer.Exit(EXIT_BROKEN_PIPE) from None
        except OSError as exc:  # the machine, not pcd: no space, read-only folder, permission, I/O
            from .io.files import machine_error

            message = str(exc if isinstance(exc, MachineError) else machine_error(exc, None, "cannot do it"))
            if as_json:
                _log_json("error", "machine_error", {"message": message, "exit_code": EXIT_MACHINE})
            else:
                err.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
            raise typer.Exit(EXIT_MACHINE) from None
        except Exception as exc:  # noqa: BLE001 - the last line of defence: a bug, reported as one
            import traceback

            message = (f"internal error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}; "
                       "this is a bug in pcd, please report it")
            if as_json:
                _log_json("error", "internal_error", {"message": message, "exit_code": EXIT_INTERNAL,
                                                      "traceback": traceback.format_exc()})
            else:
                err.print(f"[bold red]error:[/] {escape(message)} (--log-format json shows the traceback)",
                          highlight=False)
            raise typer.Exit(EXIT_INTERNAL) from None


def _nearest_options(exc) -> None:
    """A mistyped option suggests the real ones it starts, then the closest by spelling
    (``--id`` -> ``--id-field``; click alone offered ``--seed``)."""
    import difflib

    name, ctx = getattr(exc, "option_name", None), getattr(exc, "ctx", None)
    if not name or ctx is None or not hasattr(exc, "possibilities"):
        return
    opts = [o for param in ctx.command.params for o in (*param.opts, *param.secondary_opts) if o.startswith("--")]
    prefixed = [o for o in opts if o.startswith(name)]
    exc.possibilities = prefixed[:4] or difflib.get_close_matches(name, opts, n=3, cutoff=0.6)



#: Events ``--quiet`` never drops from the JSON log: the run's machine-readable summary (a cron
#: job's only record of what a quiet run did; issue #45).
SUMMARY_EVENTS = frozenset({"done"})


class Reporter:
    """Messages of a run: rich text, or one JSON object per line on stderr (``--log-format json``).

    ``quiet`` drops the ``info`` events (checkpoints, notes) but never a warning, an error or, in
    the JSON log, the summary (``SUMMARY_EVENTS``)."""

    def __init__(self, log_format: str, quiet: bool):
        self.json = str(getattr(log_format, "value", log_format)) == "json"
        self.quiet = quiet

    def __call__(self, event: str, fields: dict, level: str = "info") -> None:
        if self.json:
            if level != "info" or not self.quiet or event in SUMMARY_EVENTS:
                _log_json(level, event, fields)
            return
        if event == "resumed":
            text = f"resuming: {fields['rows']} rows were done by an earlier run ({fields['work_dir']})"
        elif "reason" in fields or "message" in fields:
            text = fields.get("message") or fields["reason"]
        else:
            return  # checkpoints show in the progress bar; the summary is rendered by the caller
        if level == "info" and self.quiet:
            return
        style = {"error": "[bold red]error:[/] ", "warning": "[yellow]warning:[/] "}.get(level, "")
        err.print(style + escape(text), highlight=False)


def resume_command() -> str:
    args = [a for a in sys.argv[1:]]
    return shlex.join(["pcd", *args, *([] if "--resume" in args else ["--resume"])])



@contextmanager
def label_errors(report: Reporter, output: Optional[Path], local: bool):
    """``pcd label``'s failures as their messages and exit codes (1, 2, 3, 130, ...); ``local``:
    the local engine (resumable), else Ray (rerun whole)."""
    from .engines.checkpoint import work_dir_for

    try:
        yield
    except Interrupted as exc:
        report("interrupted", {"message": f"{exc}; the finished batches are kept in {exc.work_dir}. "
                               f"Resume with: {resume_command()}", "rows": exc.stats.read,
                               "exit_code": exit_code(exc)}, "error")
        raise typer.Exit(130) from None
    except KeyboardInterrupt:  # a second signal: stopped at once; the committed batches are safe
        from .engines.local import stage_outputs

        kept = work_dir_for(stage_outputs(output, None, None)[0]) if local and output else None  # -o s3://: staged
        message = (f"stopped at once by a second signal; the finished batches are kept in {kept}. "
                   f"Resume with: {resume_command()}") if local and output else \
            "interrupted; nothing was written (a Ray run is rerun whole)"
        report("interrupted", {"message": message, "exit_code": 130}, "error")
        raise typer.Exit(130) from None
    except TooManyErrors as exc:
        message = (f"{exc}. The finished batches are kept in {exc.work_dir}; fix the input and run again, or "
                   "continue with --resume and a higher --max-errors.") if local else \
            f"{exc}; an earlier {output}, if any, was left as it was"
        report("too_many_errors", {"message": message, "failed": exc.stats.failures,
                                   "exit_code": exit_code(exc)}, "error")
        raise typer.Exit(1) from None
    except NothingLabelled as exc:
        report("error", {"message": f"{exc}; an earlier {output}, if any, was left as it was",
                         "failed": exc.stats.failures, "exit_code": exit_code(exc)}, "error")
        raise typer.Exit(1) from None
    except PcdError as exc:
        report("error", {"message": str(exc), "exit_code": exit_code(exc)}, "error")
        raise typer.Exit(exit_code(exc)) from None



def label_done(report: Reporter, stats, input: Path, output: Path, errors: Path, quiet: bool, *,
          id_field: str | None, id_detected: bool, notes: list[str] | tuple[str, ...] = ()) -> None:
    """The end of a finished ``pcd label`` run: the summary, where the ids came from, the notes
    (``JobRun.notes``), the warnings."""
    ids = (f"ids from the {id_field!r} column" if id_field else "ids are row numbers (column 'row')") + (
        "; --row-ids numbers the rows instead" if id_detected else "")
    if report.json:
        report("done", {"output": str(output), "errors": str(errors) if stats.failures else None,
                        "id_column": id_field or "row", **stats.to_dict()})
    elif not quiet:
        stats.render(out)
        out.print(f"wrote {stats.records} rows to {escape(str(output))} ({ids})", highlight=False)
    for note in notes:
        report("note", {"message": note}, "info")
    if stats.read == 0:
        report("warning", {"message": f"{input} has no rows; wrote an empty {output}"}, "warning")
    if stats.failures:
        report("warning", {"message": f"{stats.failures} rows failed; see {errors}"}, "warning")
    if stats.replaced is not None and stats.replaced.count:
        report("warning", {"message": stats.replaced.message(), "replaced_rows": stats.replaced.count}, "warning")
    if stats.repeated_ids.count:
        report("warning", {"message": stats.repeated_ids.message(), "repeated_ids": stats.repeated_ids.count},
               "warning")
    for warning in stats.one_label_warnings():
        report("warning", {"message": warning}, "warning")



class TuneProgress:
    """A tqdm bar per epoch (optimiser steps, loss, ETA) on stderr, and one line per epoch."""

    def __init__(self, enabled: bool, epochs: int):
        self.enabled, self.epochs, self.bar = enabled, epochs, None

    def step(self, done: int, total: int, loss: float) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="step", leave=False, file=sys.stderr, dynamic_ncols=True)
        self.bar.set_postfix(loss=f"{loss:.3f}")
        self.bar.update(1)

    def fold(self, run: int, runs: int, train_rows: int, holdout_rows: int, epochs: int) -> None:
        self.close()
        self.epochs = epochs
        what = (f"fold {run} of {runs - 1}: {train_rows} training rows, {holdout_rows} held out" if run < runs else
                f"final run: all {train_rows} rows, {epochs} epochs (the folds' median)")
        err.print(f"cross-fit run {run}/{runs}: {what}", highlight=False)

    def epoch(self, log) -> None:
        self.close()
        scores = "  ".join(f"{name}: acc {s.accuracy:.3f} nll {s.nll:.3f}" for name, s in log.holdout.items()
                           if s.accuracy is not None)
        loss = f"train loss {log.train_loss:.3f}  " if log.train_loss is not None else "before training  "
        err.print(f"epoch {log.epoch}/{self.epochs}  {loss}holdout {scores or '(none)'}  ({log.seconds:.0f} s)",
                  highlight=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None



def said_written(files: list, what: str, folder: Path) -> None:
    """Say how many plot files were written into ``folder``, and their names."""
    names = ", ".join(Path(f).name for f in files)
    out.print(f"wrote {len(files)} {what}{'s' * (len(files) != 1)} to {escape(str(folder))}"
              + (f": {escape(names)}" if names else ""), highlight=False)


def write_json(path: Path, value: dict) -> None:
    from .io.files import write_atomic

    write_atomic(path, orjson.dumps(value, option=orjson.OPT_INDENT_2) + b"\n")


def render_error_budget(budget, selection) -> None:
    """``pcd review --error-budget``: each field's fitted threshold and gold coverage, then the
    share of the output's rows decided automatically (every field at or above its threshold); a
    field below the floor for the budget is said first (its rows all go to review)."""
    for line in getattr(budget, "warnings", ()):
        out.print(f"[yellow]warning:[/] {escape(line)}: no threshold is fitted, every row of this field goes to review",
                  highlight=False)
    for name, threshold in budget.thresholds.items():
        if threshold is None:
            out.print(f"  {escape(name)}: no threshold keeps the error at or below {budget.budget:g} on its "
                      f"{budget.gold_rows[name]} gold rows: every row goes to review", highlight=False)
        else:
            out.print(f"  {escape(name)}: probability >= {threshold:.3f} (gold rows: error <= {budget.budget:g} on "
                      f"{budget.coverage[name]:.0%} of {budget.gold_rows[name]})", highlight=False)
    auto = selection.total - selection.selected
    share = auto / selection.total if selection.total else 0.0
    out.print(f"error budget {budget.budget:g}: {auto} of {selection.total} rows ({share:.1%}) can be decided "
              f"automatically; {selection.selected} go to review", highlight=False)
