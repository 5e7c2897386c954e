"""One exception type per pipeline layer.

Every message says what went wrong, where (file, record, field, label) and, where there is
one, how to fix it. The CLI maps these to exit codes: ``SchemaError`` -> 2, ``InputError``
-> 2, ``CalibrationError`` -> 2, ``ModelError`` -> 3, ``MissingExtra`` -> 3, ``CompileError`` -> 3, ``TooManyErrors`` and ``NothingLabelled``
-> 1, ``EngineError`` -> 1, ``MachineError`` (and any other ``OSError``) -> 5, ``Interrupted`` and ``TuneInterrupted`` -> 130;
any other exception is a bug -> 4 (``pcd_cli.cli``).
``RecordError`` is per record: the record goes to the errors file and the run goes on.
"""


class PcdError(Exception):
    """Base class of every error pcd raises on purpose."""


class SchemaError(PcdError, ValueError):
    """The schema file is unreadable or invalid (names the field and the problem)."""


class InputError(PcdError, ValueError):
    """An input file or an option about it is unusable as a whole (wrong format, missing column)."""


class StoreError(InputError):
    """The object store holding an input or output refused or failed (no credentials, access
    denied, an unreachable endpoint, no such bucket or key): one line naming the URI and the fix
    (``pcd_cli.io.storage.store_error``). Before the run starts it is the input's fault (exit 2);
    once the run has started the engines turn it into a ``MachineError`` (exit 5) that says how to
    go on (``pcd_cli.io.storage.run_started``).

    Attributes:
        brief: the message without the store's own words (``detail``), for the mid-run line.
        detail: the store's own words (pyarrow's message), or ``""``.
    """

    def __init__(self, message: str, brief: str | None = None, detail: str = ""):
        super().__init__(message)
        self.brief, self.detail = brief or message, detail

    def __reduce__(self):  # whole across processes (a Ray worker's read failing)
        return type(self), (str(self), self.brief, self.detail)


class CalibrationError(SchemaError):
    """A calibration file is unreadable, invalid, or made for another model, schema, prompt head
    or scoring mode; or calibration cannot be fitted on the rows given (names the key or field)."""


class MissingExtra(PcdError, ImportError):
    """An optional part of pcd is not installed (the message gives the ``pip install`` line)."""


class RecordError(PcdError, ValueError):
    """One record cannot be labelled (missing text, tokenizer seam broken); the run continues."""


class ModelError(PcdError, RuntimeError):
    """The model or tokenizer cannot be loaded or cannot express the schema."""


class CompileError(PcdError, RuntimeError):
    """The schema cannot be compiled for this tokenizer (a label needs a token the model lacks)."""


class EngineError(PcdError, RuntimeError):
    """The engine running the job failed as a whole: the Ray cluster cannot be reached, or a
    worker died more often than its retries allow. Nothing was written."""


class MachineError(PcdError, OSError):
    """The machine could not do it: no space left, a read-only or vanished folder, permission
    denied, an I/O error, a file too large. Names the path and the system's reason; nothing
    half-written is left behind (``pcd_cli.io.files``). Not a bug in pcd: exit 5, not 4."""


class RunStopped(PcdError):
    """A run stopped before the end of its input; its finished batches are kept for ``--resume``.

    Attributes:
        stats: the run's statistics so far (``pcd_cli.engines.summary.RunStats``).
        work_dir: the folder holding the finished batches.
    """

    def __init__(self, message: str, stats, work_dir):
        super().__init__(message)
        self.stats = stats
        self.work_dir = work_dir


class TooManyErrors(RunStopped):
    """More records failed than ``--max-errors`` allows."""


class Interrupted(RunStopped):
    """SIGINT or SIGTERM arrived; the current batch was finished and committed."""


class NothingLabelled(RunStopped):
    """Every row failed: the errors file is written, an earlier output is left as it was."""


class TuneInterrupted(PcdError):
    """Ctrl-C while ``pcd tune --cross-fit`` ran its fold runs: there is no model to write yet,
    so nothing is written (exit 130, as ``Interrupted``)."""


#: Exit status for an error pcd raised on purpose, by class (the first that matches); any other
#: ``PcdError`` (``TooManyErrors``, ``NothingLabelled``, ``EngineError``) exits 1.
EXIT_CODES: dict[type, int] = {Interrupted: 130, TuneInterrupted: 130, SchemaError: 2, InputError: 2, ModelError: 3, CompileError: 3,
                               MissingExtra: 3, MachineError: 5}


def exit_code(exc: PcdError) -> int:
    """The process exit status for ``exc`` (``EXIT_CODES``; 1 when no class matches)."""
    return next((code for cls, code in EXIT_CODES.items() if isinstance(exc, cls)), 1)
