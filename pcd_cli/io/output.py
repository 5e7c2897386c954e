"""The Parquet output: its columns per field type, one table per batch of results, and the
sink that writes it whole or not at all.

Columns (``output_schema``): the id, then per declared field its value and numbers (see
``output_schema`` for every type), ``__truncated`` last. A multi field's options are decided
one by one (``Schema.fields``) and written together (``chosen_options``, ``multi_columns``).
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import SchemaError
from ..results import RecordResult
from ..schema.model import (
    ABSTAINED_SUFFIX,
    CHANGED_SUFFIX,
    EXPECTED_SUFFIX,
    JOINT_COLUMN,
    MASS_SUFFIX,
    ORDER_SPREAD_SUFFIX,
    STEERED_SUFFIX,
    PROB_SUFFIX,
    PROBS_SUFFIX,
    RAW_PROB_SUFFIX,
    SET_SUFFIX,
    TRUNCATED_COLUMN,
    Schema,
    schema_metadata,
)
from ..schema.rules import rule_fields, rules_metadata
from ..version import __version__
from .files import AtomicFile, machine_errors

#: Who owns a column that is not a field's (``output_columns``), as clash messages name them.
ID_OWNER = "the id column"
TRUNCATED_OWNER = "pcd's truncation column"
RULES_OWNER = "a column the schema's rules add"


def base_metadata(model: str, schema: Schema) -> dict[str, str]:
    """The key-value metadata every output carries, whoever writes it: ``pcd.version``, ``pcd.model``,
    the schema's part (``schema_metadata``), its rules' part (``rules_metadata``) and
    ``pcd.created_utc`` (UTC, to the second). ``Labeler.metadata`` adds the decoder's part and
    ``RunStats.metadata`` the run's counts."""
    return {"pcd.version": __version__, "pcd.model": model, **schema_metadata(schema),
            "pcd.created_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            **rules_metadata(schema)}


def output_schema(schema: Schema, id_column: str, id_type: pa.DataType, *, all_probs: bool,
                  calibrated: bool = False, sets: tuple[str, ...] = (), abstain: tuple[str, ...] = (),
                  spread: bool = False, steered: bool = False) -> pa.Schema:
    """Arrow schema of the output: id, then per declared field ``<f>``, ``<f>__prob``,
    ``<f>__mass`` (with a calibration, ``<f>__raw_prob``; with ``all_probs``, ``<f>__probs``;
    for ordinal and integer fields ``<f>__expected``; for the fields named in ``sets``,
    ``<f>__set``, the conformal label set as a list of labels; for those in ``abstain``,
    ``<f>__abstained``, true where the label was left null; with ``spread`` (``--permutations``)
    ``<f>__order_spread``, how far the label orderings disagree; with rules between fields
    (``pcd_cli.schema.rules``) ``<f>__changed_by_rules`` for each field they name, then
    ``__joint_prob``); with ``steered`` (the steering check, ``pcd_cli.steering``) ``<f>__steered``,
    true where the label moved once the sentences addressing the labeller were taken out (the
    label written is then the one without them); then ``__truncated``.

    Types: booleans ``bool``, integers ``int64``, enum and ordinal labels ``string`` (the null
    option of a nullable field is a null). A multi field: ``<f>`` a ``list<string>`` of the
    chosen options in option order, ``<f>__prob`` the probability of that choice (the product
    over options of P(yes) or P(no) as chosen), ``<f>__mass`` the smallest candidate mass of its
    option decisions, ``<f>__probs`` (always) a map option -> P(yes).
    """
    return pa.schema([column for column, _ in output_columns(schema, id_column, id_type, all_probs=all_probs,
                                                             calibrated=calibrated, sets=sets, abstain=abstain,
                                                             spread=spread, steered=steered)])


def output_columns(schema: Schema, id_column: str, id_type: pa.DataType, *, all_probs: bool,
                   calibrated: bool = False, sets: tuple[str, ...] = (), abstain: tuple[str, ...] = (),
                   spread: bool = False, steered: bool = False) -> list[tuple[pa.Field, str]]:
    """The output's columns in order (``output_schema``), each with its owner: ``ID_OWNER``,
    ``"a column of field 'x'"``, ``RULES_OWNER`` or ``TRUNCATED_OWNER``. The one place that
    names output columns: ``check_columns`` and the writer both read them from here."""
    cols = [(pa.field(id_column, id_type), ID_OWNER)]
    ruled = set(rule_fields(schema))
    for f in schema.declared:
        owner = f"a column of field {f.name!r}"
        cols.append((pa.field(f.name, _value_type(f)), owner))
        cols.append((pa.field(f.name + PROB_SUFFIX, pa.float32()), owner))
        cols.append((pa.field(f.name + MASS_SUFFIX, pa.float32()), owner))
        if calibrated:
            cols.append((pa.field(f.name + RAW_PROB_SUFFIX, pa.float32()), owner))
        if all_probs or f.is_multi:
            cols.append((pa.field(f.name + PROBS_SUFFIX, pa.map_(pa.string(), pa.float32())), owner))
        if f.is_scale:
            cols.append((pa.field(f.name + EXPECTED_SUFFIX, pa.float32()), owner))
        if f.name in sets:
            cols.append((pa.field(f.name + SET_SUFFIX, pa.list_(pa.string())), owner))
        if f.name in abstain:
            cols.append((pa.field(f.name + ABSTAINED_SUFFIX, pa.bool_()), owner))
        if spread and not f.is_multi:
            cols.append((pa.field(f.name + ORDER_SPREAD_SUFFIX, pa.float32()), owner))
        if steered:
            cols.append((pa.field(f.name + STEERED_SUFFIX, pa.bool_()), owner))
        if f.name in ruled:
            cols.append((pa.field(f.name + CHANGED_SUFFIX, pa.bool_()), RULES_OWNER))
    if ruled:
        cols.append((pa.field(JOINT_COLUMN, pa.float32()), RULES_OWNER))
    cols.append((pa.field(TRUNCATED_COLUMN, pa.bool_()), TRUNCATED_OWNER))
    return cols


def check_columns(schema: Schema, id_col: str, *, all_probs: bool = True) -> None:
    """Refuse a schema whose output columns would clash with each other or with the id column,
    reading the names off ``output_columns`` (with a calibration's ``__raw_prob`` columns, which a
    later ``--calibration`` adds).

    Raises:
        SchemaError: names the two clashing columns (e.g. a field ``x__prob`` next to field
            ``x``, a field named ``__truncated``, or ``--id-field sentiment__prob``).
    """
    schema.check_output_columns(id_col)
    if id_col == TRUNCATED_COLUMN:
        raise SchemaError(f"--id-field {id_col!r} clashes with pcd's output column {TRUNCATED_COLUMN!r}")
    columns = output_columns(schema, id_col, pa.string(), all_probs=all_probs, calibrated=True, steered=True)
    if schema.rules and id_col in (c.name for c, owner in columns if owner == RULES_OWNER):
        raise SchemaError(f"--id-field {id_col!r} clashes with an output column the schema's rules add")
    # the id and record columns first, so a field's column is named as the one that clashes
    ordered = sorted(columns, key=lambda c: not (c[1] in (ID_OWNER, TRUNCATED_OWNER)))
    seen: dict[str, str] = {}
    for column, owner in ordered:
        if column.name in seen:
            raise SchemaError(f"output column {column.name!r} of field {owner.split('field ', 1)[-1]} clashes with "
                              f"{seen[column.name]}; rename the field"
                              + (" or pass another --id-field" if column.name == id_col else ""))
        seen[column.name] = owner


def _value_type(field) -> pa.DataType:
    if field.is_multi:
        return pa.list_(pa.string())
    return {"boolean": pa.bool_(), "integer": pa.int64()}.get(field.type, pa.string())


def results_table(results: list[RecordResult], schema: Schema, arrow_schema: pa.Schema) -> pa.Table:
    """Results as a table of ``arrow_schema`` (from ``output_schema``), one row per result."""
    data: dict[str, list] = {arrow_schema.names[0]: [r.id for r in results]}
    names = set(arrow_schema.names[1:])  # the id column may end in __probs
    for f, part in schema.declared_parts():
        if f"{f.name}{STEERED_SUFFIX}" in names:
            data[f"{f.name}{STEERED_SUFFIX}"] = [any(r.fields[i].steered for i in part) for r in results]
        if f.is_multi:
            data.update(multi_columns(f, [[r.fields[i] for i in part] for r in results], names))
            continue
        i = part[0]
        data[f.name] = [r.fields[i].value for r in results]
        data[f"{f.name}__prob"] = [r.fields[i].prob for r in results]
        data[f"{f.name}__mass"] = [r.fields[i].mass for r in results]
        if f"{f.name}__raw_prob" in names:
            data[f"{f.name}__raw_prob"] = [r.fields[i].raw_prob for r in results]
        if f"{f.name}__probs" in names:
            data[f"{f.name}__probs"] = [list(zip(f.labels, r.fields[i].probs)) for r in results]
        if f.is_scale:
            data[f"{f.name}__expected"] = [expected_value(f, r.fields[i].probs) for r in results]
        if f"{f.name}__set" in names:
            data[f"{f.name}__set"] = [None if r.fields[i].label_set is None else
                                      [f.labels[j] for j in r.fields[i].label_set] for r in results]
        if f"{f.name}__abstained" in names:
            data[f"{f.name}__abstained"] = [r.fields[i].abstained for r in results]
        if f"{f.name}__order_spread" in names:
            data[f"{f.name}__order_spread"] = [r.fields[i].order_spread for r in results]
        if f"{f.name}{CHANGED_SUFFIX}" in names:
            data[f"{f.name}{CHANGED_SUFFIX}"] = [r.fields[i].changed_by_rules for r in results]
    if JOINT_COLUMN in names:
        data[JOINT_COLUMN] = [r.joint_prob for r in results]
    data[TRUNCATED_COLUMN] = [r.truncated for r in results]
    return pa.Table.from_pydict(data, schema=arrow_schema)


def expected_value(field, probs) -> float | None:
    """``<f>__expected`` of an ordinal or integer field: the probability-weighted value (an
    integer's value, an ordinal label's position from 0) over the labels on the scale, the
    probabilities renormalised over them (the null option and ``none_label`` left out);
    ``None`` when they hold no probability."""
    values = field.scale_values()
    total = sum(probs[i] for i, _ in values)
    if total <= 0:
        return None
    return float(sum(probs[i] * v for i, v in values) / total)


def chosen_options(field, p_yes: list[float], decided: list[bool | None] | None = None) -> list[int]:
    """Indices of the options a multi field writes, in option order: those with P(yes) >=
    ``field.threshold`` (an option whose ``decided`` entry is not ``None``: as it says, the
    calibration's decision rule: ``option_decisions``); the most probable others are added up
    to ``min_items``, and only the ``max_items`` most probable are kept (ties: option order)."""
    decided = decided or [None] * len(p_yes)
    chosen = {i for i, p in enumerate(p_yes) if (p >= field.threshold if decided[i] is None else decided[i])}
    ranked = sorted(range(len(p_yes)), key=lambda i: (-p_yes[i], i))
    for i in ranked:
        if len(chosen) >= field.min_items:
            break
        chosen.add(i)
    if field.max_items is not None and len(chosen) > field.max_items:
        chosen = set([i for i in ranked if i in chosen][: field.max_items])
    return sorted(chosen)


def option_decisions(options) -> list[bool | None]:
    """Per option decision (``FieldResult``): ``True``/``False`` when a decision rule chose its
    label (``by_rule``; label 0 is ``true``), else ``None`` (the field's threshold decides)."""
    return [res.label == 0 if res.by_rule else None for res in options]


def declared_values(schema: Schema, result: RecordResult) -> dict:
    """One result's written value per declared field: a multi field's chosen options (a
    list, ``chosen_options``), every other field its ``FieldResult.value``."""
    out = {}
    for f, part in schema.declared_parts():
        if f.is_multi:
            options = [result.fields[d] for d in part]
            out[f.name] = [f.labels[i] for i in chosen_options(f, [r.probs[0] for r in options],
                                                                option_decisions(options))]
        else:
            out[f.name] = result.fields[part[0]].value
    return out


def multi_columns(field, rows: list[list], names: set[str]) -> dict[str, list]:
    """The output columns of a multi field (see ``output_schema``) from its option decisions'
    ``FieldResult`` values per row (option order; label 0 = true)."""
    out: dict[str, list] = {field.name: [], f"{field.name}__prob": [], f"{field.name}__mass": [],
                            f"{field.name}__probs": []}
    raw = f"{field.name}__raw_prob" in names
    if raw:
        out[f"{field.name}__raw_prob"] = []
    for options in rows:
        p_yes = [res.probs[0] for res in options]
        chosen = set(chosen_options(field, p_yes, option_decisions(options)))
        out[field.name].append([field.labels[i] for i in sorted(chosen)])
        out[f"{field.name}__prob"].append(float(np.prod([p if i in chosen else 1 - p for i, p in enumerate(p_yes)])))
        out[f"{field.name}__mass"].append(min(res.mass for res in options))
        out[f"{field.name}__probs"].append(list(zip(field.labels, p_yes)))
        if raw:
            raw_yes = [res.probs[0] if res.raw_probs is None else res.raw_probs[0] for res in options]
            out[f"{field.name}__raw_prob"].append(
                float(np.prod([p if i in chosen else 1 - p for i, p in enumerate(raw_yes)])))
    return out


class ParquetSink:
    """Writes tables row group by row group; ``close()`` renames the finished file into place
    (through a symlink to its target: ``pcd_cli.io.files.AtomicFile``).

    Args:
        path: final output path. arrow_schema: its columns and key-value metadata.

    Raises:
        MachineError: the file cannot be created, written or renamed; the temporary file is
            removed and an earlier output stays as it was.
    """

    def __init__(self, path: str | Path, arrow_schema: pa.Schema):
        self.path = Path(path)
        self.arrow_schema = arrow_schema
        self._file = AtomicFile(self.path)
        try:
            with machine_errors(self.path):
                self._writer = pq.ParquetWriter(self._file.tmp, self.arrow_schema)
        except BaseException:
            self._file.abort()
            raise
        self.rows = 0

    def write_table(self, table: pa.Table) -> None:
        if table.num_rows:
            with machine_errors(self.path):
                self._writer.write_table(table.replace_schema_metadata(self.arrow_schema.metadata))
            self.rows += table.num_rows

    def close(self) -> None:
        """Finish the file and rename it over the output (its symlink's target, if it is one)."""
        try:
            with machine_errors(self.path):
                self._writer.close()
        except BaseException:
            self._file.abort()
            raise
        self._file.commit()

    def abort(self) -> None:
        try:
            self._writer.close()
        except OSError:
            pass
        finally:
            self._file.abort()
