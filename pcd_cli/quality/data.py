"""Gold and prediction files -> aligned arrays per field, with every dropped row counted.

A *predictions* frame is a pcd output Parquet read with pandas: an id column, then per field
``<f>``, ``<f>__prob``, ``<f>__mass``, optionally ``<f>__probs`` (a list of ``(label, prob)``
pairs in the schema's label order) and ``<f>__raw_prob``, then ``__truncated``. A multi-select
field's ``<f>`` is a list of the chosen options and its ``<f>__probs`` (always written) maps
each option to P(yes). A *gold* frame has an id column and one column per field that has
human labels (``gold_label_index``, ``gold_options``): booleans as JSON booleans or the
strings ``true``/``false`` (any case), enum and ordinal labels as the exact label strings,
integers as numbers or decimal strings, a multi-select field as a list of its options (in a
CSV cell: a JSON list, or options separated by ``|`` or ``,``). A null or empty gold cell
means "no gold" (not evaluated); to score a nullable field's null option the gold cell
holds the string ``"null"``. Ids are matched as strings.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import InputError
from ..results import INPUT_KEY_COLUMN, input_key
from ..io.readers import InputSpec, ReplacedRow, ReplacedRows, detect_format, read_table_rows, row_to_record
from ..io.values import occurrence_keys
from ..schema.model import NULL_LABEL, Field, FieldKind, Schema, whole_number
from .folds import group_index

#: ``DataFrame.attrs`` key under which ``read_predictions`` keeps the Parquet key-value metadata.
METADATA_ATTR = "metadata"
#: Metadata key holding the compact JSON ``{field: [labels...]}`` (written by ``Labeler.metadata``).
SCHEMA_JSON_KEY = "pcd.schema_json"
#: Metadata key holding ``{field: {"type", "nullable", "none_label", ...}}`` for the fields that are
#: not plain booleans or enums (``schema.schema_metadata``).
FIELD_TYPES_KEY = "pcd.field_types"
#: Separators of a multi-select gold value written as one string (a CSV cell): ``|`` if present, else ``,``.
MULTI_SEPARATORS = ("|", ",")
#: Distinct invalid gold values quoted per field in reports.
MAX_INVALID_EXAMPLES = 5


@dataclass(frozen=True)
class FieldSpec(FieldKind):
    """What evaluation needs of a field: its name, labels in schema order, and type.

    Attributes:
        type: ``boolean``, ``enum``, ``ordinal``, ``integer`` or ``multi`` (``""``: boolean or
            enum after ``is_boolean``). For ``multi``, ``labels`` are the options.
        nullable: the last label is ``NULL_LABEL`` (a null prediction is that label).
        none_label: the ordinary "none of these" label, if any (off the scale of an ordinal).
    """

    name: str
    labels: tuple[str, ...]
    is_boolean: bool
    type: str = ""
    nullable: bool = False
    none_label: str | None = None

    def __post_init__(self) -> None:
        if not self.type:
            object.__setattr__(self, "type", "boolean" if self.is_boolean else "enum")

    @classmethod
    def of(cls, field: Field) -> "FieldSpec":
        """The spec of a declared schema field."""
        return cls(field.name, tuple(field.labels), field.is_boolean, field.type, field.nullable, field.none_label)


    def scale_values(self) -> np.ndarray:
        """(k,) float64 value of each label on the scale (integers their value, ordinal labels
        their position from 0, as ``<f>__expected``); NaN for the null option and the
        ``none_label``, which are off the scale."""
        field = Field(self.name, self.type, "", self.labels, nullable=self.nullable, none_label=self.none_label)
        out = np.full(len(self.labels), np.nan)
        for i, value in field.scale_values():  # the one rule, shared with <f>__expected
            out[i] = value
        return out


@dataclass(frozen=True)
class FieldData:
    """One field's evaluated rows, aligned (``n`` rows: matched, gold not null, gold a label).

    Attributes:
        spec: the field.
        ids: (n,) record ids as strings.
        gold: (n,) int64 gold label indices into ``spec.labels``.
        pred: (n,) int64 predicted label indices.
        prob: (n,) float64 ``<f>__prob``, the chosen label's probability.
        mass: (n,) float64 ``<f>__mass``, the candidate mass.
        probs: (n, k) float64 ``<f>__probs`` in label order, or ``None`` without that column.
        gold_null: matched rows whose gold value is null/empty (not evaluated).
        gold_invalid: matched rows whose gold value is not a label (not evaluated).
        invalid_values: up to ``MAX_INVALID_EXAMPLES`` (value, count) pairs, most frequent first.
        abstained: matched rows with a gold label whose predicted label is null (``pcd label
            --abstain-unless-single``): not in ``gold``/``pred``, counted here.
        set_gold, sets: with a ``<f>__set`` column, the gold label and the label set of every
            matched row with a gold label (abstained ones included); ``None`` otherwise.
        inputs: (n,) each row's model input key (the predictions' ``__input_sha256``:
            ``pcd_cli.results.input_key`` of the text the model read), ``None`` per row without
            one; ``None`` when the predictions have no such column. Copies of one text are one
            group in every fold and bootstrap (``pcd_cli.quality.folds``).
    """

    spec: FieldSpec
    ids: np.ndarray
    gold: np.ndarray
    pred: np.ndarray
    prob: np.ndarray
    mass: np.ndarray
    probs: np.ndarray | None
    gold_null: int
    gold_invalid: int
    invalid_values: tuple[tuple[str, int], ...]
    abstained: int = 0
    set_gold: tuple[str, ...] | None = None
    sets: tuple[tuple[str, ...], ...] | None = None
    inputs: np.ndarray | None = None

    def groups(self) -> np.ndarray:
        """(n,) group numbers of the rows by model input (``folds.group_index`` of ``inputs``;
        every row its own group without them)."""
        return group_index(self.inputs, len(self.gold))


@dataclass(frozen=True)
class MultiFieldData:
    """One multi-select field's evaluated rows, aligned (``n`` rows: matched, gold a list of
    options), ``k`` options in schema order.

    Attributes:
        spec: the field (``labels`` are its options).
        ids: (n,) record ids as strings.
        gold, pred: (n, k) bool: option in the gold list / in the predicted ``<f>`` list.
        p_yes: (n, k) float64 P(yes) per option, from ``<f>__probs``.
        prob: (n,) ``<f>__prob`` (the probability of the whole choice); mass: (n,) ``<f>__mass``.
        gold_null, gold_invalid, invalid_values, abstained, inputs: as ``FieldData``.
    """

    spec: FieldSpec
    ids: np.ndarray
    gold: np.ndarray
    pred: np.ndarray
    p_yes: np.ndarray
    prob: np.ndarray
    mass: np.ndarray
    gold_null: int
    gold_invalid: int
    invalid_values: tuple[tuple[str, int], ...]
    abstained: int = 0
    inputs: np.ndarray | None = None

    def option_data(self) -> list[FieldData]:
        """One boolean ``FieldData`` per option, named ``<field>.<option>`` as the schema's
        option decisions (label 0 = ``true``): what ``pcd calibrate`` fits per option."""
        out = []
        for j, option in enumerate(self.spec.labels):
            gold = np.where(self.gold[:, j], 0, 1).astype(np.int64)
            pred = np.where(self.pred[:, j], 0, 1).astype(np.int64)
            probs = np.column_stack([self.p_yes[:, j], 1 - self.p_yes[:, j]])
            out.append(FieldData(spec=FieldSpec(f"{self.spec.name}.{option}", ("true", "false"), True),
                                 ids=self.ids, gold=gold, pred=pred, prob=probs[np.arange(len(pred)), pred],
                                 mass=self.mass, probs=probs, gold_null=self.gold_null,
                                 gold_invalid=self.gold_invalid, invalid_values=self.invalid_values,
                                 inputs=self.inputs))
        return out


@dataclass(frozen=True)
class Joined:
    """Predictions and gold matched by id.

    Attributes:
        fields: one ``FieldData`` (``MultiFieldData`` for a multi-select field) per field
            present in both files, schema order.
        fields_without_gold: fields of the predictions with no gold column.
        gold_rows, prediction_rows: rows in each input.
        matched: gold rows with a prediction.
        gold_without_prediction, predictions_without_gold: unmatched rows of each side.
        unmatched_gold_ids: up to 5 ids of gold rows with no prediction (for messages).
        id_column: the predictions' id column.
        answered, matched_answered: gold rows with an answer (a gold value for some field:
            not a skipped or untouched task), and those of them with a prediction.
        gold_column: per field, the gold column read for it (its name, or the name
            ``annotations.server_name`` gives it, as ``pcd review --to argilla`` writes it).
        repeated_ids: a warning per side whose ids repeat (``id_keys``; matched by order).
    """

    fields: tuple[FieldData | MultiFieldData, ...]
    fields_without_gold: tuple[str, ...]
    gold_rows: int
    prediction_rows: int
    matched: int
    gold_without_prediction: int
    predictions_without_gold: int
    unmatched_gold_ids: tuple[str, ...]
    id_column: str
    answered: int = 0
    matched_answered: int = 0
    gold_column: tuple[tuple[str, str], ...] = ()
    repeated_ids: tuple[str, ...] = ()


def read_predictions(path: str | Path) -> tuple[pd.DataFrame, dict[str, str]]:
    """Read a pcd output Parquet: the frame (metadata also in ``df.attrs[METADATA_ATTR]``) and its
    key-value metadata.

    Raises:
        InputError: missing or not a Parquet file.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{str(path)!r}: no such predictions file")
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(f"{str(path)!r}: not a readable Parquet file ({exc}); predictions must be a pcd "
                         "output (pcd label ... -o FILE.parquet)") from None
    metadata = {k.decode(errors="replace"): v.decode(errors="replace")
                for k, v in (table.schema.metadata or {}).items() if not k.startswith(b"ARROW:")}
    frame = table.to_pandas()
    frame.attrs[METADATA_ATTR] = metadata
    return frame, metadata


