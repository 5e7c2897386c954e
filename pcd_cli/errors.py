"""One exception type per pipeline layer.

Every message says what went wrong, where (file, record, field, label) and, where there is
one, how to fix it. The CLI maps these to exit codes: ``SchemaError`` -> 2, ``InputError``
-> 2, ``ModelError`` -> 3, ``CompileError`` -> 3. ``RecordError`` is per record: the record
goes to the errors file and the run goes on.
"""


class PcdError(Exception):
    """Base class of every error pcd raises on purpose."""


class SchemaError(PcdError, ValueError):
    """The schema file is unreadable or invalid (names the field and the problem)."""


class InputError(PcdError, ValueError):
    """An input file or an option about it is unusable as a whole (wrong format, missing column)."""


class RecordError(PcdError, ValueError):
    """One record cannot be labelled (missing text, tokenizer seam broken); the run continues."""


class ModelError(PcdError, RuntimeError):
    """The model or tokenizer cannot be loaded or cannot express the schema."""


class CompileError(PcdError, RuntimeError):
    """The schema cannot be compiled for this tokenizer (a label needs a token the model lacks)."""
