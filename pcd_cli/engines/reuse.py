"""Pay only for what changed: rows copied from earlier outputs (``pcd label --reuse``) and
repeated texts decoded once within a run.

What a row's values depend on is two things: the text the model reads and the job that reads
it. So every output pcd writes records both:

- per row, ``__input_sha256`` (``INPUT_KEY_COLUMN``): the SHA-256 (hex) of the record's text
  as the decoder receives it, in UTF-8: after ``--template``/``--text-field`` and the readers'
  normalisation (``pcd_cli.io.values``), before truncation (the cut is a function of the text
  and of the job's model and ``--truncate``, both in the fingerprint, so equal keys under an
  equal job mean byte-identical model input);
- in its Parquet metadata, ``pcd.job_parts`` (``JOB_PARTS_KEY``): the job fingerprint, one
  entry per thing that changes a value (``pcd_cli.job_fingerprint.job_parts``, defined beside
  the job: model weights, tokenizer and chat template, adapter, backend, dtype, device, library
  versions, schema, the whole rendered prompt around the record, few-shot examples, scoring,
  truncation, permutations, isolate_fields, calibration, prior correction, abstaining, pcd's
  version), and ``pcd.reused`` (``REUSED_KEY``): which outputs this run copied rows from.

The local engine's resume fingerprint (``pcd_cli.engines.local.job_fingerprint``) is these parts
plus what names the input and the run.

A row is then labelled in one of three ways (``ReusingLabeler``):

1. **reused**: its key is in an earlier output of the same job (``ReuseIndex``): that row's
   values are copied cell for cell (bit for bit), no forward pass;
2. **deduplicated**: its key was labelled earlier in this run, and is still among the last
   ``dedup_keys`` distinct keys decoded (``DedupCache``, oldest out): the first copy's
   values, under this row's own id;
3. **decoded**: every other row, by the ``Labeler``, in groups of rows to decode.

Every copy keeps its own id and place. Traces (``--trace``) are written for decoded rows only.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
import pyarrow.parquet as pq

from ..errors import InputError
from ..job_fingerprint import FIELDS_PART, PER_FIELD, first_difference, reusable_fields
from ..results import INPUT_KEY_COLUMN, Record, RecordFailure, RecordResult, input_key  # noqa: F401 (re-exported)

#: Output metadata: the job fingerprint (``job_parts``), a JSON object in ``PARTS`` order.
JOB_PARTS_KEY = "pcd.job_parts"
#: Output metadata: the outputs rows were copied from, a JSON list of ``{"path", "rows"}``.
REUSED_KEY = "pcd.reused"
#: Distinct texts the dedup cache keeps (``--dedup-keys``): a repeated text farther back than
#: this many distinct decoded texts is decoded again. Memory per entry: the row's values as Python
#: objects, about 0.5 KB + 0.13 KB per output column (measured: 0.6 KB for a one-field schema,
#: 11 KB for a 28-field one), so the default holds 12 MB to 220 MB (docs/labelling.md).
DEFAULT_DEDUP_KEYS = 20_000
#: Input rows a group of rows to decode spans at most, copies included (``ReusingLabeler``): on a
#: night where few rows changed, a group closes here rather than after ``group_size`` rows to
#: decode, which bounds the rows held waiting for it (memory) and how far the reader runs ahead of
#: the output (``RecordReader(keep_digests=...)``). Packs changed rows as densely as a fresh run
#: does down to 16 in 4,096 (0.4 %) changed.
MAX_GROUP_SPAN = 4096


def columns_of(arrow_schema: pa.Schema, names: Sequence[str]) -> list[str]:
    """The output columns of the declared fields ``names`` in ``arrow_schema`` (a field's name
    and its name with one of ``OUTPUT_SUFFIXES``), in the schema's order."""
    from ..schema.model import OUTPUT_SUFFIXES

    wanted = set(names)
    return [c for c in arrow_schema.names
            if c in wanted or any(c.endswith(x) and c[: -len(x)] in wanted for x in OUTPUT_SUFFIXES)]


