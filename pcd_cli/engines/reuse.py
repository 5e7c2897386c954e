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


# -- what an earlier row may hold -------------------------------------------------------------------
#: How far a row's ``<f>__prob`` may lie from what its own ``<f>__probs`` give (float32 both: the
#: chosen label's entry, or a multi field's product of P(yes)/P(no) over its options), relative.
#: A label edited to another label of the schema moves it by far more (``row_problems``).
PROB_TOLERANCE = 1e-3
#: Rows of a refused kind a warning names by id (``ReuseIndex``); the count says the rest.
NAMED_ROWS = 5
_KEY_PATTERN = "^[0-9a-f]{64}$"


def _np(array) -> np.ndarray:
    return np.asarray(array.to_numpy(zero_copy_only=False))


def _floats(array: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """``(values as float64 with nulls as nan, null mask)``."""
    nulls = _np(array.is_null())
    return np.asarray(array.cast(pa.float64()).fill_null(np.nan).to_numpy(zero_copy_only=False), dtype=np.float64), nulls


class _Checks:
    """Rows found wrong, each with the first check it failed (``row_problems``)."""

    def __init__(self, rows: int):
        self.bad = np.zeros(rows, dtype=bool)
        self.code = np.full(rows, -1, dtype=np.int64)
        self.said: list[tuple[str | None, str]] = []  # (column whose cell is quoted, what is wrong)

    def fail(self, mask: np.ndarray, column: str | None, what: str) -> None:
        new = np.asarray(mask, dtype=bool) & ~self.bad
        if new.any():
            self.code[new] = len(self.said)
            self.said.append((column, what))
            self.bad |= new


def _labels_in(checks: _Checks, array: pa.Array, labels, column: str, what: str) -> np.ndarray:
    """Fail the rows whose non-null cell is not one of ``labels``; the rows' label index (-1: none)."""
    index = _np(pa.compute.index_in(array, value_set=pa.array(list(labels), array.type)).fill_null(-1))
    checks.fail((index < 0) & ~_np(array.is_null()), column, what)
    return index


def _map_cells(checks: _Checks, array: pa.Array, keys: Sequence[str], column: str) -> np.ndarray:
    """Check a ``<f>__probs`` column (a map label -> probability): no null, the field's labels in
    order, each a probability. Returns its values as a (rows, labels) float64 array (nan where
    the row failed)."""
    n, k = len(array), len(keys)
    out = np.full((n, k), np.nan)
    nulls = _np(array.is_null())
    checks.fail(nulls, None, f"{column!r} is empty")
    lengths = np.diff(array.offsets.to_numpy())
    whole = (lengths == k) & ~nulls
    checks.fail(~whole & ~nulls, None, f"{column!r} does not hold one probability per label")
    if not whole.any():
        return out
    rows = pa.array(np.flatnonzero(whole))
    if whole.all() and array.offset == 0 and array.offsets[0].as_py() == 0:
        taken = array  # its keys and items are its rows' alone, in order
    else:
        taken = pa.concat_arrays([array.take(rows)])  # a fresh array: its keys and items are those rows' alone
    got_keys = _np(pa.compute.index_in(taken.keys, value_set=pa.array(list(keys), taken.keys.type)).fill_null(-1))
    got_keys = got_keys.reshape(-1, k)
    values, vnull = _floats(taken.items)
    values, vnull = values.reshape(-1, k), vnull.reshape(-1, k)
    wrong_keys = (got_keys != np.arange(k)).any(axis=1)
    wrong_values = (vnull | ~np.isfinite(values) | (values < 0) | (values > 1 + 1e-6)).any(axis=1)
    where = np.flatnonzero(whole)
    for wrong, what in ((wrong_keys, "names other labels than the field's"),
                        (wrong_values, "holds a value that is not a probability")):
        rows_wrong = np.zeros(n, dtype=bool)
        rows_wrong[where[wrong]] = True
        checks.fail(rows_wrong, None, f"{column!r} {what}")
    out[where] = values
    return out


def row_problems(table: pa.Table, schema, names: Sequence[str] | None = None
                 ) -> tuple[np.ndarray, Callable[[int], str]]:
    """Check every row of an earlier output (its columns already of this run's types) against
    what pcd writes for ``schema`` (``pcd_cli.io.output.output_columns``), for the declared
    fields ``names`` (default: all) and the columns of the whole record the table holds: the
    content key (64 hex digits), ``__truncated``, ``__joint_prob``.

    A cell is wrong where pcd never writes it so: a label that is not one of the field's (a
    null where the field is not nullable and did not abstain), a multi field's options not the
    field's, repeated or out of option order, a probability, mass or expected value that is
    null, not finite or out of its range, a ``<f>__probs`` map without exactly the field's labels,
    a flag (``__abstained``, ``__changed_by_rules``, ``__truncated``) null; and, where the row
    holds ``<f>__probs``, a ``<f>__prob`` that is not what they give for the written label
    (within ``PROB_TOLERANCE``): a label edited to another of the schema's labels. Without
    ``<f>__probs`` (no ``--all-probs``) such an edit cannot be seen.

    Returns:
        ``(bad, why)``: a bool array (rows,) true for a wrong row, and ``why(row)``: a wrong
        row's first problem found, as text naming the column and quoting the cell.
    """
    from ..schema.model import (ABSTAINED_SUFFIX, CHANGED_SUFFIX, EXPECTED_SUFFIX, JOINT_COLUMN, MASS_SUFFIX,
                                NULL_LABEL, ORDER_SPREAD_SUFFIX, PROB_SUFFIX, PROBS_SUFFIX, RAW_PROB_SUFFIX,
                                SET_SUFFIX, TRUNCATED_COLUMN)

    n = table.num_rows
    checks = _Checks(n)
    has = set(table.column_names)

    def col(name: str) -> pa.Array:
        return table.column(name).combine_chunks()

    def probability(name: str, *, null_ok: bool = False, top: float = 1 + 1e-4) -> None:
        if name not in has:
            return
        values, nulls = _floats(col(name))
        if not null_ok:
            checks.fail(nulls, name, f"{name!r} is empty")
        checks.fail(~nulls & ~((values >= 0) & (values <= top)), name, f"{name!r} is not a probability")

    def flag(name: str) -> None:
        if name in has:
            checks.fail(_np(col(name).is_null()), name, f"{name!r} is empty")

    if INPUT_KEY_COLUMN in has:
        keys = col(INPUT_KEY_COLUMN)
        ok = _np(pa.compute.match_substring_regex(keys, _KEY_PATTERN).fill_null(False))
        checks.fail(~ok, INPUT_KEY_COLUMN, f"{INPUT_KEY_COLUMN!r} is not a SHA-256 (64 hex digits)")
    wanted = None if names is None else set(names)
    for f in schema.declared:
        if wanted is not None and f.name not in wanted or f.name not in has:
            continue
        c = f.name
        value = col(c)
        prob, probs_col = c + PROB_SUFFIX, c + PROBS_SUFFIX
        probability(prob)
        probability(c + MASS_SUFFIX)
        probability(c + RAW_PROB_SUFFIX)
        probability(c + ORDER_SPREAD_SUFFIX, null_ok=True)
        for name in (c + ABSTAINED_SUFFIX, c + CHANGED_SUFFIX):
            flag(name)
        probs = _map_cells(checks, col(probs_col), f.labels, probs_col) if probs_col in has else None
        if f.is_multi:
            nulls = _np(value.is_null())
            checks.fail(nulls, c, f"{c!r} is empty (a multi field writes a list, [] for none)")
            flat = pa.compute.list_flatten(value)
            index = _np(pa.compute.index_in(flat, value_set=pa.array(list(f.labels), flat.type)).fill_null(-1))
            parents = _np(pa.compute.list_parent_indices(value)) if len(flat) else np.zeros(0, dtype=np.int64)
            wrong = np.zeros(n, dtype=bool)
            wrong[parents[index < 0]] = True
            checks.fail(wrong, c, f"{c!r} holds an option that is not one of the field's ({' | '.join(f.labels)})")
            same_row = parents[1:] == parents[:-1]
            unordered = np.zeros(n, dtype=bool)
            unordered[parents[1:][same_row & (index[1:] <= index[:-1])]] = True
            checks.fail(unordered, c, f"{c!r} repeats an option or lists them out of the field's order")
            if probs is not None and prob in has:
                chosen = np.zeros((n, len(f.labels)), dtype=bool)
                good = index >= 0
                chosen[parents[good], index[good]] = True
                expect = np.where(chosen, probs, 1 - probs).prod(axis=1)
                got, _ = _floats(col(prob))
                off = ~np.isclose(got, expect, rtol=PROB_TOLERANCE, atol=1e-6) & np.isfinite(expect)
                checks.fail(off, c, f"{prob!r} is not the probability its {probs_col!r} give the options chosen: "
                                    "a hand-edited value")
            continue
        nulls = _np(value.is_null())
        abstained = (_np(col(c + ABSTAINED_SUFFIX).fill_null(False)) if c + ABSTAINED_SUFFIX in has
                     else np.zeros(n, dtype=bool))
        checks.fail(nulls & ~abstained & ~np.bool_(f.nullable), c, f"{c!r} is empty (the field is not nullable)")
        checks.fail(abstained & ~nulls, c, f"{c!r} holds a label although {c + ABSTAINED_SUFFIX!r} says it abstained")
        labels = [f.value(i) for i in range(len(f.labels)) if not f.is_null(i)]
        shown = " | ".join(map(str, labels))
        index = _labels_in(checks, value, labels, c, f"{c!r} is not one of the field's labels ({shown})")
        if probs is not None and prob in has:
            label = np.where(nulls & ~abstained & np.bool_(f.nullable), len(f.labels) - 1,
                             np.array([i for i in range(len(f.labels)) if not f.is_null(i)] + [-1])[index])
            expect = np.full(n, np.nan)
            known = (label >= 0) & ~abstained
            expect[known] = probs[np.flatnonzero(known), label[known]]
            got, _ = _floats(col(prob))
            off = known & np.isfinite(expect) & ~np.isclose(got, expect, rtol=PROB_TOLERANCE, atol=1e-6)
            checks.fail(off, c, f"{prob!r} is not what {probs_col!r} give the written label: a label edited by hand")
        if c + EXPECTED_SUFFIX in has:
            scale = [v for _, v in f.scale_values()]
            values, _ = _floats(col(c + EXPECTED_SUFFIX))
            checks.fail(np.isfinite(values) & ((values < min(scale) - 1e-4) | (values > max(scale) + 1e-4))
                        | np.isinf(values), c + EXPECTED_SUFFIX, f"{c + EXPECTED_SUFFIX!r} lies off the field's scale")
        if c + SET_SUFFIX in has:
            sets = col(c + SET_SUFFIX)
            flat = pa.compute.list_flatten(sets)
            if len(flat):
                index = _np(pa.compute.index_in(flat, value_set=pa.array(list(f.labels), flat.type)).fill_null(-1))
                wrong = np.zeros(n, dtype=bool)
                wrong[_np(pa.compute.list_parent_indices(sets))[index < 0]] = True
                checks.fail(wrong, c + SET_SUFFIX, f"{c + SET_SUFFIX!r} holds a label that is not the field's")
    flag(TRUNCATED_COLUMN)
    probability(JOINT_COLUMN)

    def why(row: int) -> str:
        column, what = checks.said[checks.code[row]]
        return what if column is None else f"{what}: {_cell(table.column(column)[int(row)].as_py())}"

    return checks.bad, why


def _cell(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# -- the earlier outputs ------------------------------------------------------------------------------
@dataclass
class ReuseSource:
    """One earlier output file named by ``--reuse``: its path, job fingerprint and its rows (every
    column, in the file's order: ``ReuseIndex`` takes the ones it needs by name). ``option`` is the
    ``--reuse`` value it came from."""

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
    try:  # every column, whatever their order (the id too: warnings name rows by it)
        table = pq.read_table(path, filesystem=filesystem)
    except (OSError, pa.ArrowInvalid) as exc:
        raise InputError(f"{named}: cannot be read ({str(exc).splitlines()[0]})") from None
    return ReuseSource(option, name, json.loads(meta.get(JOB_PARTS_KEY, "{}")), table)


def _conformed(table: pa.Table, wanted: pa.Schema) -> tuple[pa.Table, str | None]:
    """``table`` (an earlier output's columns, any order) with ``wanted``'s columns cast to its
    types where another tool changed one (``float``, ``large_string``, dictionary-encoded labels:
    cast without loss, values then checked as any: ``row_problems``); the other columns as they
    are. ``(table, None)``, or ``(table, why)`` naming the first column missing or of a type
    that does not cast to the one pcd writes."""
    for field in wanted:
        if field.name not in table.column_names:
            return table, f"written without the column {field.name!r} this run writes (e.g. --all-probs)"
        column = table.column(field.name)
        if column.type == field.type:
            continue
        try:
            cast = column.cast(field.type, safe=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            return table, (f"its column {field.name!r} is {column.type}, not the {field.type} pcd writes (rewritten by "
                           "another tool?)")
        table = table.set_column(table.schema.get_field_index(field.name), field.name, cast)
    return table, None


def _row_namer(src: ReuseSource, arrow_schema: pa.Schema) -> Callable[[int], str]:
    """How a warning names row ``i`` of ``src``: by its id (``id 't3'``) where the id column is
    known (this run's id column, or the one column of ``src`` that is none of this run's columns
    nor a field's output column), else ``row i`` (from 0)."""
    from ..schema.model import JOINT_COLUMN, OUTPUT_SUFFIXES

    ours = set(arrow_schema.names)
    names = src.table.column_names
    column = arrow_schema.names[0] if arrow_schema.names[0] in names else None
    if column is None:
        others = [c for c in names if c not in ours and c != JOINT_COLUMN and not c.endswith(OUTPUT_SUFFIXES)]
        column = others[0] if len(others) == 1 else None
    if column is None:
        return lambda i: f"row {i}"
    ids = src.table.column(column)
    return lambda i: f"{column} {_cell(ids[i].as_py())}"


def _checked(table: pa.Table, schema, names: Sequence[str] | None, named: Callable[[int], str], tally: list
             ) -> pa.Table:
    """``table``'s rows pcd could have written (``row_problems`` for the fields ``names``, all
    when ``None``; no key held twice with other labels: ``_disagreeing``); ``table`` holds
    ``__row``, each row's place in its file. Adds the rows left out to ``tally`` ``[count,
    named examples]``: the first ``NAMED_ROWS`` named by ``named`` with the problem."""
    bad, why = row_problems(table, schema, names)
    keys = table.column(INPUT_KEY_COLUMN).combine_chunks()
    edited = np.zeros(table.num_rows, dtype=bool)
    for rows in _disagreeing(keys, table.select(_label_columns(table.schema, schema, names))):
        edited[rows] = True
    edited &= ~bad
    if not (bad.any() or edited.any()):
        return table
    places = table.column("__row").to_numpy()
    for row in np.flatnonzero(bad | edited):
        tally[0] += 1
        if len(tally[1]) < NAMED_ROWS:
            what = why(int(row)) if bad[row] else (f"its {INPUT_KEY_COLUMN!r} is held by another row of the file with "
                                                   "other labels: an edited key")
            tally[1].append(f"{named(int(places[row]))}: {what}")
    return table.filter(pa.array(~(bad | edited)))


def _label_columns(arrow_schema: pa.Schema, schema, names: Sequence[str] | None) -> list[str]:
    """The columns of ``arrow_schema`` that hold a decision of the fields ``names`` (all when
    ``None``): each field's value, ``__set``, ``__abstained`` and ``__changed_by_rules``. Two rows
    of one text whose probabilities differ within the packing bound agree; these must be equal."""
    from ..schema.model import ABSTAINED_SUFFIX, CHANGED_SUFFIX, SET_SUFFIX

    wanted = None if names is None else set(names)
    return [c for f in schema.declared if wanted is None or f.name in wanted
            for c in (f.name, f.name + SET_SUFFIX, f.name + ABSTAINED_SUFFIX, f.name + CHANGED_SUFFIX)
            if c in arrow_schema.names]


def _disagreeing(keys: pa.Array, labels: pa.Table) -> list[np.ndarray]:
    """The rows (ascending, one array per key) of each content key held by several rows whose
    ``labels`` (``_label_columns``) are not all equal; keys held once or with equal labels are
    left out. Cost: one group-by over the keys, then the repeated keys' labels as Python values."""
    if len(keys) < 2:
        return []
    grouped = pa.table({"k": keys, "i": pa.array(np.arange(len(keys), dtype=np.int64))}).group_by(
        "k", use_threads=False).aggregate([("i", "list")]).column("i_list").combine_chunks()
    repeated = grouped.filter(pa.array(_np(pa.compute.list_value_length(grouped)) > 1))
    if not len(repeated) or not labels.num_columns:
        return []
    groups = [np.sort(np.asarray(rows, dtype=np.int64)) for rows in repeated.to_pylist()]
    flat = np.concatenate(groups)
    values = labels.take(pa.array(flat)).to_pylist()
    out, at = [], 0
    for rows in groups:
        mine = values[at:at + len(rows)]
        at += len(rows)
        if any(v != mine[0] for v in mine[1:]):
            out.append(rows)
    return out


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
            of them but the id, by name in any order, of the same type or one that casts to it
            without loss, to be used.
        schema: this run's ``Schema``: every row lent is checked against it (``row_problems``).
        on_event: told ``reuse`` once per ``--reuse`` value (``message``: what was found, or
            why nothing is reused from it), once per value holding rows pcd would not write
            (``refused_rows``: decoded again, the first ``NAMED_ROWS`` named), and once when two
            values label a text differently (``disagreements``).
        fields: this run's declared field names (schema order), given when its fields are
            decided alone (``per_field``): a source of a job that differs in some fields only
            lends the others (``fields_reuse``: ``FieldsReuse`` groups).

    Rows that are not what pcd writes (a label outside the schema, a probability edited to junk
    or to a value its ``__probs`` contradict, a key that is no SHA-256, or one repeated in the same
    file with other labels: an edited key) are never lent: their texts are decoded again. Two
    sources that hold a text with different labels: the first given (``--reuse`` order, then
    the files of a folder or glob in name order) wins, and the warning names the texts.

    Memory: the matching sources' columns (decompressed Arrow) plus 16 bytes per row for the
    sorted key index (``_KeyIndex``). On repeated keys the first row (in ``--reuse`` order) wins.
    """

    def __init__(self, sources: Sequence[ReuseSource], parts: dict, arrow_schema: pa.Schema,
                 on_event: Callable | None = None, fields: Sequence[str] = (), *, schema):
        emit = on_event or (lambda *_a: None)
        self.columns = arrow_schema.names[1:]
        wanted = pa.schema([arrow_schema.field(n) for n in self.columns])
        tables, self.paths, names_of = [], [], []
        refused: dict[str, str] = {}
        used: dict[str, int] = {}
        lent: dict[tuple[str, ...], list[tuple[ReuseSource, pa.Table]]] = {}
        said: dict[str, tuple[tuple[str, ...], int]] = {}
        wrong: dict[str, list] = {}  # option -> [rows refused, named examples]
        for src in sources:
            why = "it holds no rows" if not src.table.num_rows else first_difference(src.parts, parts)
            table = src.table
            if why is None:
                table, why = _conformed(src.table, wanted)
            if why is not None:
                part = self._fields_part(src, parts, arrow_schema, fields) if src.table.num_rows else None
                if part is not None:
                    names, table, named = part
                    table = _checked(table, schema, names, named, wrong.setdefault(src.option, [0, []]))
                    table = table.drop_columns(["__row"])
                    lent.setdefault(names, []).append((src, table))
                    said[src.option] = (names, said.get(src.option, (names, 0))[1] + table.num_rows)
                elif FIELDS_PART in src.parts and FIELDS_PART in parts:  # name what rules out per-field reuse too
                    why = first_difference(*({k: v for k, v in p.items() if k not in PER_FIELD}
                                             for p in (src.parts, parts))) or why
                refused.setdefault(src.option, why)
                continue
            named = _row_namer(src, arrow_schema)
            keep = _checked(table.select(self.columns).append_column("__row", pa.array(np.arange(table.num_rows))),
                            schema, None, named, wrong.setdefault(src.option, [0, []]))
            names_of.append((src, named, keep.column("__row").to_numpy()))
            tables.append(keep.drop_columns(["__row"]))
            self.paths.append(src.path)
            used[src.option] = used.get(src.option, 0) + keep.num_rows
        for option, (count, examples) in wrong.items():
            if count:
                emit("reuse", {"message": f"--reuse {option}: {count} row{'s' if count > 1 else ''} not as pcd writes "
                               f"them, decoded again ({'; '.join(examples)}{'; ...' if count > len(examples) else ''})",
                               "path": option, "refused_rows": count, "examples": examples}, "warning")
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
        self._say_disagreements(emit, keys, schema, names_of)
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

    def _say_disagreements(self, emit: Callable, keys: pa.Array, schema, names_of: list) -> None:
        """Warn once when two sources hold a text with different labels (``_disagreeing``): how
        many texts, the first ``NAMED_ROWS`` by each source's row, and that the first given wins."""
        groups = _disagreeing(keys, self.table.select(_label_columns(self.table.schema, schema, None)))
        if not groups:
            return
        where = lambda row: int(np.searchsorted(self.rows_from, row, side="right") - 1)  # noqa: E731
        examples, pairs = [], {}
        for rows in groups:
            first = where(rows[0])
            row = next((r for r in rows[1:] if where(r) != first), rows[1])
            other = where(row)
            pairs[(first, other)] = pairs.get((first, other), 0) + 1
            if len(examples) < NAMED_ROWS:
                (a, name_a, rows_a), (b, name_b, rows_b) = names_of[first], names_of[other]
                examples.append(f"{name_a(int(rows_a[rows[0] - self.rows_from[first]]))} of {a.path} vs "
                                f"{name_b(int(rows_b[row - self.rows_from[other]]))} of {b.path}")
        (first, other), _ = max(pairs.items(), key=lambda kv: kv[1])
        emit("reuse", {"message": f"--reuse: {len(groups)} text{'s' if len(groups) > 1 else ''} labelled differently "
                       f"by two earlier outputs (e.g. {self.paths[first]} and {self.paths[other]}): the first given "
                       f"wins ({'; '.join(examples)}{'; ...' if len(groups) > len(examples) else ''})",
                       "disagreements": len(groups), "examples": examples,
                       "paths": sorted({self.paths[i] for pair in pairs for i in pair})}, "warning")

    @staticmethod
    def _fields_part(src: ReuseSource, parts: dict, arrow_schema: pa.Schema, fields: Sequence[str]
                     ) -> tuple[tuple[str, ...], pa.Table, Callable[[int], str]] | None:
        """What ``src`` lends field by field (``reusable_fields``): the fields and their columns
        (with ``__truncated``, the key and ``__row``, the row in ``src``) of its untruncated rows,
        and how a warning names a row of ``src`` (``_row_namer``); ``None`` when nothing."""
        if not fields:
            return None
        from ..schema.model import TRUNCATED_COLUMN

        lent = set(reusable_fields(src.parts, parts))
        names = tuple(f for f in fields if f in lent)
        if not names:
            return None
        columns = columns_of(arrow_schema, names) + [TRUNCATED_COLUMN, INPUT_KEY_COLUMN]
        table, problem = _conformed(src.table, pa.schema([arrow_schema.field(c) for c in columns]))
        if problem is not None:
            return None
        table = table.select(columns).append_column("__row", pa.array(np.arange(src.table.num_rows)))
        table = table.filter(pa.compute.invert(pa.compute.fill_null(table.column(TRUNCATED_COLUMN), True)))
        return names, table, _row_namer(src, arrow_schema)

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
            elif self.cache.capacity > 0 and key in self._group:  # --dedup-keys 0: every copy decoded
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
