"""pcd: batch labelling with parallel constrained decoding.

``Labeler`` is the entry point (see ``pcd_cli.api``); ``pcd`` is the command line over it.
"""

from .api import Labeler
from .results import FieldResult, Record, RecordFailure, RecordResult
from .schema.load import load_schema
from .schema.model import Schema
from .version import __version__

__all__ = ["Labeler", "Record", "RecordResult", "RecordFailure", "FieldResult", "Schema", "load_schema",
           "__version__"]