def read_gold(path: str | Path, *, id_field: str = "id", fmt: str | None = None,
              csv_delimiter: str = ",", encoding_errors: str = "strict") -> pd.DataFrame:
    """Read a gold file (JSONL, CSV with ``csv_delimiter``, or Parquet) into a frame, every column kept.

    JSONL values keep their JSON types; CSV cells are strings (an empty cell is null); with
    ``encoding_errors="replace"`` a row's bytes that are not UTF-8 read as U+FFFD, the rows named
    in the notes' warnings (else such a row refuses the file). A Label
    Studio JSON export, an Argilla export (a records JSON file or a ``to_disk`` folder) and a
    filled ``pcd review --to csv`` spreadsheet are read as gold too (``pcd_cli.io.annotations``);
    their notes (each row's counted answers, whether a response status was read, warnings) are
    in ``frame.attrs[annotations.GOLD_ATTR]``. Without an ``id_field`` column, a ``row`` column
    (what ``pcd review`` writes for an output whose ids are row numbers) is the id, renamed
    ``id_field``.

    Raises:
        InputError: missing file, unknown format, an unreadable row (names its line), no
            ``id_field`` (nor ``row``) column, an unusable annotation-tool export (names the task
            or record), Label Studio's CSV export.
    """
    from ..io.annotations import GOLD_ATTR, is_export, is_label_studio_csv, normalize_row, read_export, take_notes

    path = Path(path)
    shown = repr(str(path))
    if not path.is_file() and not path.is_dir():
        raise InputError(f"{shown}: no such gold file")
    kind = "export" if fmt is None and is_export(path) else detect_format(path, fmt)
    replaced = ReplacedRows()  # rows read with --encoding-errors replace whose bytes were replaced
    if kind == "export":
        _, rows = read_export(path, id_field=id_field)
    elif kind == "parquet":
        try:
            frame = pq.read_table(path).to_pandas()
        except (pa.ArrowInvalid, OSError) as exc:
            raise InputError(f"{shown}: not a readable Parquet file ({exc})") from None
        rows = [normalize_row(r) for r in frame.to_dict("records")] \
            if any(str(c).endswith(("__gold", ".responses")) for c in frame.columns) else None
    else:
        spec = InputSpec(text_field=id_field, csv_delimiter=csv_delimiter, encoding_errors=encoding_errors)
        rows = []
        for line, row in read_table_rows(path, spec, fmt=fmt):  # compressed gold files too
            if isinstance(row, ReplacedRow):
                replaced.add(line)
            if isinstance(row, str):
                raise InputError(f"{shown} line {line}: {row}; fix the gold file (every gold row counts)")
            if kind == "csv" and not rows and is_label_studio_csv(row):
                raise InputError(f"{shown}: a Label Studio CSV export (columns annotator, annotation_id, lead_time): "
                                 "one row per annotation, its 'id' Label Studio's own task id, skipped annotations "
                                 "dropped without a trace and several choices as a JSON cell; export as JSON (the "
                                 "full format) instead")
            rows.append(normalize_row({k: (None if v == "" else v) for k, v in row.items()} if kind == "csv" else row))
    notes = take_notes(rows, id_field, shown) if rows is not None else {"answers": {}, "status": None, "warnings": []}
    if replaced.count:  # --encoding-errors replace: the rows are named, as pcd label names them
        notes["warnings"] = [*notes.get("warnings", ()), f"{shown}: {replaced.message()}"]
    if rows is not None:
        frame = pd.DataFrame.from_records(rows) if rows else pd.DataFrame({id_field: []})
    if id_field not in frame.columns and "row" in frame.columns:
        frame = frame.rename(columns={"row": id_field})  # pcd review's id for an output without ids
    if id_field not in frame.columns:
        raise InputError(f"{shown}: no id column {id_field!r} (columns: {', '.join(map(str, frame.columns))}); "
                         "pass --id-field")
    frame.attrs[GOLD_ATTR] = notes
    return frame