def keyed_schema(arrow_schema: pa.Schema) -> pa.Schema:
    """``arrow_schema`` (an output's columns) with the content key column added last."""
    return arrow_schema.append(pa.field(INPUT_KEY_COLUMN, pa.string()))


def keyed_metadata(parts: dict, reused: Sequence[dict] = ()) -> dict[str, str]:
    """The reuse part of an output's key-value metadata: ``pcd.job_parts`` and ``pcd.reused``."""
    return {JOB_PARTS_KEY: json.dumps(parts, ensure_ascii=False),
            REUSED_KEY: json.dumps(list(reused), ensure_ascii=False)}


# -- the earlier outputs ------------------------------------------------------------------------------
@dataclass
class ReuseSource:
    """One earlier output file named by ``--reuse``: its path, job fingerprint and the columns
    (all but the id) of its rows. ``option`` is the ``--reuse`` value it came from."""

    option: str
    path: str
    parts: dict
    table: pa.Table


def read_source(option: str, path: str, *, filesystem=None, name: str | None = None) -> ReuseSource:
    """Read one earlier output through pyarrow (``filesystem``: a ``pyarrow.fs`` filesystem for
    ``path``, ``None``: local; ``name``: how messages and ``pcd.reused`` name it, default
    ``path``), checking that it is a pcd output that recorded what reuse needs.

    Raises:
        InputError (exit 2, before any model loads): not a Parquet file; not a pcd output; an
        output written before pcd recorded ``__input_sha256`` and ``pcd.job_parts``.
    """
    name = name or path
    named = f"--reuse {option!r}" + (f" ({name})" if name != option else "")
    try:
        footer = pq.read_metadata(path, filesystem=filesystem)
        schema = footer.schema.to_arrow_schema()
    except (OSError, pa.ArrowInvalid) as exc:
        raise InputError(f"{named}: not a Parquet file ({str(exc).splitlines()[0]}): nothing can be reused "
                         "from it; name an earlier pcd output") from None
    meta = {k.decode(): v.decode() for k, v in (schema.metadata or {}).items()}
    if "pcd.version" not in meta:
        raise InputError(f"{named}: not a pcd output (no pcd metadata): nothing can be reused from it; name an "
                         "earlier pcd label output")
    if INPUT_KEY_COLUMN not in schema.names or (JOB_PARTS_KEY not in meta and footer.num_rows):
        raise InputError(f"{named}: written by pcd {meta['pcd.version']} before outputs recorded what --reuse "
                         f"needs ({INPUT_KEY_COLUMN}, {JOB_PARTS_KEY}): nothing can be reused from it; label it "
                         "once more without --reuse")
    try:
        table = pq.read_table(path, columns=schema.names[1:], filesystem=filesystem)
    except (OSError, pa.ArrowInvalid) as exc:
        raise InputError(f"{named}: cannot be read ({str(exc).splitlines()[0]})") from None
    return ReuseSource(option, name, json.loads(meta.get(JOB_PARTS_KEY, "{}")), table)


def read_sources(options: Sequence[str]) -> list[ReuseSource]:
    """Every ``--reuse`` value's Parquet files, read and checked (``read_source``): a file, a
    folder (a ``--engine ray`` output) or a glob, local or a URI, listed as inputs are
    (``pcd_cli.io.storage.list_files``, through ``pyarrow.fs``). No model is needed, so a bad one
    stops the run (exit 2) before any model loads.

    Raises:
        InputError: nothing there, a store problem, or a file ``read_source`` refuses.
    """
    from ..io.storage import list_files

    sources = []
    for option in options:
        listed = list_files(str(option), extensions=(".parquet", ".pq"), option="--reuse", what=".parquet")
        sources += [read_source(str(option), path, filesystem=listed.filesystem, name=listed.name(i))
                    for i, path in enumerate(listed.files)]
    return sources


