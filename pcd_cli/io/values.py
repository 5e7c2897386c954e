"""Cell values -> record texts and ids: one rule for the file readers and for ``Labeler.label``.

A text (the text field, or a column a ``--template`` names) must be a string; numbers and
booleans are accepted and read in their JSON spelling (``7``, ``7.5``, ``true``), never in
Python's (``True``); a list or an object fails its row with a message naming the column
and the type. Ids follow the same rule: strings as they are, numbers and booleans in their
JSON spelling, anything else fails the row. The JSON spelling of a float keeps its point,
so ids ``7`` and ``7.0`` differ (they are the same id only if the input spells them the
same way); JSON ``7.0`` and ``7.00`` both read as the float 7.0 and are the same id.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import math
from collections import Counter
from typing import Iterable

import orjson

from ..errors import InputError


class CellError(ValueError):
    """A cell cannot be used as text or id; the message names the column and the problem."""


#: JSON type names users know, for messages ("is a list, not a string").
_TYPE_NAMES = {dict: "an object", list: "a list", tuple: "a list", set: "a set", bytes: "bytes"}


def type_name(value: object) -> str:
    """``'a list'``, ``'an object'`` ... for messages (JSON's names where there is one)."""
    for cls, name in _TYPE_NAMES.items():
        if isinstance(value, cls):
            return name
    return f"a {type(value).__name__}"


def json_spelling(value: bool | int | float) -> str:
    """A number or boolean as JSON writes it (orjson): ``true``, ``7``, ``7.5``, ``7.0``, ``1e+20``.

    Raises:
        CellError: a float that is not finite (JSON has no spelling for NaN or infinity).
    """
    if isinstance(value, float) and not math.isfinite(value):
        name = "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
        raise CellError(f"is {name} (a NaN or Infinity literal, or an empty numeric cell), not a value pcd can "
                        "read as text; write a string or null")
    return orjson.dumps(value).decode()


def cell_text(value: object, what: str) -> str:
    """The text of one cell: strings as they are, numbers and booleans in JSON spelling.

    Args:
        value: the cell (not ``None``; callers report missing cells themselves).
        what: the cell's name for messages, e.g. ``"text field 'text'"``.

    Raises:
        CellError: a list, object or other non-scalar value, a non-finite number, or text
            (or bytes) that is not valid UTF-8; the message starts with ``what``.
    """
    if type(value).__module__ == "numpy" and hasattr(value, "item"):  # numpy scalars (DataFrames)
        value = value.item()
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise CellError(f"{what} has bytes that are not valid UTF-8") from None
    if isinstance(value, str):
        try:
            value.encode("utf-8")  # lone surrogates stand for undecodable bytes (surrogateescape)
        except UnicodeError:
            raise CellError(f"{what} has bytes that are not valid UTF-8") from None
        return value
    if isinstance(value, (bool, int, float)):
        try:
            return json_spelling(value)
        except CellError as exc:
            raise CellError(f"{what} {exc}") from None
    if isinstance(value, (_dt.date, _dt.time)):  # Parquet date/time columns: ISO 8601
        return value.isoformat()
    if isinstance(value, decimal.Decimal) and value.is_finite():  # Parquet decimal columns, as written
        return str(value)
    raise CellError(f"{what} is {type_name(value)}, not a string")


class RepeatedIds:
    """Counts rows whose id was already seen in the same input; they are never merged.

    Memory: one hash per distinct id (about 60 bytes each in CPython), not the ids
    themselves; two different ids are taken for one with probability ~n²/2⁶⁵ (a few in a
    million for ten million ids), which at worst adds a false repeat to the count.

    Attributes:
        count: rows whose id had been seen before (a third ``a`` counts twice).
        examples: the first ``keep`` distinct repeated ids, in the order they repeated.
    """

    def __init__(self, keep: int = 5):
        self.keep = keep
        self.count = 0
        self.examples: list = []
        self._seen: set[int] = set()
        self._more = False  # a repeated id beyond the examples

    def add(self, record_id: object) -> None:
        """Count ``record_id`` (``None``, an unreadable id, is not counted)."""
        if record_id is None:
            return
        key = hash((type(record_id), record_id))
        if key in self._seen:
            self.count += 1
            if record_id not in self.examples:
                if len(self.examples) < self.keep:
                    self.examples.append(record_id)
                else:
                    self._more = True
        else:
            self._seen.add(key)

    def message(self) -> str:
        """One line for warnings: how many rows repeat an id, the first few ids, and the rule
        every command follows for them (``REPEATED_ID_RULE``)."""
        shown = ", ".join(repr(str(e)) for e in self.examples)
        more = ", ..." if self._more else ""
        rows = "1 row repeats" if self.count == 1 else f"{self.count} rows repeat"
        return f"{rows} an id seen earlier ({shown}{more}); {REPEATED_ID_RULE}"


#: What every command does with rows that repeat an id (issue #45: ``pcd label`` warned and
#: ``pcd review`` refused the output it had just written): warn, keep each row, and name the n-th
#: repeat of ``ID`` ``ID (repeat n)`` (``repeat_key``) where rows are matched by id.
REPEATED_ID_RULE = ("each is a row of its own, never merged; pcd eval, calibrate and review match "
                    "them by order, the n-th repeat of an id as 'ID (repeat n)'")


def repeat_key(record_id: str, n: int) -> str:
    """The key of the ``n``-th repeat (``n >= 1``) of ``record_id``: ``ID (repeat n)``
    (``REPEATED_ID_RULE``); ``record_id`` itself for ``n == 0``."""
    return record_id if n == 0 else f"{record_id} (repeat {n})"


def occurrence_keys(ids: Iterable[str]) -> tuple[list[str], RepeatedIds]:
    """Each id's key by ``REPEATED_ID_RULE``, in order (the first row of an id keeps it, the
    n-th repeat is ``repeat_key(id, n)``), and the ``RepeatedIds`` count for the warning.

    Raises:
        InputError: two keys are the same (an id already spelled ``ID (repeat n)`` besides a
            repeated ``ID``): the rows could not be told apart.
    """
    seen: dict[str, int] = {}
    repeated = RepeatedIds()
    keys = []
    for rid in ids:
        n = seen.get(rid, 0)
        seen[rid] = n + 1
        repeated.add(rid)
        keys.append(repeat_key(rid, n))
    if repeated.count and len(set(keys)) != len(keys):
        clash = next(k for k, c in Counter(keys).items() if c > 1)
        raise InputError(f"id {clash!r} names two rows (a repeated id's key, 'ID (repeat n)', is also an id); "
                         "make the ids unique")
    return keys, repeated