def drop_example_rows(gold: pd.DataFrame, examples, spec: InputSpec) -> tuple[pd.DataFrame, int]:
    """Gold rows whose text (as ``spec`` builds it) is the input of a few-shot example, removed:
    a calibration must not be fitted on rows the model saw answered in its prompt.

    Args:
        examples: ``pcd_cli.schema.model.Example`` values (``Labeler.examples``).

    Returns:
        (the other rows, how many were removed).
    """
    texts = {e.render_text(spec.template).strip() for e in examples}
    if not texts or gold.empty:
        return gold, 0
    records = gold.astype(object).where(gold.notna(), None).to_dict("records")
    keep = [getattr(row_to_record(r, i, None, spec), "text", None) not in texts for i, r in enumerate(records)]
    return gold[keep], len(keep) - sum(keep)


def input_keys(gold: pd.DataFrame, spec: InputSpec) -> list[str | None]:
    """Each row's model input key: ``pcd_cli.results.input_key`` of its record text as ``spec``
    builds it (``--text-field`` or ``--template``), the key ``pcd label`` writes in
    ``__input_sha256``; ``None`` for a row that makes no record (a failure)."""
    records = gold.astype(object).where(gold.notna(), None).to_dict("records")
    texts = [getattr(row_to_record(r, i, None, spec), "text", None) for i, r in enumerate(records)]
    return [input_key(t) if isinstance(t, str) else None for t in texts]