def _prefixes(keys: pa.Array) -> np.ndarray:
    """The first 16 hex digits of each key as a uint64 (nulls and malformed keys: 0)."""
    text = np.array(keys.to_numpy(zero_copy_only=False).astype("U16"), dtype="U16")
    out = np.zeros(len(text), dtype=np.uint64)
    ok = np.char.str_len(text) == 16
    if ok.any():
        out[ok] = np.array([int(t, 16) for t in text[ok]], dtype=np.uint64)
    return out


class _KeyIndex:
    """Rows of a table found by content key: a uint64 prefix of each key sorted (16 bytes per
    row with its row number), a binary search, checked against the full key; on repeated keys
    the first row wins."""

    def __init__(self, keys: pa.Array):
        self._keys = keys
        prefixes = _prefixes(keys)
        self._order = np.argsort(prefixes, kind="stable")
        self._sorted = prefixes[self._order]

    def find(self, key: str) -> int | None:
        if not len(self._sorted):
            return None
        p = np.uint64(int(key[:16], 16))
        i = int(np.searchsorted(self._sorted, p, side="left"))
        while i < len(self._sorted) and self._sorted[i] == p:
            row = int(self._order[i])
            if self._keys[row].as_py() == key:
                return row
            i += 1
        return None


@dataclass
class FieldsReuse:
    """Earlier rows that lend some fields only (``reusable_fields``): ``fields`` (declared
    names) copied, ``decode`` (the others) decoded; ``table``: those rows' columns of ``fields``,
    untruncated rows only (a cut text may be cut elsewhere by this run's longer prompts)."""

    fields: tuple[str, ...]
    decode: tuple[str, ...]
    table: pa.Table
    keys: _KeyIndex
    paths: list[str]
    rows_from: np.ndarray


