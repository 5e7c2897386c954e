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

Reading and checking those earlier outputs, and what each lends, is ``reuse_sources``. The
index (``ReuseIndex``) is a list of lenders (``Lender``): the rows of earlier outputs of the same
job first, which lend whole rows, then, where each field is decided alone (``isolate_fields``),
the rows of outputs whose jobs differ in other fields only, which lend some fields. A row is then
labelled in one of four ways (``ReusingLabeler``):

1. **reused**: the first lender holding its key decodes nothing: that row's values are copied
   cell for cell (bit for bit), no forward pass;
2. **deduplicated**: its key was labelled earlier in this run, and is still among the last
   ``dedup_keys`` distinct keys decoded (``DedupCache``, oldest out): the first copy's
   values, under this row's own id;
3. **partly reused**: its lender lends some fields: those are copied, the others decoded
   (``Labeler.label_fields``);
4. **decoded**: every other row, by the ``Labeler``, in groups of rows to decode.

Every copy keeps its own id and place. Traces (``--trace``) are written for decoded rows only.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import pyarrow as pa

from ..results import INPUT_KEY_COLUMN, Record, RecordFailure, RecordResult, input_key  # noqa: F401 (re-exported)
from .reuse_sources import (JOB_PARTS_KEY, REUSED_KEY, ReuseSource, columns_of, keyed_metadata,  # noqa: F401 (re-exported)
                            keyed_schema, lent_by_sources, read_sources)

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



@dataclass(eq=False)
class Lender:
    """Earlier rows that lend this run the declared ``fields``, found by content key: the run
    decodes ``decode`` (the other fields) on such a row; a lender that decodes nothing lends the
    whole row. ``table``: its rows (every output column but the id for the same job's rows;
    ``fields``' columns, ``__truncated`` and the key otherwise), one chunk per column; ``keys``:
    their content keys (``_KeyIndex``); ``paths``: the earlier outputs they come from, in
    ``--reuse`` order, ``rows_from``: where each one's rows start (its end last)."""

    fields: tuple[str, ...]
    decode: tuple[str, ...]
    table: pa.Table
    keys: _KeyIndex
    paths: list[str]
    rows_from: np.ndarray

    @classmethod
    def of(cls, fields: tuple[str, ...], decode: tuple[str, ...], found: list[tuple[str, pa.Table]],
           empty: pa.Table) -> Lender:
        """The lender of the rows ``found`` (``[(path, rows)]``, ``lent_by_sources``); ``empty``
        when there are none."""
        # one chunk per column: a take on a chunked table costs a pass over all its rows (12 ms per
        # 16-row take at 1,000,000 rows in 8 row groups; 8 us in one chunk)
        table = pa.concat_tables([t for _, t in found]).combine_chunks() if found else empty
        keys = table.column(INPUT_KEY_COLUMN).combine_chunks() if table.num_rows else pa.array([], pa.string())
        return cls(fields, decode, table, _KeyIndex(keys), [path for path, _ in found],
                   np.cumsum([0] + [t.num_rows for _, t in found]))


class ReuseIndex:
    """The rows earlier outputs lend this run, found by content key: a list of ``Lender``\ s,
    the whole-row one first (rows of the same job), then one per set of fields lent by outputs
    of jobs that differ in other fields only.

    Args:
        sources: the read ``--reuse`` files (``read_sources``).
        parts: this run's ``job_parts``.
        arrow_schema: this run's output columns (``keyed_schema``); a source must hold every one
            of them but the id, by name in any order, of the same type or one that casts to it
            without loss, to lend whole rows.
        schema: this run's ``Schema``: every row lent is checked against it (``row_problems``).
        on_event: told ``reuse`` events (``lent_by_sources``: what each ``--reuse`` value lends
            or why nothing, the rows refused, texts two sources label differently).
        fields: this run's declared field names (schema order), given when its fields are
            decided alone (``per_field``): a source of a job that differs in some fields only
            lends the others.

    Rows that are not what pcd writes (a label outside the schema, a probability edited to junk
    or to a value its ``__probs`` contradict, a key that is no SHA-256, or one repeated in the same
    file with other labels: an edited key) are never lent: their texts are decoded again. On
    repeated keys the first row (``--reuse`` order, then the files of a folder or glob in name
    order; the whole-row lender before the others) wins.

    Memory: the lent columns (decompressed Arrow) plus 16 bytes per row for the sorted key index
    (``_KeyIndex``).
    """

    def __init__(self, sources: Sequence[ReuseSource], parts: dict, arrow_schema: pa.Schema,
                 on_event: Callable | None = None, fields: Sequence[str] = (), *, schema):
        lent = lent_by_sources(sources, parts, arrow_schema, schema, fields, on_event or (lambda *_a: None))
        everything = tuple(f.name for f in schema.declared)
        empty = pa.schema([arrow_schema.field(n) for n in arrow_schema.names[1:]]).empty_table()
        self.lenders = [Lender.of(everything, (), lent.pop(None, []), empty)] + [
            Lender.of(names, tuple(f for f in fields if f not in names), found, empty) for names, found in lent.items()]
        #: rows copied (whole or in part) from each earlier output so far, in the order first
        #: copied (``reused_metadata``); a Ray worker empties it per batch
        self.copied: dict[str, int] = {}
        self._lender_of = {path: lender for lender in reversed(self.lenders) for path in lender.paths}

    def find(self, key: str) -> tuple[Lender, int] | None:
        """The first lender holding a row with content key ``key`` (the whole-row one first), and
        that row; ``None`` when none does."""
        for lender in self.lenders:
            row = lender.keys.find(key)
            if row is not None:
                return lender, row
        return None

    def take(self, lender: Lender, rows: Sequence[int]) -> list[dict]:
        """``lender``'s rows at ``rows`` as Python values (its columns), counted as copied from
        the earlier output each comes from (``copied``)."""
        where = np.searchsorted(lender.rows_from, np.asarray(rows, dtype=np.int64), side="right") - 1
        for source, count in zip(*np.unique(where, return_counts=True)):
            path = lender.paths[int(source)]
            self.copied[path] = self.copied.get(path, 0) + int(count)
        return lender.table.take(pa.array(rows, pa.int64())).to_pylist()

    def unmatched(self, records: int) -> str | None:
        """``unmatched_reuse`` for this index once ``records`` rows were labelled."""
        return unmatched_reuse(sum(lender.table.num_rows for lender in self.lenders), sum(self.copied.values()),
                               records)

    def reused_metadata(self) -> list[dict]:
        """``pcd.reused``: each earlier output with the rows copied from it (only those used), the
        whole-row lender's first, then those that lent some fields only (``fields``: which)."""
        said = [{"path": p, "rows": n} | ({} if self._lender_of[p] is self.lenders[0]
                                          else {"fields": list(self._lender_of[p].fields)})
                for p, n in self.copied.items()]
        return [e for e in said if "fields" not in e] + [e for e in said if "fields" in e]



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
#: a row whose fields an earlier output lent in part (a ``Lender`` that decodes some), the others decoded
PARTLY_REUSED = "partly reused"