def field_specs(predictions: pd.DataFrame, schema: Schema | None) -> list[FieldSpec]:
    """The fields to evaluate, as declared (a multi-select field once, its options as labels):
    from ``schema`` if given, else from the predictions' metadata (``pcd.schema_json``, types
    from ``pcd.field_types``), else from the columns (``<f>`` next to ``<f>__prob``; labels from
    ``<f>__probs``, or ``true``/``false`` for a boolean column; a list column is a multi field).

    Raises:
        InputError: a schema field has no column in the predictions; the labels of a field
            cannot be found (pass the schema).
    """
    columns = set(map(str, predictions.columns))
    if schema is not None:
        missing = [f.name for f in schema.declared if f.name not in columns or f"{f.name}__prob" not in columns]
        if len(missing) == len(schema.declared):
            raise InputError(f"the predictions have no column of schema {schema.name!r} (fields: "
                             f"{', '.join(f.name for f in schema.declared)}); were they labelled with this schema?")
        if missing:
            raise InputError(f"the predictions have no column {missing[0]!r} of the schema; were they labelled "
                             "with this schema?")
        return [FieldSpec.of(f) for f in schema.declared]
    meta = predictions.attrs.get(METADATA_ATTR) or {}
    names = [c for c in map(str, predictions.columns) if f"{c}__prob" in columns and f"{c}__mass" in columns]
    if not names:
        raise InputError("the predictions have no pcd field columns (<field>, <field>__prob, <field>__mass); "
                         "is this a pcd output?")
    declared, types = _json_object(meta, SCHEMA_JSON_KEY), _json_object(meta, FIELD_TYPES_KEY)
    specs = []
    for name in names:
        is_bool = pd.api.types.is_bool_dtype(predictions[name].dtype)
        options = types.get(name) if isinstance(types.get(name), dict) else {}
        ftype = options.get("type") if options.get("type") in ("boolean", "enum", "ordinal", "integer", "multi") \
            else None
        if ftype is None:
            first_value = next((cell for cell in predictions[name] if _is_present(cell)), None)
            ftype = "boolean" if is_bool else "multi" if _has_pairs(first_value) else "enum"
        labels = declared.get(name)
        if not labels and is_bool:
            labels = ["true", "false"]
        if not labels and f"{name}__probs" in columns:
            first = next((cell for cell in predictions[f"{name}__probs"] if _has_pairs(cell)), None)
            labels = [label for label, _ in _pairs(first).items()] if first is not None else None
        if not labels or not isinstance(labels, list):
            raise InputError(f"field {name!r}: the labels are not recorded in the predictions; pass --schema")
        none_label = options.get("none_label")
        specs.append(FieldSpec(name, tuple(map(str, labels)), ftype == "boolean", ftype,
                               bool(options.get("nullable")) and str(labels[-1]) == NULL_LABEL,
                               none_label if isinstance(none_label, str) else None))
    return specs