class ReuseIndex:
    """The rows of earlier outputs of the same job, found by content key.

    Args:
        sources: the read ``--reuse`` files (``read_sources``).
        parts: this run's ``job_parts``.
        arrow_schema: this run's output columns (``keyed_schema``); a source must hold every one
            of them but the id (with the same type) to be used.
        on_event: told ``reuse`` once per ``--reuse`` value (``message``: what was found, or
            why nothing is reused from it).
        fields: this run's declared field names (schema order), given when its fields are
            decided alone (``per_field``): a source of a job that differs in some fields only
            lends the others (``fields_reuse``: ``FieldsReuse`` groups).

    Memory: the matching sources' columns (decompressed Arrow) plus 16 bytes per row for the
    sorted key index (``_KeyIndex``). On repeated keys the first row (in ``--reuse`` order) wins.
    """

    def __init__(self, sources: Sequence[ReuseSource], parts: dict, arrow_schema: pa.Schema,
                 on_event: Callable | None = None, fields: Sequence[str] = ()):
        emit = on_event or (lambda *_a: None)
        self.columns = arrow_schema.names[1:]
        wanted = pa.schema([arrow_schema.field(n) for n in self.columns])
        tables, self.paths = [], []
        refused: dict[str, str] = {}
        used: dict[str, int] = {}
        lent: dict[tuple[str, ...], list[tuple[ReuseSource, pa.Table]]] = {}
        said: dict[str, tuple[tuple[str, ...], int]] = {}
        for src in sources:
            why = "it holds no rows" if not src.table.num_rows else first_difference(src.parts, parts)
            if why is None:
                missing = [n for n in self.columns if n not in src.table.column_names
                           or src.table.schema.field(n).type != wanted.field(n).type]
                if missing:
                    why = f"written without the column {missing[0]!r} this run writes (e.g. --all-probs)"
            if why is not None:
                part = self._fields_part(src, parts, arrow_schema, fields) if src.table.num_rows else None
                if part is not None:
                    names, table = part
                    lent.setdefault(names, []).append((src, table))
                    said[src.option] = (names, said.get(src.option, (names, 0))[1] + table.num_rows)
                elif FIELDS_PART in src.parts and FIELDS_PART in parts:  # name what rules out per-field reuse too
                    why = first_difference(*({k: v for k, v in p.items() if k not in PER_FIELD}
                                             for p in (src.parts, parts))) or why
                refused.setdefault(src.option, why)
                continue
            tables.append(src.table.select(self.columns).cast(wanted))
            self.paths.append(src.path)
            used[src.option] = used.get(src.option, 0) + src.table.num_rows
        for option, why in refused.items():
            if option in used:
                continue
            if option in said:
                names, rows = said[option]
                decode = [f for f in fields if f not in names]
                what = (f"{_quoted(names)} copied per field, only {_quoted(decode)} decoded" if decode else
                        "every field's own part is unchanged: rows copied whole")
                emit("reuse", {"message": f"--reuse {option}: {why}: isolate_fields: {what} on the {rows} rows of "
                               "texts it labelled",
                               "path": option, "reason": why, "rows": rows, "fields": list(names),
                               "decoded_fields": decode}, "info")
                continue
            emit("reuse", {"message": f"--reuse {option}: {why}: nothing reused", "path": option,
                           "reason": why}, "warning")
        for option, rows in used.items():
            emit("reuse", {"message": f"--reuse {option}: {rows} rows of the same job to copy from", "path": option,
                           "rows": rows}, "info")
        # one chunk per column: a take on a chunked table costs a pass over all its rows (12 ms per
        # 16-row take at 1,000,000 rows in 8 row groups; 8 us in one chunk)
        self.table = pa.concat_tables(tables).combine_chunks() if tables else wanted.empty_table()
        self.rows_from = np.cumsum([0] + [t.num_rows for t in tables])
        keys = self.table.column(INPUT_KEY_COLUMN).combine_chunks() if self.table.num_rows else pa.array([], pa.string())
        self._index = _KeyIndex(keys)
        #: the earlier rows that lend some fields only, one group per set of fields lent
        self.fields_reuse: list[FieldsReuse] = []
        for names, found in lent.items():
            table = pa.concat_tables([t for _, t in found]).combine_chunks()
            self.fields_reuse.append(FieldsReuse(
                names, tuple(f for f in fields if f not in names), table,
                _KeyIndex(table.column(INPUT_KEY_COLUMN).combine_chunks()), [src.path for src, _ in found],
                np.cumsum([0] + [t.num_rows for _, t in found])))
        #: rows copied from each source path so far (for ``pcd.reused``)
        self.copied: dict[str, int] = {}
        #: rows whose fields were copied in part, per source path (for ``pcd.reused``)
        self.copied_fields: dict[str, tuple[tuple[str, ...], int]] = {}

    @staticmethod
    def _fields_part(src: ReuseSource, parts: dict, arrow_schema: pa.Schema, fields: Sequence[str]
                     ) -> tuple[tuple[str, ...], pa.Table] | None:
        """What ``src`` lends field by field (``reusable_fields``): the fields and their columns
        (with ``__truncated`` and the key) of its untruncated rows; ``None`` when nothing."""
        if not fields:
            return None
        from ..schema.model import TRUNCATED_COLUMN

        lent = set(reusable_fields(src.parts, parts))
        names = tuple(f for f in fields if f in lent)
        if not names:
            return None
        columns = columns_of(arrow_schema, names) + [TRUNCATED_COLUMN, INPUT_KEY_COLUMN]
        if any(c not in src.table.column_names or src.table.schema.field(c).type != arrow_schema.field(c).type
               for c in columns):
            return None
        table = src.table.select(columns)
        table = table.filter(pa.compute.invert(pa.compute.fill_null(table.column(TRUNCATED_COLUMN), True)))
        return names, table

    def __len__(self) -> int:
        return self.table.num_rows

    def find(self, key: str) -> int | None:
        """The row of the first earlier row with content key ``key``, or ``None``."""
        return self._index.find(key)

    def find_fields(self, key: str) -> tuple[int, int] | None:
        """``(group, row)``: the first ``fields_reuse`` group holding an untruncated row with
        content key ``key``, and that row; ``None`` when none does."""
        for g, part in enumerate(self.fields_reuse):
            row = part.keys.find(key)
            if row is not None:
                return g, row
        return None

    def lends_whole(self, key: str) -> bool:
        """Whether ``find_fields`` finds ``key`` in a group that lends every field (nothing to decode)."""
        found = self.find_fields(key)
        return found is not None and not self.fields_reuse[found[0]].decode

    def rows(self, indices: Sequence[int]) -> list[dict]:
        """The earlier rows at ``indices`` as Python values (every column but the id), counted
        as copied per source."""
        where = np.searchsorted(self.rows_from, np.asarray(indices, dtype=np.int64), side="right") - 1
        for source, count in zip(*np.unique(where, return_counts=True)):
            path = self.paths[int(source)]
            self.copied[path] = self.copied.get(path, 0) + int(count)
        return self.table.take(pa.array(indices, pa.int64())).to_pylist()

    def field_rows(self, group: int, indices: Sequence[int]) -> list[dict]:
        """Rows at ``indices`` of ``fields_reuse[group]`` as Python values (its fields' columns,
        ``__truncated``, the key); ``count_fields`` counts those used."""
        return self.fields_reuse[group].table.take(pa.array(indices, pa.int64())).to_pylist()

    def count_fields(self, group: int, indices: Sequence[int]) -> None:
        """Count rows at ``indices`` of ``fields_reuse[group]`` as copied in part, per source."""
        part = self.fields_reuse[group]
        where = np.searchsorted(part.rows_from, np.asarray(indices, dtype=np.int64), side="right") - 1
        for source, count in zip(*np.unique(where, return_counts=True)):
            path = part.paths[int(source)]
            self.copied_fields[path] = (part.fields, self.copied_fields.get(path, ((), 0))[1] + int(count))

    def unmatched(self, records: int) -> str | None:
        """``unmatched_reuse`` for this index once ``records`` rows were labelled."""
        offered = len(self) + sum(part.table.num_rows for part in self.fields_reuse)
        copied = sum(self.copied.values()) + sum(n for _, n in self.copied_fields.values())
        return unmatched_reuse(offered, copied, records)

    def reused_metadata(self) -> list[dict]:
        """``pcd.reused``: each earlier output with the rows copied from it (only those used),
        and those whose fields it lent in part (``fields``: which)."""
        return ([{"path": p, "rows": n} for p, n in self.copied.items()]
                + [{"path": p, "rows": n, "fields": list(names)} for p, (names, n) in self.copied_fields.items()])