@dataclass
class Labelled:
    """One input item once labelled: its output row (a dict of every output column) or its
    ``RecordFailure``; ``kind``: ``DECODED``, ``REUSED``, ``DEDUPLICATED``, ``PARTLY_REUSED``
    (``None`` for a reader's failure); ``traces``: a decoded row's (``()`` for a copy);
    ``record``: a decoded row's ``RecordResult`` (what the run summary counts it from,
    ``RunStats.add``: the row holds no multi option's own mass), ``None`` for a copy, a row
    decoded in part or a failure; ``lent``: a ``PARTLY_REUSED`` row's ``(lender, row)``
    (``ReuseIndex.find``)."""

    item: object
    key: str | None = None
    kind: str | None = None
    result: object = None
    traces: tuple = ()
    lent: tuple[Lender, int] | None = None
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
        dedup_keys: capacity of the ``DedupCache``; 0: no deduplication at all, neither from the
            cache nor between copies of a text in one group (every copy decoded on its own).
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
            found = self.index.find(key) if self.index is not None else None
            if found is None or found[0].decode:
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
        """The rows released since the last call, the reused ones' values fetched at once (one
        ``take`` per lender)."""
        out, self._released = self._released, []
        reused: dict[Lender, list[Labelled]] = {}
        for e in out:
            if e.kind == REUSED and not isinstance(e.result, dict):
                reused.setdefault(e.result[0], []).append(e)
        for lender, entries in reused.items():
            for entry, row in zip(entries, self.index.take(lender, [e.result[1] for e in entries])):
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
            found = self.index.find(key) if self.index is not None else None
            if found is not None and not found[0].decode:  # lent whole: fetched on release, in one take
                entry.kind, entry.result = REUSED, found
            elif self.cache.capacity > 0 and key in self._group:  # --dedup-keys 0: every copy decoded
                entry.kind = DEDUPLICATED
                self._group[key].append(entry)
            elif (cached := self.cache.get(key)) is not None:
                entry.kind, entry.result = DEDUPLICATED, {self._id: item.id} | cached
            else:
                self._to_decode(entry, key, found)
        if self._group and self.next_row - self._spans[-1][0] >= self.max_span:
            self._decode()
        self._release()

    def _to_decode(self, entry: Labelled, key: str, lent: tuple[Lender, int] | None) -> None:
        """A row no lender lends whole nor this run's cache holds: into the open group, decoded
        whole, or only the fields its lender (``lent``: ``ReuseIndex.find``) does not lend."""
        entry.lent = lent
        entry.kind = DECODED if lent is None else PARTLY_REUSED
        if not self._group:
            self._spans.append([self.next_row - 1, None])
        # deduplicating, a key is one slot holding its copies; with --dedup-keys 0, each row its own
        self._group[key if self.cache.capacity > 0 else f"{key}@{self.next_row - 1}"] = [entry]
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
        ``label_batch``; those lent in part, per lender, through ``label_fields``."""
        out: dict[int, object] = {}
        whole = [e for e in firsts if e.kind != PARTLY_REUSED]
        by_lender: dict[Lender, list[Labelled]] = {}
        for e in firsts:
            if e.kind == PARTLY_REUSED:
                by_lender.setdefault(e.lent[0], []).append(e)
        for lender, entries in by_lender.items():
            results = self.labeler.label_fields([e.item for e in entries], lender.decode)
            schema, value_schema = self._part_schema(lender.decode)
            ok = [(e, r) for e, r in zip(entries, results) if isinstance(r, RecordResult) and not r.truncated]
            rows = self._results_table([r for _, r in ok], schema, value_schema).to_pylist() if ok else []
            lent = self.index.take(lender, [e.lent[1] for e, _ in ok]) if ok else []
            for (e, r), earlier, row in zip(ok, lent, rows):
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