def _json_object(meta: dict, key: str) -> dict:
    """A metadata value holding a JSON object; ``{}`` when absent or not one."""
    try:
        value = json.loads(meta[key]) if key in meta else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def join(predictions: pd.DataFrame, gold: pd.DataFrame, specs: list[FieldSpec], *,
         id_field: str = "id") -> Joined:
    """Match gold rows to predictions by id (as strings) and align each field's arrays.

    The predictions' id column is ``id_field`` if it has one, else ``row`` (outputs labelled
    without ``--id-field``).

    Raises:
        InputError: no id column; an empty id; no gold rows, or no gold id
            among the predictions; no field in both files; a
            prediction value that is not a label; ``<f>__probs`` labels that differ from the
            field's.
    """
    if id_field not in gold.columns:
        raise InputError(f"the gold rows have no id column {id_field!r}; pass --id-field")
    pred_id = id_field if id_field in predictions.columns else "row" if "row" in predictions.columns else None
    if pred_id is None:
        raise InputError(f"the predictions have no id column {id_field!r} (nor 'row'); pass the --id-field "
                         "used when labelling")
    pred_ids, pred_repeats = id_keys(predictions[pred_id], "predictions", pred_id)
    gold_ids, gold_repeats = id_keys(gold[id_field], "gold", id_field)
    pred_pos = {rid: i for i, rid in enumerate(pred_ids)}
    gold_pos = {rid: i for i, rid in enumerate(gold_ids)}
    matched_gold = np.array([i for i, rid in enumerate(gold_ids) if rid in pred_pos], dtype=np.int64)
    matched_pred = np.array([pred_pos[gold_ids[i]] for i in matched_gold], dtype=np.int64)
    unmatched = [rid for rid in gold_ids if rid not in pred_pos]
    if not gold_ids:
        raise InputError("the gold file has no rows")
    if not len(matched_gold):
        seen = f"e.g. {pred_ids[0]!r} in column {pred_id!r}" if pred_ids else "none: the predictions have no rows"
        raise InputError(f"no gold id matches a prediction id (gold ids e.g. {gold_ids[0]!r} in column {id_field!r}; "
                         f"prediction ids {seen}); pass the --id-field used when labelling")
    gold, columns = _gold_columns(gold, specs, gold_ids)
    fields, without = [], []
    for spec in specs:
        if spec.name not in gold.columns:
            without.append(spec.name)
            continue
        build = _multi_field_data if spec.is_multi else _field_data
        fields.append(build(spec, predictions, gold, matched_pred, matched_gold, gold_ids))
    if not fields:
        raise InputError(f"no field has a gold column (fields: {', '.join(s.name for s in specs)}; gold columns: "
                         f"{', '.join(map(str, gold.columns))})")
    answers = (gold.attrs.get(_gold_attr()) or {}).get("answers") or {}
    present = [any(_present_gold(v) if s.is_multi else _is_present(v) for s, v in zip(specs, values))
               for values in zip(*(gold[s.name].tolist() if s.name in gold.columns else [None] * len(gold_ids)
                                   for s in specs))] if specs else [False] * len(gold_ids)
    present = [p or any(answers.get(rid, ())) for p, rid in zip(present, gold_ids)]  # a tie is an answer
    return Joined(fields=tuple(fields), fields_without_gold=tuple(without), gold_rows=len(gold_ids),
                  prediction_rows=len(pred_ids), matched=len(matched_gold),
                  gold_without_prediction=len(unmatched),
                  predictions_without_gold=sum(1 for rid in pred_ids if rid not in gold_pos),
                  unmatched_gold_ids=tuple(unmatched[:5]), id_column=pred_id, answered=sum(present),
                  matched_answered=sum(1 for i in matched_gold.tolist() if present[i]),
                  gold_column=tuple(columns.items()), repeated_ids=tuple(w for w in (pred_repeats, gold_repeats) if w))


def resolve_gold_columns(gold: pd.DataFrame, specs: list[FieldSpec], id_field: str = "id") -> pd.DataFrame:
    """``gold`` with a column named after each field, as ``join`` reads it: the field's own
    column, else the one Argilla names it (``annotations.server_name``: ``pcd review --to
    argilla`` writes ``Sentiment`` as ``sentiment``), and a multi-select field of an
    annotation tool's export answered "none of these" (``[]``) where an annotator's answer
    leaves it out. For readers of gold rows that do not ``join`` (``pcd tune``)."""
    return _gold_columns(gold, specs, gold_id_strings(gold, id_field))[0]


def gold_id_strings(gold: pd.DataFrame, id_field: str = "id") -> list[str]:
    """``gold``'s ids as strings, row by row (a whole float as an int: pandas reads an id column
    with gaps as float); the row positions, from 0, without an ``id_field`` column."""
    return [str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)
            for v in (gold[id_field].tolist() if id_field in gold.columns else range(len(gold)))]


def _gold_attr() -> str:
    from ..io.annotations import GOLD_ATTR

    return GOLD_ATTR


def _gold_columns(gold: pd.DataFrame, specs: list[FieldSpec], gold_ids: list[str]) -> tuple[pd.DataFrame, dict]:
    """``gold`` with a column named after each field that has gold: its own column, else the
    one ``server_name`` names (Argilla's rule); a multi-select field of an annotation tool's
    export answered anew from the counted answers, an annotator's answer without it being
    "none of these" (``[]``). Returns the frame (a copy when changed) and ``{field: column read}``."""
    from ..io.annotations import GOLD_ATTR, resolve, server_name

    answers = (gold.attrs.get(GOLD_ATTR) or {}).get("answers") or {}
    out, columns = gold, {}
    for spec in specs:
        column = spec.name if spec.name in gold.columns else server_name(spec.name) \
            if server_name(spec.name) in gold.columns else None
        if column is None and not (spec.is_multi and answers):
            continue
        columns[spec.name] = column or server_name(spec.name)
        values = gold[column].tolist() if column is not None else [None] * len(gold_ids)
        if spec.is_multi and answers:
            values = [resolve(answers[rid], columns[spec.name], missing=[])[0] if rid in answers else v
                      for rid, v in zip(gold_ids, values)]
        elif column == spec.name:
            continue
        if out is gold:
            out = gold.copy()
        out[spec.name] = pd.Series(values, index=out.index, dtype=object)
    return out, columns


def _is_present(value) -> bool:
    if value is None or value is pd.NA or value is pd.NaT:
        return False
    if isinstance(value, float) and math.isnan(value):
        return False
    return not (isinstance(value, str) and value.strip() == "")


