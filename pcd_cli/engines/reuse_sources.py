"""The earlier outputs ``pcd label --reuse`` names: what an output records for reuse, how one is
read back and checked, and what each one lends this run (``lent_by_sources``).

An output records, per row, ``__input_sha256`` (``INPUT_KEY_COLUMN``, the content key of the text
the model read) and, in its metadata, the job fingerprint ``pcd.job_parts`` (``JOB_PARTS_KEY``,
``pcd_cli.job_fingerprint.job_parts``) and the outputs it copied rows from ``pcd.reused``
(``REUSED_KEY``). An earlier output lends this run either whole rows (the same job) or, when both
jobs decide each field alone, the fields whose own part is unchanged
(``pcd_cli.job_fingerprint.reusable_fields``). A row pcd could not have written (``row_problems``)
is never lent. ``pcd_cli.engines.reuse.ReuseIndex`` finds the rows lent by content key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
import pyarrow.parquet as pq

from ..errors import InputError
from ..job_fingerprint import FIELDS_PART, PER_FIELD, first_difference, reusable_fields
from ..results import INPUT_KEY_COLUMN

#: Output metadata: the job fingerprint (``job_parts``), a JSON object in ``PARTS`` order.
JOB_PARTS_KEY = "pcd.job_parts"
#: Output metadata: the outputs rows were copied from, a JSON list of ``{"path", "rows"}`` (and
#: ``"fields"``: those lent by an output that lends some fields only: ``ReuseIndex.reused_metadata``).
REUSED_KEY = "pcd.reused"


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
                                ORDER_SPREAD_SUFFIX, PROB_SUFFIX, PROBS_SUFFIX, RAW_PROB_SUFFIX,
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



# -- what each earlier output lends ---------------------------------------------------------------------
@dataclass
class Lent:
    """Rows one earlier output lends this run (``lent_by_sources``): ``fields``: the declared
    fields whose values they hold as this run would write them (``None``: the whole row, an
    output of the same job); ``table``: its rows pcd could have written (``row_problems``), with
    every output column but the id (whole rows), or the fields' columns, ``__truncated`` and the
    key (untruncated rows only: a cut text may be cut elsewhere by this run's longer prompts);
    ``named``: how a warning names a row of the file, by its place ``__row``."""

    source: ReuseSource
    fields: tuple[str, ...] | None
    table: pa.Table
    named: Callable[[int], str]


def lent_by_sources(sources: Sequence[ReuseSource], parts: dict, arrow_schema: pa.Schema, schema,
                    fields: Sequence[str] = (), emit: Callable = lambda *_a: None
                    ) -> dict[tuple[str, ...] | None, list[tuple[str, pa.Table]]]:
    """What the read ``--reuse`` files lend a run of job ``parts`` writing ``arrow_schema``
    (``keyed_schema``) for ``schema``, its declared ``fields`` given when each is decided alone
    (``pcd_cli.job_fingerprint.per_field``), as ``ReuseIndex`` takes them.

    A source of the same job lends whole rows, when it holds every output column but the id (by
    name in any order, of the same type or one that casts to it without loss: ``_conformed``); one
    of a job that differs in some fields only lends the others (``reusable_fields``); any other
    lends nothing. Rows that are not what pcd writes (``row_problems``, or a key held twice in a
    file with other labels: an edited key) are left out: their texts are decoded again.

    Returns:
        ``{fields lent: [(path, rows)]}``, ``None`` (whole rows) first when any, the sources in
        ``--reuse`` order; each table without ``__row``.

    Tells ``emit`` ``reuse`` once per ``--reuse`` value holding rows pcd would not write
    (``refused_rows``: decoded again, the first ``NAMED_ROWS`` named), once per value (``message``:
    what was found, or why nothing is reused from it), and once when two sources of the same job
    label a text differently (``disagreements``: the first given wins).
    """
    columns = arrow_schema.names[1:]
    wanted = pa.schema([arrow_schema.field(n) for n in columns])
    lent: dict[tuple[str, ...] | None, list[Lent]] = {None: []}
    refused: dict[str, str] = {}
    used: dict[str, int] = {}  # option -> whole rows lent
    said: dict[str, tuple[tuple[str, ...], int]] = {}  # option -> (fields lent, rows lent so)
    wrong: dict[str, list] = {}  # option -> [rows refused, named examples]
    for src in sources:
        why = "it holds no rows" if not src.table.num_rows else first_difference(src.parts, parts)
        table = src.table
        if why is None:
            table, why = _conformed(src.table, wanted)
        if why is None:
            named = _row_namer(src, arrow_schema)
            table = table.select(columns).append_column("__row", pa.array(np.arange(table.num_rows)))
            lent[None].append(Lent(src, None, _checked(table, schema, None, named, wrong.setdefault(src.option, [0, []])),
                                   named))
            used[src.option] = used.get(src.option, 0) + lent[None][-1].table.num_rows
            continue
        part = _fields_part(src, parts, arrow_schema, fields) if src.table.num_rows else None
        if part is not None:
            names, table, named = part
            table = _checked(table, schema, names, named, wrong.setdefault(src.option, [0, []]))
            lent.setdefault(names, []).append(Lent(src, names, table, named))
            said[src.option] = (names, said.get(src.option, (names, 0))[1] + table.num_rows)
        elif FIELDS_PART in src.parts and FIELDS_PART in parts:  # name what rules out per-field reuse too
            why = first_difference(*({k: v for k, v in p.items() if k not in PER_FIELD}
                                     for p in (src.parts, parts))) or why
        refused.setdefault(src.option, why)
    _say_lent(emit, refused, used, said, wrong, fields)
    _say_disagreements(emit, lent[None], schema)
    return {names: [(one.source.path, one.table.drop_columns(["__row"])) for one in found]
            for names, found in lent.items() if found}


def _say_lent(emit: Callable, refused: dict[str, str], used: dict[str, int], said: dict, wrong: dict[str, list],
              fields: Sequence[str]) -> None:
    """Tell each ``--reuse`` value's rows refused, then what it lends or why nothing (``lent_by_sources``)."""
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


def _say_disagreements(emit: Callable, same_job: list[Lent], schema) -> None:
    """Warn once when two sources of the same job hold a text with different labels
    (``_disagreeing``): how many texts, the first ``NAMED_ROWS`` by each source's row, and that
    the first given wins."""
    if not same_job:
        return
    table = pa.concat_tables([one.table for one in same_job])
    groups = _disagreeing(table.column(INPUT_KEY_COLUMN).combine_chunks(),
                          table.select(_label_columns(table.schema, schema, None)))
    if not groups:
        return
    rows_from = np.cumsum([0] + [one.table.num_rows for one in same_job])
    places = table.column("__row").to_numpy()
    where = lambda row: int(np.searchsorted(rows_from, row, side="right") - 1)  # noqa: E731
    examples, pairs = [], {}
    for rows in groups:
        first = where(rows[0])
        row = next((r for r in rows[1:] if where(r) != first), rows[1])
        other = where(row)
        pairs[(first, other)] = pairs.get((first, other), 0) + 1
        if len(examples) < NAMED_ROWS:
            a, b = same_job[first], same_job[other]
            examples.append(f"{a.named(int(places[rows[0]]))} of {a.source.path} vs "
                            f"{b.named(int(places[row]))} of {b.source.path}")
    (first, other), _ = max(pairs.items(), key=lambda kv: kv[1])
    path = lambda i: same_job[i].source.path  # noqa: E731
    emit("reuse", {"message": f"--reuse: {len(groups)} text{'s' if len(groups) > 1 else ''} labelled differently "
                   f"by two earlier outputs (e.g. {path(first)} and {path(other)}): the first given "
                   f"wins ({'; '.join(examples)}{'; ...' if len(groups) > len(examples) else ''})",
                   "disagreements": len(groups), "examples": examples,
                   "paths": sorted({path(i) for pair in pairs for i in pair})}, "warning")


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


def _quoted(names: Sequence[str]) -> str:
    return ", ".join(repr(n) for n in names)
