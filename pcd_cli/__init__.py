"""pcd: batch labelling with parallel constrained decoding.

``Labeler`` is the entry point (see ``pcd_cli.api``); ``pcd`` is the command line over it.
"""

__version__ = "0.1.0"

from .api import Labeler  # noqa: E402
from .decode import FieldResult, Record, RecordFailure, RecordResult  # noqa: E402
from .schema import Schema, load_schema  # noqa: E402

__all__ = ["Labeler", "Record", "RecordResult", "RecordFailure", "FieldResult", "Schema", "load_schema",
           "__version__"]