def _id_strings(column: pd.Series, side: str, name: str) -> list[str]:
    """The row keys of an id column (ids as strings; a repeated id's n-th repeat ``ID (repeat
    n)``, ``io.values.REPEATED_ID_RULE``). ``id_keys`` also says how many repeat."""
    return id_keys(column, side, name)[0]


def id_values(column: pd.Series, side: str, name: str) -> list[str]:
    """The ids of ``side``'s id column ``name`` as strings (a whole float as an integer: a numeric
    column read as float), repeats as they are.

    Raises:
        InputError: an empty id, naming the row.
    """
    ids = []
    for i, value in enumerate(column.tolist()):
        if not _is_present(value):
            raise InputError(f"{side} row {i}: the id column {name!r} is empty")
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # a numeric column read as float (e.g. a CSV with gaps)
        ids.append(str(value))
    return ids


def id_keys(column: pd.Series, side: str, name: str) -> tuple[list[str], str | None]:
    """The row keys of ``side``'s id column ``name`` (``io.values.occurrence_keys``: every command
    matches repeated ids by order) and the warning counting its repeats (``None``: none).

    Raises:
        InputError: an empty id, naming the row; two rows with one key.
    """
    try:
        keys, repeated = occurrence_keys(id_values(column, side, name))
    except InputError as exc:
        raise InputError(f"{side}, column {name!r}: {exc}") from None
    return keys, f"{side}, column {name!r}: {repeated.message()}" if repeated.count else None


def gold_label_index(value, spec: FieldSpec) -> int | None:
    """Index of a gold value in ``spec.labels``; ``None`` when it is not a label.

    Booleans: ``True``/``False`` or the strings ``true``/``false`` in any case. Enums and
    ordinals: the exact label string, or, for a label that is a whole number (``"4"``), that
    number as tools write it (``4``, ``4.0``, ``"4.0"``). Integers: a whole number (not a
    boolean) as ``model.whole_number`` reads it: ``4``, ``4.0`` (pandas writes an integer
    column with gaps as float), ``"4"``, ``" 4.0 "``. A nullable field's null option: the string ``"null"``
    (a null gold cell is "no gold", never this label).
    """
    if spec.is_boolean:
        if isinstance(value, (bool, np.bool_)):
            text = "true" if value else "false"
        elif isinstance(value, str):
            text = value.strip().lower()
        else:
            return None
    elif spec.type == "integer":
        number = whole_number(value)
        text = str(number) if number is not None else value.strip() if isinstance(value, str) else None
    elif isinstance(value, str):
        text = value
    else:
        text = None
    if text in spec.labels:
        return spec.labels.index(text)
    number = whole_number(value)  # an ordinal (enum) label "4" written 4 or 4.0 (pandas, a float column)
    if number is not None and str(number) in spec.labels:
        return spec.labels.index(str(number))
    return None


def near_label(value, spec: FieldSpec) -> str | None:
    """The one label that ``value`` spells but for case and the spaces around it (``"positive"``
    for ``POSITIVE``), or ``None``: said beside a gold value that is not a label, since labels
    are matched exactly (``gold_label_index``)."""
    if not isinstance(value, str):
        return None
    folded = value.strip().casefold()
    matches = [label for label in spec.labels if label.casefold() == folded]
    return matches[0] if len(matches) == 1 else None


def gold_options(value, spec: FieldSpec) -> tuple[bool, ...] | None:
    """A multi-select gold value as one bool per option (schema order); ``None`` when it is not
    a list of the field's options.

    Accepted: a list (JSON list, Parquet list) of option strings, possibly empty; a mapping
    option -> bool (the answer's own form); a string holding a JSON list (``["a", "b"]``, ``[]``),
    a single option, or options separated by ``|`` (or, without ``|``, by ``,``), spaces around
    each ignored. Repeated options count once.
    """
    chosen: list = []
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                chosen = json.loads(text)
            except ValueError:
                return None
            if not isinstance(chosen, list):
                return None
        elif text in spec.labels:
            chosen = [text]
        else:
            sep = next((s for s in MULTI_SEPARATORS if s in text), None)
            chosen = [part.strip() for part in text.split(sep)] if sep else [text]
    elif isinstance(value, dict) or (_has_pairs(value) and all(isinstance(v, tuple) and len(v) == 2 for v in value)):
        pairs = _pairs(value)
        if not all(isinstance(v, (bool, np.bool_)) for v in pairs.values()):
            return None
        if not set(pairs) <= set(spec.labels):
            return None
        chosen = [k for k, v in pairs.items() if v]
    elif _has_pairs(value):
        chosen = list(value)
    else:
        return None
    if not all(isinstance(c, str) and c in spec.labels for c in chosen):
        return None
    return tuple(option in chosen for option in spec.labels)