def unmatched_reuse(offered: int, copied: int, records: int) -> str | None:
    """The warning for a run whose ``--reuse`` outputs offered ``offered`` rows of the same job
    (whole or per field) while none of its ``records`` labelled rows matched one (``copied``
    0): its texts differ from the earlier run's, typically by a ``--template`` value that changes
    every night; ``None`` otherwise."""
    if not offered or not records or copied:
        return None
    return (f"--reuse: {offered} earlier rows of the same job, but no text of this input is one of theirs: nothing "
            "reused. The text the model reads differs from the earlier run's (another --template or --text-field, "
            "or a value in it that changes every night, such as a {date} partition column): keep such values out "
            "of the text to reuse rows (docs/labelling.md, Nightly runs)")


def _quoted(names: Sequence[str]) -> str:
    return ", ".join(repr(n) for n in names)


class DedupCache:
    """The values of the last ``capacity`` distinct content keys labelled (decoded) in this run,
    kept in the order they were first labelled, the oldest out (``capacity`` 0: no dedup). A lookup does not reorder it, so the cache is a
    function of the labelled rows in input order alone, and a resumed run rebuilds it exactly by
    putting its committed rows again (``replay``). Each entry holds one row's values (every
    output column but the id) as Python objects."""

    def __init__(self, capacity: int = DEFAULT_DEDUP_KEYS):
        self.capacity = capacity
        self._rows: OrderedDict[str, dict] = OrderedDict()

    def get(self, key: str) -> dict | None:
        return self._rows.get(key)

    def put(self, key: str, row: dict) -> None:
        """Remember ``key``'s values (a key already held is left as it is)."""
        if self.capacity <= 0 or key in self._rows:
            return
        self._rows[key] = row
        if len(self._rows) > self.capacity:
            self._rows.popitem(last=False)

    def __len__(self) -> int:
        return len(self._rows)