def _gold_rows(spec: FieldSpec, gold: pd.DataFrame, matched_pred: np.ndarray, matched_gold: np.ndarray, *,
               present, read, shown) -> tuple[list[int], list[int], list, int, Counter]:
    """The matched rows whose gold value for ``spec`` can be evaluated: gold row indices, prediction
    row indices and the gold values as ``read`` gives them (a label index, or the options chosen),
    plus the count of rows whose gold is not ``present`` (null) and a ``Counter`` of the values
    ``read`` refused (``None``), each as ``shown``."""
    gold_values = gold[spec.name].tolist()
    keep_gold, keep_pred, values = [], [], []
    null = 0
    invalid: Counter = Counter()
    for g, p in zip(matched_gold.tolist(), matched_pred.tolist()):
        value = gold_values[g]
        if not present(value):
            null += 1
            continue
        read_value = read(value, spec)
        if read_value is None:
            invalid[shown(value)] += 1
            continue
        keep_gold.append(g)
        keep_pred.append(p)
        values.append(read_value)
    return keep_gold, keep_pred, values, null, invalid


def _field_data(spec: FieldSpec, predictions: pd.DataFrame, gold: pd.DataFrame, matched_pred: np.ndarray,
                matched_gold: np.ndarray, gold_ids: list[str]) -> FieldData:
    keep_gold, keep_pred, gold_idx, null, invalid = _gold_rows(
        spec, gold, matched_pred, matched_gold, present=_is_present, read=gold_label_index,
        shown=lambda value: repr(value) if not isinstance(value, str) else value)
    all_rows = np.array(keep_pred, dtype=np.int64)
    sets = set_gold = None
    if f"{spec.name}__set" in predictions.columns:
        cells = predictions[f"{spec.name}__set"].to_numpy(dtype=object)[all_rows] if len(all_rows) else []
        sets = tuple(tuple(c) if c is not None and not (isinstance(c, float) and math.isnan(c)) else () for c in cells)
        set_gold = tuple(spec.labels[i] for i in gold_idx)
    values = predictions[spec.name].to_numpy(dtype=object)[all_rows] if len(all_rows) else []
    if spec.nullable:  # a null value is the null option, unless the row abstained (<f>__abstained)
        flags = predictions[f"{spec.name}__abstained"].to_numpy(dtype=object)[all_rows] \
            if f"{spec.name}__abstained" in predictions.columns and len(all_rows) else [False] * len(all_rows)
        values = [NULL_LABEL if not _is_present(v) and flag is not True and flag is not np.True_ else v
                  for v, flag in zip(values, flags)]
    decided = [i for i, v in enumerate(values) if _is_present(v)]  # a null label: abstained
    abstained = len(all_rows) - len(decided)
    rows = all_rows[decided]
    keep_gold, gold_idx = [keep_gold[i] for i in decided], [gold_idx[i] for i in decided]
    pred_values = [values[i] for i in decided]
    pred_idx = []
    for value, r in zip(pred_values, rows.tolist()):
        if spec.is_boolean and isinstance(value, (bool, np.bool_)):
            value = "true" if value else "false"
        elif isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
            value = str(int(value))  # an integer field's int64 column
        elif isinstance(value, (float, np.floating)) and float(value).is_integer():
            value = str(int(value))  # the same column read as float64 (it holds nulls)
        if not isinstance(value, str) or value not in spec.labels:
            raise InputError(f"predictions row {r}: field {spec.name!r} holds {value!r}, not one of its labels "
                             f"({', '.join(spec.labels)}); were they labelled with this schema?")
        pred_idx.append(spec.labels.index(value))
    prob = _float_column(predictions, f"{spec.name}__prob", rows)
    mass = _float_column(predictions, f"{spec.name}__mass", rows) if f"{spec.name}__mass" in predictions else \
        np.full(len(rows), np.nan)
    probs = None
    if f"{spec.name}__probs" in predictions.columns:
        cells = predictions[f"{spec.name}__probs"].to_numpy(dtype=object)[rows] if len(rows) else []
        probs = np.zeros((len(rows), len(spec.labels)), dtype=np.float64)
        for i, (cell, r) in enumerate(zip(cells, rows.tolist())):
            pairs = _pairs(cell) if _has_pairs(cell) else None
            if pairs is None or set(pairs) != set(spec.labels):
                raise InputError(f"predictions row {r}: {spec.name}__probs has labels "
                                 f"{sorted(pairs) if pairs else None}, the field has {list(spec.labels)}")
            probs[i] = [pairs[label] for label in spec.labels]
    return FieldData(spec=spec, ids=np.array([gold_ids[g] for g in keep_gold], dtype=object),
                     gold=np.array(gold_idx, dtype=np.int64), pred=np.array(pred_idx, dtype=np.int64),
                     prob=prob, mass=mass, probs=probs, gold_null=null, gold_invalid=sum(invalid.values()),
                     invalid_values=tuple(invalid.most_common(MAX_INVALID_EXAMPLES)), abstained=abstained,
                     set_gold=set_gold, sets=sets, inputs=_inputs(predictions, rows))


def _multi_field_data(spec: FieldSpec, predictions: pd.DataFrame, gold: pd.DataFrame, matched_pred: np.ndarray,
                      matched_gold: np.ndarray, gold_ids: list[str]) -> MultiFieldData:
    keep_gold, keep_pred, gold_sel, null, invalid = _gold_rows(
        spec, gold, matched_pred, matched_gold, present=_present_gold, read=gold_options, shown=_quoted)
    all_rows = np.array(keep_pred, dtype=np.int64)
    values = predictions[spec.name].to_numpy(dtype=object)[all_rows] if len(all_rows) else []
    decided = [i for i, v in enumerate(values) if _has_pairs(v)]  # a null list: no choice written
    rows = all_rows[decided]
    k = len(spec.labels)
    pred = np.zeros((len(rows), k), dtype=bool)
    for i, (value, r) in enumerate(zip([values[i] for i in decided], rows.tolist())):
        chosen = list(value)
        unknown = [c for c in chosen if c not in spec.labels]
        if unknown:
            raise InputError(f"predictions row {r}: field {spec.name!r} holds {unknown[0]!r}, not one of its options "
                             f"({', '.join(spec.labels)}); were they labelled with this schema?")
        pred[i] = [option in chosen for option in spec.labels]
    name = f"{spec.name}__probs"
    if name not in predictions.columns:
        raise InputError(f"the predictions have no column {name!r} (P(yes) per option of a multi-select field, "
                         "always written by pcd label); is this a pcd output?")
    cells = predictions[name].to_numpy(dtype=object)[rows] if len(rows) else []
    p_yes = np.zeros((len(rows), k), dtype=np.float64)
    for i, (cell, r) in enumerate(zip(cells, rows.tolist())):
        pairs = _pairs(cell) if _has_pairs(cell) else None
        if pairs is None or set(pairs) != set(spec.labels):
            raise InputError(f"predictions row {r}: {name} has options {sorted(pairs) if pairs else None}, the field "
                             f"has {list(spec.labels)}")
        p_yes[i] = [pairs[option] for option in spec.labels]
    if not np.all(np.isfinite(p_yes) & (p_yes >= 0) & (p_yes <= 1 + 1e-6)):
        bad = int(np.argwhere(~(np.isfinite(p_yes) & (p_yes >= 0) & (p_yes <= 1 + 1e-6)))[0][0])
        raise InputError(f"predictions row {int(rows[bad])}: {name} holds a value that is not a probability")
    mass = _float_column(predictions, f"{spec.name}__mass", rows) if f"{spec.name}__mass" in predictions else \
        np.full(len(rows), np.nan)
    return MultiFieldData(spec=spec, ids=np.array([gold_ids[keep_gold[i]] for i in decided], dtype=object),
                          gold=np.array([gold_sel[i] for i in decided], dtype=bool).reshape(len(decided), k),
                          pred=pred, p_yes=np.minimum(p_yes, 1.0), prob=_float_column(predictions, f"{spec.name}__prob", rows),
                          mass=mass, gold_null=null, gold_invalid=sum(invalid.values()),
                          invalid_values=tuple(invalid.most_common(MAX_INVALID_EXAMPLES)),
                          abstained=len(all_rows) - len(decided), inputs=_inputs(predictions, rows))


def _inputs(predictions: pd.DataFrame, rows: np.ndarray) -> np.ndarray | None:
    """The model input keys (``INPUT_KEY_COLUMN``) of prediction ``rows``; ``None`` without the column."""
    if INPUT_KEY_COLUMN not in predictions.columns:
        return None
    cells = predictions[INPUT_KEY_COLUMN].to_numpy(dtype=object)[rows] if len(rows) else []
    return np.array([c if isinstance(c, str) and c else None for c in cells], dtype=object)


def _present_gold(value) -> bool:
    """A multi-select gold cell holds something: a list (even empty) or a non-empty string."""
    return _has_pairs(value) or isinstance(value, dict) or _is_present(value)


def _quoted(value) -> str:
    if isinstance(value, np.ndarray):
        value = value.tolist()
    return value if isinstance(value, str) else repr(value)


def _has_pairs(cell) -> bool:
    return cell is not None and not isinstance(cell, (str, float, bytes)) and hasattr(cell, "__iter__")


def _pairs(cell) -> dict:
    """A map cell (a dict, or ``(key, value)`` pairs as pyarrow gives a map column) as a dict."""
    return dict(cell.items()) if isinstance(cell, dict) else dict((k, v) for k, v in cell)


def _float_column(frame: pd.DataFrame, name: str, rows: np.ndarray) -> np.ndarray:
    if name not in frame.columns:
        raise InputError(f"the predictions have no column {name!r}; is this a pcd output?")
    values = frame[name].to_numpy(dtype=np.float64, na_value=np.nan)[rows] if len(rows) else np.zeros(0)
    bad = np.flatnonzero(~np.isfinite(values) | (values < 0) | (values > 1 + 1e-6))
    if bad.size:
        raise InputError(f"predictions row {int(rows[bad[0]])}: {name} is {values[bad[0]]!r}, not a probability")
    return values