DECODED, REUSED, DEDUPLICATED = "decoded", "reused", "deduplicated"
#: a row whose fields an earlier output lent in part (``FieldsReuse``), the others decoded
PARTLY_REUSED = "partly reused"


@dataclass
class Labelled:
    """One input item once labelled: its output row (a dict of every output column) or its
    ``RecordFailure``; ``kind``: ``DECODED``, ``REUSED``, ``DEDUPLICATED``, ``PARTLY_REUSED``
    (``None`` for a reader's failure); ``traces``: a decoded row's (``()`` for a copy);
    ``record``: a decoded row's ``RecordResult`` (what the run summary counts it from,
    ``RunStats.add``: the row holds no multi option's own mass), ``None`` for a copy, a row
    decoded in part or a failure; ``lent``: a ``PARTLY_REUSED`` row's ``(group, row)`` in
    ``ReuseIndex.fields_reuse``."""

    item: object
    key: str | None = None
    kind: str | None = None
    result: object = None
    traces: tuple = ()
    lent: tuple[int, int] | None = None
    record: RecordResult | None = None


class ReusingLabeler:
    """Labels a stream of records the cheapest exact way (module docstring): each row reused,
    deduplicated or decoded, every output row a dict of ``arrow_schema``'s columns, in input order.

    The rows to decode are handed to the ``Labeler`` in groups: a group opens at a row to decode
    and closes once it spans ``group_size`` rows that are not copies (rows to decode, and the
    readers' failed rows after its first), counted from the input's first row on, or once it
    spans ``max_span`` input rows in all (copies included). Without
    copies, groups are a fresh run's chunks; a night where 5 % changed packs its changed rows
    as densely as a fresh run packs all of them. ``feed`` returns the rows whose
    values are known, in order; a row waits while an earlier one waits for its group. A group is
    decoded as soon as it is full, and its rows released at once, so a commit after any
    ``feed`` ends between groups: a resumed run that ``replay``\ s the committed rows makes the
    same groups and cache, and writes what an uninterrupted run writes, bit for bit.

    Args:
        labeler: the run's ``pcd_cli.api.Labeler``.
        arrow_schema: the output columns with the key last (``keyed_schema``).
        index: the earlier outputs (``ReuseIndex``), or ``None``.
        dedup_keys: capacity of the ``DedupCache``.
        group_size: rows to decode handed to the labeler at once.
        max_span: input rows a group spans at most, copies included (``MAX_GROUP_SPAN``).
    """

    def __init__(self, labeler, arrow_schema: pa.Schema, index: ReuseIndex | None = None,
                 dedup_keys: int = DEFAULT_DEDUP_KEYS, group_size: int = 16, max_span: int = MAX_GROUP_SPAN):
        from ..io.output import results_table

        self._results_table = results_table
        self.labeler, self.arrow_schema, self.index = labeler, arrow_schema, index
        self.cache = DedupCache(dedup_keys)
        self.group_size = group_size
        self.max_span = max_span
        self._id = arrow_schema.names[0]
        self._value_schema = pa.schema(list(arrow_schema)[:-1])  # the key is added per row
        self._waiting: list[Labelled] = []         # rows not released yet, in input order
        self._group: dict[str, list[Labelled]] = {}  # key -> its rows in the open group, first decoded
        self._slots = 0  # rows the open group spans that are not copies (its records, readers' failures)
        #: input row (from 0) of the next item fed; a resumed run sets it where it starts feeding
        self.next_row = 0
        self._spans: list[list] = []  # [first row, row that closed it or None] of the recent groups
        self._released: list[Labelled] = []
        self._parts: dict[tuple[str, ...], tuple] = {}  # ``_part_schema``

    def replay(self, table: pa.Table) -> None:
        """Put the rows of a committed output table (a resumed run's earlier batches, up to where
        it feeds again) in the cache, as labelling them did (reused rows are not cached: the index
        holds them)."""
        if self.cache.capacity <= 0 or not table.num_rows:
            return
        for row in table.select(table.column_names[1:]).to_pylist():
            key = row[INPUT_KEY_COLUMN]
            if self.index is None or (self.index.find(key) is None and not self.index.lends_whole(key)):
                self.cache.put(key, row)

    def redo_for(self, rows_done: int) -> int:
        """How many of the first ``rows_done`` input rows a run resumed after committing them must
        label again (and drop): those of a group decoded across the commit, from its first row
        (0 when no group spans it). A resumed run feeds from ``rows_done - redo_for(rows_done)``
        with the cache of the rows before, and makes the same groups."""
        last = rows_done - 1
        for first, closed in reversed(self._spans):
            if first <= last:
                return rows_done - first if closed is None or closed > last else 0
        return 0

    def feed(self, items: Sequence[Record | RecordFailure]) -> list[Labelled]:
        """Classify ``items`` (decoding each group as it fills); the rows released, in order."""
        for item in items:
            self._classify(item)
        return self._hand_out()

    def flush(self) -> list[Labelled]:
        """Decode the open group (the input has ended); every remaining row, in order."""
        if self._group:
            self._decode()
        self._release()
        return self._hand_out()

    def _hand_out(self) -> list[Labelled]:
        """The rows released since the last call, the reused ones' values fetched at once."""
        out, self._released = self._released, []
        reused = [e for e in out if e.kind == REUSED and not isinstance(e.result, dict)]
        if reused:
            for entry, row in zip(reused, self.index.rows([e.result for e in reused])):
                entry.result = {self._id: entry.item.id} | row
        return out

    def _classify(self, item) -> None:
        entry = Labelled(item)
        self._waiting.append(entry)
        self.next_row += 1
        if not isinstance(item, Record):
            entry.result = item
            if self._group:  # a reader's failure inside a group takes its place, as in a fresh run's chunk
                self._slots += 1
                if self._slots >= self.group_size:
                    self._decode()
        else:
            entry.key = key = input_key(item.text)
            row = self.index.find(key) if self.index is not None else None
            if row is not None:
                entry.kind, entry.result = REUSED, row  # its row of the index: fetched on release, in one take
            elif key in self._group:
                entry.kind = DEDUPLICATED
                self._group[key].append(entry)
            elif (cached := self.cache.get(key)) is not None:
                entry.kind, entry.result = DEDUPLICATED, {self._id: item.id} | cached
            else:
                self._to_decode(entry, key)
        if self._group and self.next_row - self._spans[-1][0] >= self.max_span:
            self._decode()
        self._release()

    def _to_decode(self, entry: Labelled, key: str) -> None:
        """A row no earlier row of the same job nor this run's cache holds: into the open group
        (decoded whole, or only the fields an earlier output does not lend), or, when an earlier
        output lends every field (its job differs where no field's values do), copied at once."""
        entry.lent = self.index.find_fields(key) if self.index is not None else None
        entry.kind = DECODED if entry.lent is None else PARTLY_REUSED
        if entry.lent is not None and not self.index.fields_reuse[entry.lent[0]].decode:
            group, at = entry.lent
            self.index.count_fields(group, [at])
            entry.kind, entry.result = REUSED, {self._id: entry.item.id} | self.index.field_rows(group, [at])[0]
            entry.lent = None
            return
        if not self._group:
            self._spans.append([self.next_row - 1, None])
        self._group[key] = [entry]
        self._slots += 1
        if self._slots >= self.group_size:
            self._decode()

    def _decode(self) -> None:
        """Decode the first row of each key of the open group; its copies get its values (the
        copies of a failed one are decoded on their own, and fail with their own ids). A row
        whose fields an earlier output lends in part has only the other fields decoded
        (``Labeler.label_fields``); one whose text this run cuts is decoded whole instead."""
        group, self._group, self._slots = self._group, {}, 0
        if self._spans and self._spans[-1][1] is None:
            self._spans[-1][1] = self.next_row - 1
            del self._spans[:-64]  # a commit falls within the rows of the last few groups
        while group:
            firsts = [entries[0] for entries in group.values()]
            results = self._label(firsts)
            again: dict[str, list[Labelled]] = {}
            for entries, first, res in zip(group.values(), firsts, results):
                if isinstance(res, RecordFailure):
                    first.kind, first.result = DECODED, res
                    if len(entries) > 1:
                        again[first.key] = entries[1:]
                    continue
                first.result, first.traces, first.record = res
                for copy in entries[1:]:
                    copy.kind, copy.result = DEDUPLICATED, first.result | {self._id: copy.item.id}
            group = again

    def _label(self, firsts: list[Labelled]) -> list:
        """Each row's ``(values, traces, RecordResult or None)`` or ``RecordFailure``: the rows to
        decode whole in one
        ``label_batch``; those lent in part, per group, through ``label_fields``."""
        out: dict[int, object] = {}
        whole = [e for e in firsts if e.kind != PARTLY_REUSED]
        by_group: dict[int, list[Labelled]] = {}
        for e in firsts:
            if e.kind == PARTLY_REUSED:
                by_group.setdefault(e.lent[0], []).append(e)
        for g, entries in by_group.items():
            part = self.index.fields_reuse[g]
            results = self.labeler.label_fields([e.item for e in entries], part.decode)
            lent = self.index.field_rows(g, [e.lent[1] for e in entries])
            schema, value_schema = self._part_schema(part.decode)
            ok = [(e, r, row) for e, r, row in zip(entries, results, lent)
                  if isinstance(r, RecordResult) and not r.truncated]
            rows = self._results_table([r for _, r, _ in ok], schema, value_schema).to_pylist() if ok else []
            if ok:
                self.index.count_fields(g, [e.lent[1] for e, _, _ in ok])
            for (e, r, earlier), row in zip(ok, rows):
                out[id(e)] = (earlier | row | {INPUT_KEY_COLUMN: e.key}, r.traces, None)  # counted from its row
            for e, r in zip(entries, results):
                if isinstance(r, RecordFailure):
                    out[id(e)] = r
                elif id(e) not in out:  # this run cuts the text: its other fields would move too
                    e.kind = DECODED
                    whole.append(e)
        if whole:
            results = self.labeler.label_batch([e.item for e in whole])
            ok = [(e, r) for e, r in zip(whole, results) if isinstance(r, RecordResult)]
            table = self._results_table([r for _, r in ok], self.labeler.schema, self._value_schema) if ok else None
            for (e, r), row in zip(ok, table.to_pylist() if ok else []):
                out[id(e)] = (row | {INPUT_KEY_COLUMN: e.key}, r.traces, r)
            for e, r in zip(whole, results):
                if isinstance(r, RecordFailure):
                    out[id(e)] = r
        return [out[id(e)] for e in firsts]

    def _part_schema(self, names: tuple[str, ...]):
        """The schema of the declared fields ``names`` and their output columns (the id, theirs,
        ``__truncated``), as ``label_fields`` decodes them."""
        from ..schema.model import TRUNCATED_COLUMN, fields_subset

        if names not in self._parts:
            columns = [self._id] + columns_of(self._value_schema, names) + [TRUNCATED_COLUMN]
            self._parts[names] = (fields_subset(self.labeler.schema, names),
                                  pa.schema([self._value_schema.field(c) for c in columns]))
        return self._parts[names]

    def _release(self) -> None:
        """Release the rows at the front that are done, caching the values of each."""
        if not self._waiting or self._waiting[0].result is None:  # blocked by the open group: O(1)
            return
        done = 0
        for entry in self._waiting:
            if entry.result is None:
                break
            done += 1
            if entry.kind in (DECODED, DEDUPLICATED, PARTLY_REUSED) and isinstance(entry.result, dict):
                self.cache.put(entry.key, {k: v for k, v in entry.result.items() if k != self._id})
        if done:
            self._released.extend(self._waiting[:done])
            del self._waiting[:done]
