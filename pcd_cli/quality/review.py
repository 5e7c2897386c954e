"""The rows a person should check, most uncertain first, as files an annotation tool imports.

    >>> from pcd_cli.quality.review import select_for_review, write_review
    >>> selection = select_for_review("out/airline.parquet", "sample_data/airline_tweets.jsonl", top=50)
    >>> written = write_review(selection, "label-studio", "out/airline.review.json")

``select_for_review`` reads a pcd output Parquet (its fields and labels from the
``pcd.schema_json`` metadata, or from a schema), joins each row's text from the input the
output was labelled from (by id, as ``pcd eval`` matches gold rows), orders the rows by their
**review score**, the lowest chosen-label probability over the fields (``min_f <f>__prob``:
the calibrated probability where a calibration was applied; a missing one counts as 0), lowest
first (ties keep the output's order), and keeps those the filters ask for.

The writers (``write_review``):

- ``label-studio``: a JSON list of tasks ``{"data": {"text", <id column>}, "predictions":
  [{"model_version", "score", "result": [{"from_name": FIELD, "to_name": "text", "type":
  "choices", "value": {"choices": [LABEL]}, "score"}]}]}`` (one result per field; a field
  that abstained has none; a multi-select field's choices are its chosen options), and next
  to it ``<name>.label_config.xml``, the labeling config (a ``<Choices>`` per field,
  ``choice="multiple"`` for a multi-select one) to create the project with. Import the
  tasks, annotate, ``Export -> JSON``: ``pcd eval`` and ``pcd calibrate`` read that export.
- ``argilla``: a folder in the layout of Argilla's ``Dataset.to_disk`` (``records.json``,
  ``.argilla/settings.json``, ``.argilla/dataset.json``), imported by
  ``rg.Dataset.from_disk(FOLDER, client=client)``: a ``TextField`` and a ``LabelQuestion`` per
  field (``MultiLabelQuestion`` for a multi-select one, not required: a response without it
  answers "none of these"), named as the server accepts (``argilla_names``: ``Sentiment`` ->
  ``sentiment``, its title the field's name; a field with more than 500 labels is refused);
  per record a ``Suggestion`` per field
  (value, score, agent: the model) and metadata ``pcd_score``, ``<f>__prob`` (filterable),
  ``<f>__probs`` (the per-label distribution; P(yes) per option for a multi-select field) and
  ``<f>__set``. Export with ``dataset.to_disk(FOLDER)`` or ``dataset.records.to_json(FILE)``.
- ``csv``: ``<id column>, text`` then per field ``<f>, <f>__prob, [<f>__set,] <f>__gold``;
  fill ``<f>__gold`` in a spreadsheet (every row checked, the label copied where it is right;
  an empty cell is no gold; a multi-select field's options as ``a|b``, ``[]`` for none) and
  pass the file as gold.

With label-studio-sdk (argilla) installed (``pip install 'pcd-cli[review]'``) the files are
checked with that package's own classes before they are written (``check_label_studio``,
``check_argilla``); without it they are written all the same.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import quoteattr

import numpy as np
import orjson

from ..errors import InputError, MissingExtra
from ..io.readers import InputSpec, read_table_rows, row_to_record
from ..io.values import repeat_key
from ..schema.model import Schema
from ..io.annotations import ARGILLA_MAX_OPTIONS, ARGILLA_NAME, GOLD_SUFFIX, server_name
from .data import FieldSpec, _is_present, field_specs, id_keys, id_values, read_predictions

#: What ``pcd review --to`` writes.
TARGETS = ("label-studio", "argilla", "csv")
#: The install line for the packages that check the files.
REVIEW_EXTRA = "pip install 'pcd-cli[review]'"
#: Decimals kept of each probability in the files.
DECIMALS = 6


@dataclass(frozen=True)
class ReviewRow:
    """One record to check.

    Attributes:
        id: the record id as the output holds it (a string, or the row number for outputs
            labelled without ``--id-field``).
        text: the record's text as the model read it (``--template`` filled).
        score: the review score, ``min`` over the fields of the chosen label's probability.
        labels: per field the label as a string (booleans ``"true"``/``"false"``, integers their
            decimal string, a nullable field's null option ``"null"``), for a multi-select field
            the list of chosen options; ``None`` where there is none (abstained).
        probs: per field the chosen label's probability (``<f>__prob``), ``None`` where missing.
        distributions: per field ``{label: probability}`` from ``<f>__probs`` (``--all-probs``),
            only the fields that have it.
        sets: per field the conformal label set (``<f>__set``), only the fields that have one.
    """

    id: object
    text: str
    score: float
    labels: dict[str, "str | list[str] | None"]
    probs: dict[str, float | None]
    distributions: dict[str, dict[str, float]]
    sets: dict[str, tuple[str, ...]]


@dataclass(frozen=True)
class ReviewSelection:
    """The rows chosen for review, most uncertain first.

    Attributes:
        rows: the rows, review score ascending.
        fields: the output's fields (labels in schema order).
        id_column: the output's id column (``row``: row numbers from 0).
        model: the model that labelled them (``pcd.model``), for ``model_version``/``agent``.
        total: rows in the output.
        set_fields: fields with a ``<f>__set`` column.
        selected: rows the filters kept (``below``, ``below_by_field``, ``sets``), before
            ``sample`` and ``top``.
        warnings: lines to say (rows that repeat an id: each reviewed as a row of its own, the
            n-th repeat of ``ID`` exported as ``ID (repeat n)``; ``io.values.REPEATED_ID_RULE``).
    """

    rows: tuple[ReviewRow, ...]
    fields: tuple[FieldSpec, ...]
    id_column: str
    model: str
    total: int
    set_fields: tuple[str, ...] = ()
    selected: int = 0
    warnings: tuple[str, ...] = ()


def select_for_review(predictions: str | Path, input: str | Path, *, schema: Schema | None = None,
                      id_field: str = "id", text_field: str = "text", template: str | None = None,
                      csv_delimiter: str = ",", fmt: str | None = None, below: float | None = None,
                      sets: bool = False, sample: int | None = None, seed: int = 0,
                      top: int | None = None, below_by_field: dict[str, float | None] | None = None,
                      encoding_errors: str = "strict") -> ReviewSelection:
    """Choose the rows of a pcd output to review, most uncertain first (module doc).

    Args:
        predictions: a pcd output Parquet file.
        input: the records it was labelled from (JSONL/CSV/Parquet); ``text_field``,
            ``template``, ``csv_delimiter``, ``encoding_errors`` and ``fmt`` as given to ``pcd label``.
        id_field: the id column (as ``pcd eval``): the output's column of that name, else its
            ``row`` column, which matches input rows by position (from 0).
        below: keep rows where some field's probability is below this (a missing one counts).
        below_by_field: keep rows where some field's probability is below that field's threshold
            (``error_budget_thresholds``; ``None``: no threshold reaches the budget, every row of
            that field goes to review).
        sets: keep rows where some field's conformal label set holds more than one label.
        sample: then keep a uniform random sample of this many rows (``numpy`` generator seeded
            with ``seed``), still most uncertain first: rows like those a calibration will be
            applied to, where ``top`` and ``below`` pick the hard ones.
        top: then keep the first ``top`` rows.

    Raises:
        InputError: an unreadable output or input; no id column; ``sets`` on an output without
            ``<f>__set`` columns; a chosen row whose id is not in the input (names it).
    """
    frame, metadata = read_predictions(predictions)
    specs = field_specs(frame, schema)
    columns = set(map(str, frame.columns))
    id_column = id_field if id_field in columns else "row" if "row" in columns else None
    if id_column is None:
        raise InputError(f"{str(predictions)!r} has no id column {id_field!r} (nor 'row'); pass the --id-field "
                         "used when labelling")
    set_fields = tuple(s.name for s in specs if f"{s.name}__set" in columns)
    if sets and not set_fields:
        raise InputError(f"--sets: {str(predictions)!r} has no <field>__set column; label with --calibration "
                         "FILE fitted by pcd calibrate --coverage to get label sets")
    n = len(frame)
    probs = np.column_stack([frame[f"{s.name}__prob"].to_numpy(dtype=np.float64, na_value=np.nan)
                             for s in specs]) if n else np.zeros((0, len(specs)))
    score = np.where(np.isnan(probs), 0.0, probs).min(axis=1) if len(specs) else np.zeros(n)
    keep = np.ones(n, dtype=bool)
    if below is not None:
        keep &= (np.isnan(probs) | (probs < below)).any(axis=1)
    if below_by_field is not None:
        limits = np.array([np.inf if limit is None else limit
                           for limit in (below_by_field.get(s.name, np.inf) for s in specs)], dtype=np.float64)
        keep &= (np.isnan(probs) | (probs < limits)).any(axis=1) if len(specs) else keep
    if sets:
        wide = np.zeros(n, dtype=bool)
        for name in set_fields:
            wide |= np.array([_is_list(c) and len(c) > 1 for c in frame[f"{name}__set"].tolist()], dtype=bool)
        keep &= wide
    order = [int(i) for i in np.argsort(score, kind="stable") if keep[i]]
    selected = len(order)
    if sample is not None and sample < len(order):
        chosen = np.sort(np.random.default_rng(seed).choice(len(order), size=sample, replace=False))
        order = [order[int(k)] for k in chosen]
    if top is not None:
        order = order[:top]
    plain = id_values(frame[id_column], "predictions", id_column)
    ids, repeats = id_keys(frame[id_column], "predictions", id_column)
    chosen = {plain[i] for i in order}
    texts = _texts(input, {ids[i] for i in order}, by_position=id_column == "row" and id_field != "row",
                   spec=InputSpec(text_field=text_field, template=template, csv_delimiter=csv_delimiter,
                                  encoding_errors=encoding_errors,
                                  id_field=None if id_column == "row" and id_field != "row" else id_column), fmt=fmt,
                   output_rows=Counter(rid for rid in plain if rid in chosen) if repeats else None)
    missing = [ids[i] for i in order if ids[i] not in texts]
    if missing:
        raise InputError(f"{len(missing)} of the {len(order)} rows to review have no record in {str(input)!r} (e.g. "
                         f"id {missing[0]!r} of column {id_column!r}); pass the input, --id-field, --text-field or "
                         "--template the output was labelled with")
    raw_ids = [raw if key == rid else key for raw, key, rid in zip(frame[id_column].tolist(), ids, plain)]
    wanted = [name for s in specs for name in (s.name, f"{s.name}__prob", f"{s.name}__probs", f"{s.name}__set",
                                               f"{s.name}__abstained") if name in columns]
    cells = {name: frame[name].to_numpy(dtype=object)[order].tolist() if order else [] for name in wanted}
    rows = tuple(_row(cells, specs, k, raw_ids[i], texts[ids[i]], float(score[i]), set_fields)
                 for k, i in enumerate(order))
    return ReviewSelection(rows=rows, fields=tuple(specs), id_column=id_column,
                           model=metadata.get("pcd.model") or "pcd", total=n, set_fields=set_fields,
                           selected=selected, warnings=(repeats,) if repeats else ())


@dataclass(frozen=True)
class ErrorBudget:
    """Per field, the probability threshold above which labels meet an error budget on gold rows
    (``pcd review --error-budget E --gold G``; the same fit as ``pcd eval --error-budget``).

    Attributes:
        budget: the error budget E (the largest error rate allowed above the threshold).
        thresholds: field -> the lowest ``<f>__prob`` threshold whose kept gold rows have error
            at most E (``metrics.threshold_for_accuracy`` at accuracy 1 - E), ``None`` when none does.
        coverage: field -> the share of its gold rows at or above the threshold.
        gold_rows: gold rows matched to the output and evaluated, per field.
        warnings: fields whose gold rows are below the floor for this budget
            (``decision.budget_floor_problem``): no threshold, every row goes to review.
    """

    budget: float
    thresholds: dict[str, float | None]
    coverage: dict[str, float]
    gold_rows: dict[str, int]
    warnings: tuple[str, ...] = ()


def error_budget_thresholds(predictions: str | Path, gold: str | Path, *, budget: float,
                            schema: Schema | None = None, id_field: str = "id",
                            csv_delimiter: str = ",") -> ErrorBudget:
    """Fit ``ErrorBudget`` on the gold rows of a pcd output (``pcd_cli.quality.evaluate`` with
    ``target_accuracy = 1 - budget``; single-label fields, multi-select fields aside).

    Raises:
        InputError: an unreadable output or gold file; ``budget`` outside [0, 1).
    """
    from .data import read_gold
    from .evaluate import evaluate

    if not 0 <= budget < 1:
        raise InputError(f"--error-budget {budget}: must be at least 0 and below 1")
    frame, _ = read_predictions(predictions)
    report = evaluate(frame, read_gold(gold, id_field=id_field, csv_delimiter=csv_delimiter), schema,
                      id_field=id_field, target_accuracy=1.0 - budget, error_budget=budget)
    return ErrorBudget(budget, {f.field: f.by_prob.target.threshold for f in report.fields},
                       {f.field: f.by_prob.target.coverage for f in report.fields},
                       {f.field: f.n for f in report.fields},
                       tuple(f.by_prob.target.reason for f in report.fields if f.by_prob.target.reason))


def _is_list(cell) -> bool:
    return cell is not None and not isinstance(cell, (str, float)) and hasattr(cell, "__len__")


def _texts(path: str | Path, wanted: set[str], *, by_position: bool, spec: InputSpec,
           fmt: str | None, output_rows: Counter | None = None) -> dict[str, str]:
    """``{key: text}`` of the input's records whose key is in ``wanted``: the row number, else
    the id; when the output's ids repeat (``output_rows``: its rows per id), the n-th repeat of an
    id among the input's readable records is ``ID (repeat n)``, as ``data.id_keys`` keys the output
    (``io.values.REPEATED_ID_RULE``).

    Raises:
        InputError: an id the output repeats is on another number of the input's records (a
            row failed when labelled): its rows cannot be matched by order.
    """
    found: dict[str, str] = {}
    if not wanted:
        return found
    seen: Counter = Counter()
    for index, (line, row) in enumerate(read_table_rows(path, spec, fmt=fmt)):
        if isinstance(row, str):
            continue
        record = row_to_record(row, index, line, spec)
        if by_position:
            key = str(index)
        elif output_rows is not None and hasattr(record, "text"):
            key = repeat_key(str(record.id), seen[str(record.id)])
            seen[str(record.id)] += 1
        else:
            key = str(record.id)
        if key in wanted and hasattr(record, "text"):
            found[key] = record.text
            if len(found) == len(wanted) and output_rows is None:
                break
    for rid, rows in (output_rows or {}).items():
        if rows > 1 and seen[rid] != rows:
            raise InputError(f"id {rid!r} is on {rows} rows of the output and {seen[rid]} records of {str(path)!r} "
                             "(one failed when labelled?): its repeats cannot be matched by order; label with "
                             "--row-ids, or give the input it was labelled from")
    return found


def _row(columns: dict[str, list], specs: list[FieldSpec], i: int, rid, text: str, score: float,
         set_fields: tuple[str, ...]) -> ReviewRow:
    """Row ``i`` of the output, from its ``columns`` (``{name: values}``)."""
    labels, probs, dists, sets = {}, {}, {}, {}
    for s in specs:
        abstained = f"{s.name}__abstained" in columns and bool(columns[f"{s.name}__abstained"][i])
        labels[s.name] = _label(columns[s.name][i], s, abstained)
        prob = columns[f"{s.name}__prob"][i]
        probs[s.name] = round(float(prob), DECIMALS) if prob is not None and math.isfinite(float(prob)) else None
        if f"{s.name}__probs" in columns:
            cell = columns[f"{s.name}__probs"][i]
            pairs = dict(cell.items()) if isinstance(cell, dict) else dict(cell) if _is_list(cell) else {}
            if pairs:
                dists[s.name] = {str(k): round(float(v), DECIMALS) for k, v in pairs.items()}
        if s.name in set_fields:
            cell = columns[f"{s.name}__set"][i]
            if _is_list(cell):
                sets[s.name] = tuple(map(str, cell))
    if isinstance(rid, (np.integer,)):
        rid = int(rid)
    elif isinstance(rid, float) and rid.is_integer():
        rid = int(rid)
    return ReviewRow(id=rid, text=text, score=round(score, DECIMALS), labels=labels, probs=probs,
                     distributions=dists, sets=sets)


def _label(value, spec: FieldSpec, abstained: bool):
    """A predicted value as the files write it (``ReviewRow.labels``)."""
    if spec.type == "multi":
        return [str(v) for v in value] if _is_list(value) else None
    if not _is_present(value):
        return spec.labels[-1] if spec.nullable and not abstained else None
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return str(int(value))  # an integer column read as float (it holds nulls)
    return str(int(value)) if isinstance(value, np.integer) else str(value)


# --- Label Studio --------------------------------------------------------------------------------


def text_name(fields) -> str:
    """Name of the text in the files: ``text``, else (a field is called so, or would be in
    Argilla: ``server_name``) ``record_text``, ``record_text_2``...: never a field's name, as
    Label Studio's config needs unique names."""
    taken = {n for f in fields for n in (f.name, server_name(f.name))}
    candidates = ("text", "record_text", *(f"record_text_{i}" for i in range(2, len(taken) + 3)))
    return next(name for name in candidates if name not in taken)


def label_studio_config(fields) -> str:
    """The Label Studio labeling config: the text, then a header and a ``<Choices>`` per field
    (``name`` = the field, one ``<Choice>`` per label; ``choice="multiple"`` for a
    multi-select field, else one choice)."""
    name = text_name(fields)
    lines = ["<View>", f"  <Text name={quoteattr(name)} value={quoteattr('$' + name)}/>"]
    for f in fields:
        lines.append(f"  <Header value={quoteattr(f.name)}/>")
        kind = "multiple" if f.type == "multi" else "single-radio"
        lines.append(f"  <Choices name={quoteattr(f.name)} toName={quoteattr(name)} choice=\"{kind}\" "
                     "showInline=\"true\">")
        lines.extend(f"    <Choice value={quoteattr(label)}/>" for label in f.labels)
        lines.append("  </Choices>")
    lines.append("</View>")
    return "\n".join(lines) + "\n"


def label_studio_tasks(selection: ReviewSelection) -> list[dict]:
    """The tasks (module doc), one per row, in review order."""
    name = text_name(selection.fields)
    tasks = []
    for row in selection.rows:
        result = [{"from_name": f.name, "to_name": name, "type": "choices",
                   "value": {"choices": _as_choices(row.labels[f.name])}, "score": row.probs[f.name]}
                  for f in selection.fields if row.labels[f.name] is not None]
        for r in result:
            if r["score"] is None:
                del r["score"]
        tasks.append({"data": {name: row.text, selection.id_column: row.id},
                      "predictions": [{"model_version": selection.model, "score": row.score, "result": result}]})
    return tasks


def _as_choices(label) -> list[str]:
    return list(label) if isinstance(label, list) else [label]


def check_label_studio(config: str, tasks: list[dict], *, required: bool = False) -> str | None:
    """Check the config and tasks with label-studio-sdk's own ``LabelInterface`` (the config is
    valid; every task has the text the config reads; every prediction passes
    ``validate_prediction``: known controls, one of each field's choices, scores in [0, 1]).

    Returns:
        ``"label-studio-sdk X.Y.Z"``, or ``None`` when the package is not installed.

    Raises:
        MissingExtra: not installed and ``required``.
        RuntimeError: the files do not pass (a bug in pcd).
    """
    try:
        from label_studio_sdk.label_interface import LabelInterface
    except ImportError:
        if required:
            raise MissingExtra(f"checking the Label Studio files needs label-studio-sdk: {REVIEW_EXTRA}") from None
        return None
    interface = LabelInterface(config)
    try:
        interface.validate()
    except Exception as exc:  # noqa: BLE001 - the SDK's own validation error types vary by version
        raise RuntimeError(f"the Label Studio config pcd made does not pass label-studio-sdk: {exc}") from None
    for i, task in enumerate(tasks):
        for obj in interface.objects:
            if obj.value_is_variable and task["data"].get(obj.value_name) is None:
                raise RuntimeError(f"Label Studio task {i}: no data.{obj.value_name} for <{obj.tag} "
                                   f"name={obj.name!r}>")
        for prediction in task.get("predictions", []):
            errors = interface.validate_prediction(prediction, return_errors=True)
            if errors:
                raise RuntimeError(f"Label Studio task {i}: the prediction does not pass label-studio-sdk: {errors[0]}")
    return f"label-studio-sdk {_version('label-studio-sdk')}"


def config_path(output: str | Path) -> Path:
    """Where the labeling config goes next to the tasks file: ``x.json`` -> ``x.label_config.xml``."""
    output = Path(output)
    stem = output.name[:-5] if output.name.lower().endswith(".json") else output.name
    return output.with_name(stem + ".label_config.xml")


def write_label_studio(selection: ReviewSelection, output: str | Path, *,
                       check: bool | None = None) -> tuple[list[Path], str | None]:
    """Write the tasks to ``output`` and the config to ``config_path(output)`` (module doc).

    Args:
        check: ``None``: check with label-studio-sdk when installed; ``True``: require it.

    Returns:
        (the files written, what checked them or ``None``).
    """
    from ..io.files import check_writable, write_atomic

    check_writable("-o", output)
    config, tasks = label_studio_config(selection.fields), label_studio_tasks(selection)
    checked = check_label_studio(config, tasks, required=bool(check)) if check is not False else None
    write_atomic(output, orjson.dumps(tasks, option=orjson.OPT_INDENT_2) + b"\n")
    write_atomic(config_path(output), config.encode())
    return [Path(output), config_path(output)], checked


# --- Argilla -------------------------------------------------------------------------------------


def argilla_names(fields) -> dict[str, str]:
    """The question name of each field in Argilla: the field's name as the server accepts it
    (``annotations.server_name``: ``Sentiment`` -> ``sentiment``, ``needs.reply`` ->
    ``needs_reply``); ``pcd eval`` maps the names back. The question's title keeps the
    field's name.

    Raises:
        InputError: a name that stays outside the server's rule (no letter or digit), two
            fields with the same name in Argilla, or a field with more labels than a label
            question may have (``ARGILLA_MAX_OPTIONS``).
    """
    names: dict[str, str] = {}
    for f in fields:
        name = server_name(f.name)
        if not ARGILLA_NAME.match(name):
            raise InputError(f"field {f.name!r}: Argilla's server accepts only names of lower case letters, digits, "
                             "'_' and '-' with at least one letter or digit, and this one has none; rename the "
                             "field, or review it with --to label-studio or --to csv")
        twin = next((other for other, n in names.items() if n == name), None)
        if twin is not None:
            raise InputError(f"fields {twin!r} and {f.name!r} are both {name!r} in Argilla, whose names are lower "
                             "case letters, digits, '_' and '-'; rename one, or review with --to label-studio")
        if len(f.labels) > ARGILLA_MAX_OPTIONS:
            raise InputError(f"field {f.name!r} has {len(f.labels)} labels; Argilla's server accepts at most "
                             f"{ARGILLA_MAX_OPTIONS} options in a label question; review it with --to label-studio "
                             "or --to csv, or narrow the field")
        names[f.name] = name
    return names


def argilla_renamed(selection: ReviewSelection) -> dict[str, str]:
    """The fields whose question name in Argilla differs from their name (``argilla_names``)."""
    return {k: v for k, v in argilla_names(selection.fields).items() if k != v}


def argilla_settings(selection: ReviewSelection) -> dict:
    """The dataset settings as ``rg.Settings.serialize()`` writes them (``.argilla/settings.json``):
    question and metadata names as ``argilla_names`` gives them, titles the fields' names."""
    name = text_name(selection.fields)
    names = argilla_names(selection.fields)

    def stamp(item: dict) -> dict:
        return {"id": None, "inserted_at": None, "updated_at": None} | item

    def question(f: FieldSpec) -> dict:
        kind = "multi_label_selection" if f.type == "multi" else "label_selection"
        settings = {"type": kind, "options": [{"text": label, "value": label} for label in f.labels],
                    "visible_options": len(f.labels) if len(f.labels) >= 3 else None}
        if f.type == "multi":
            settings["options_order"] = "natural"
        return stamp({"name": names[f.name], "settings": settings, "title": f.name, "description": None,
                      "required": f.type != "multi", "dataset_id": None, "type": kind})

    questions = [question(f) for f in selection.fields]
    fields = [stamp({"name": name, "settings": {"type": "text", "use_markdown": False}, "title": name,
                     "required": True, "description": None, "dataset_id": None, "type": "text"})]
    metadata = [stamp({"name": key, "settings": {"visible_for_annotators": True, "min": 0.0, "max": 1.0,
                                                  "type": "float"},
                       "title": key, "visible_for_annotators": True, "dataset_id": None})
                for key in ["pcd_score", *(f"{names[f.name]}__prob" for f in selection.fields)]]
    return {"guidelines": _guidelines(selection), "questions": questions, "fields": fields, "vectors": [],
            "metadata": metadata, "allow_extra_metadata": True,
            "distribution": {"strategy": "overlap", "min_submitted": 1}, "mapping": None}


def _guidelines(selection: ReviewSelection) -> str:
    return (f"Labels proposed by pcd ({selection.model}); each suggestion's score is the model's probability of "
            "its label. Records come most uncertain first (metadata pcd_score: the lowest probability over the "
            "questions). Check every question and submit.")


def argilla_dataset(selection: ReviewSelection, name: str) -> dict:
    """The dataset model as ``Dataset.to_disk`` writes it (``.argilla/dataset.json``)."""
    return {"id": None, "inserted_at": None, "updated_at": None, "name": name, "status": "draft",
            "guidelines": _guidelines(selection), "allow_extra_metadata": True,
            "distribution": {"strategy": "overlap", "min_submitted": 1}, "workspace_id": None,
            "last_activity_at": None}


def argilla_records(selection: ReviewSelection) -> list[dict]:
    """The records as ``record.to_dict()`` gives them (``records.json``), in review order
    (question and metadata names as ``argilla_names`` gives them)."""
    name = text_name(selection.fields)
    names = argilla_names(selection.fields)
    records = []
    for row in selection.rows:
        metadata: dict = {"pcd_score": row.score}
        for f in selection.fields:
            if row.probs[f.name] is not None:
                metadata[f"{names[f.name]}__prob"] = row.probs[f.name]
            if f.name in row.distributions:
                metadata[f"{names[f.name]}__probs"] = row.distributions[f.name]
            if f.name in row.sets:
                metadata[f"{names[f.name]}__set"] = list(row.sets[f.name])
        suggestions = {names[f.name]: {"value": row.labels[f.name], "score": row.probs[f.name],
                                       "agent": selection.model}
                       for f in selection.fields if row.labels[f.name] is not None}
        records.append({"id": str(row.id), "fields": {name: row.text}, "metadata": metadata,
                        "suggestions": suggestions, "responses": {}, "vectors": {}, "status": "pending",
                        "_server_id": None})
    return records


@contextmanager
def offline_argilla():
    """An Argilla client that never connects, as the default client while the block runs: the
    SDK's settings and records want one to exist, and none is needed to build them. Nothing is
    sent (its address is a closed local port); the earlier default client is put back.

    Raises:
        ImportError: argilla is not installed.
    """
    import argilla as rg

    class _Offline(rg.Argilla):
        def _validate_connection(self) -> None:  # no server to ask
            return None

    before = rg.Argilla._default_client
    client = _Offline(api_url="http://127.0.0.1:9", api_key="pcd-offline", timeout=1, retries=0)
    rg.Argilla._default_client = client
    try:
        yield rg, client
    finally:
        rg.Argilla._default_client = before
        client.http_client.close()


def argilla_objects(selection: ReviewSelection):
    """The same dataset built with Argilla's own classes: ``(rg.Settings, [rg.Record])`` (a
    ``TextField`` and a ``LabelQuestion`` per field; per record a ``Suggestion`` per field).
    Call inside ``offline_argilla()`` (or with a real default client).
    """
    import argilla as rg

    name = text_name(selection.fields)
    names = argilla_names(selection.fields)
    settings = rg.Settings(
        fields=[rg.TextField(name=name, use_markdown=False)],
        questions=[(rg.MultiLabelQuestion if f.type == "multi" else rg.LabelQuestion)(
            name=names[f.name], title=f.name, labels=list(f.labels), required=f.type != "multi")
            for f in selection.fields],
        metadata=[rg.FloatMetadataProperty(name=key, min=0.0, max=1.0)
                  for key in ["pcd_score", *(f"{names[f.name]}__prob" for f in selection.fields)]],
        guidelines=_guidelines(selection), allow_extra_metadata=True)
    records = []
    for row, plain in zip(selection.rows, argilla_records(selection)):
        records.append(rg.Record(
            id=str(row.id), fields={name: row.text}, metadata=plain["metadata"],
            suggestions=[rg.Suggestion(question_name=names[f.name], value=row.labels[f.name], score=row.probs[f.name],
                                       agent=selection.model)
                         for f in selection.fields if row.labels[f.name] is not None]))
    return settings, records


def check_argilla(selection: ReviewSelection, settings: dict, dataset: dict, records: list[dict], *,
                  required: bool = False) -> str | None:
    """Check the Argilla files with argilla's own classes: the settings, dataset and records
    read back by ``rg.Settings``, the dataset model and ``rg.Record.from_dict`` equal the same
    dataset built with ``rg.Settings``/``rg.TextField``/``rg.LabelQuestion``/``rg.Record``/
    ``rg.Suggestion`` (``argilla_objects``); every suggestion is one of its question's labels,
    scored in [0, 1]. No server is needed (``offline_argilla``).

    Returns:
        ``"argilla X.Y.Z"``, or ``None`` when the package is not installed.

    Raises:
        MissingExtra: not installed and ``required``.
        RuntimeError: the files do not pass (a bug in pcd).
    """
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from argilla._models import DatasetModel  # imports argilla
    except ImportError:
        if required:
            raise MissingExtra(f"checking the Argilla files needs argilla: {REVIEW_EXTRA}") from None
        return None
    with offline_argilla() as (rg, _):
        built_settings, built_records = argilla_objects(selection)
        read = rg.Settings._from_dict(settings)
        if read.serialize() != built_settings.serialize():
            raise RuntimeError("the Argilla settings pcd wrote differ from those rg.Settings builds")
        DatasetModel(**dataset)
        for kind in ("fields", "questions", "metadata"):  # the server's rules, which the SDK does not check
            for item in settings[kind]:
                if not ARGILLA_NAME.match(item["name"]):
                    raise RuntimeError(f"Argilla {kind[:-1]} name {item['name']!r} breaks the server's name rule")
                if len(item.get("settings", {}).get("options") or []) > ARGILLA_MAX_OPTIONS:
                    raise RuntimeError(f"Argilla question {item['name']!r} has more than {ARGILLA_MAX_OPTIONS} options")
        labels = {q.name: set(q.labels) for q in read.questions}
        for i, (plain, built) in enumerate(zip(records, built_records)):
            record = rg.Record.from_dict(plain)
            if record.to_dict() != built.to_dict():
                raise RuntimeError(f"Argilla record {i}: what pcd wrote differs from the rg.Record built for it")
            for suggestion in record.suggestions:
                values = suggestion.value if isinstance(suggestion.value, list) else [suggestion.value]
                if not set(values) <= labels.get(suggestion.question_name, set()):
                    raise RuntimeError(f"Argilla record {i}: suggestion {suggestion.value!r} is not a label of "
                                       f"question {suggestion.question_name!r}")
                if suggestion.score is not None and not 0.0 <= suggestion.score <= 1.0:
                    raise RuntimeError(f"Argilla record {i}: suggestion score {suggestion.score} is not in [0, 1]")
    return f"argilla {_version('argilla')}"


def write_argilla(selection: ReviewSelection, output: str | Path, *,
                  check: bool | None = None) -> tuple[list[Path], str | None]:
    """Write the dataset folder ``output`` (module doc); the dataset is named after it.

    Raises:
        InputError: ``output`` is a file, or a folder holding other files than these.
    """
    from ..io.files import write_atomic

    output = Path(output)
    if output.exists() and not output.is_dir():
        raise InputError(f"-o {str(output)!r} is a file; --to argilla writes a folder (Dataset.to_disk's layout)")
    paths = [output / "records.json", output / ".argilla" / "settings.json", output / ".argilla" / "dataset.json"]
    if output.is_dir():
        others = [p for p in output.rglob("*") if p.is_file() and p not in paths]
        if others:
            raise InputError(f"-o {str(output)!r} holds other files (e.g. {str(others[0])!r}); give a new or empty "
                             "folder")
    name = "".join(c if c.isalnum() or c in "-_" else "-" for c in output.name.lower()).strip("-_") or "pcd-review"
    settings, dataset = argilla_settings(selection), argilla_dataset(selection, name)
    records = argilla_records(selection)
    checked = (check_argilla(selection, settings, dataset, records, required=bool(check))
               if check is not False else None)
    for path, value in zip(paths, (records, settings, dataset)):
        write_atomic(path, json.dumps(value, ensure_ascii=False).encode() + b"\n")
    return paths, checked


# --- CSV -----------------------------------------------------------------------------------------


def write_csv(selection: ReviewSelection, output: str | Path) -> tuple[list[Path], None]:
    """Write the spreadsheet (module doc): ``<f>__gold`` columns empty, to fill in."""
    from ..io.files import check_writable, write_atomic

    check_writable("-o", output)
    name = text_name(selection.fields)
    header = [selection.id_column, name]
    for f in selection.fields:
        header += [f.name, f"{f.name}__prob"] + ([f"{f.name}__set"] if f.name in selection.set_fields else []) \
            + [f"{f.name}{GOLD_SUFFIX}"]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    for row in selection.rows:
        cells = [row.id, row.text]
        for f in selection.fields:
            prob = row.probs[f.name]
            label = row.labels[f.name]
            if isinstance(label, list):  # a multi-select field: "a|b", "[]" for no option
                label = "|".join(label) or "[]"
            cells += [label or "", "" if prob is None else f"{prob:.4f}"]
            if f.name in selection.set_fields:
                cells.append("|".join(row.sets.get(f.name, ())))
            cells.append("")
        writer.writerow(cells)
    write_atomic(output, buffer.getvalue().encode())
    return [Path(output)], None


def write_review(selection: ReviewSelection, to: str, output: str | Path, *,
                 check: bool | None = None) -> tuple[list[Path], str | None]:
    """Write ``selection`` for ``to`` (one of ``TARGETS``) at ``output``.

    Args:
        check: ``None``: check the files with the tool's own package when it is installed;
            ``True``: require it (``MissingExtra`` without); ``False``: do not check.

    Returns:
        (the files written, ``"<package> <version>"`` that checked them or ``None``).

    Raises:
        InputError: an unknown ``to``; an unusable ``output``. MissingExtra: ``check`` and no
        package. MachineError: the machine could not write.
    """
    if to == "label-studio":
        return write_label_studio(selection, output, check=check)
    if to == "argilla":
        return write_argilla(selection, output, check=check)
    if to == "csv":
        return write_csv(selection, output)
    raise InputError(f"--to {to!r}: expected one of {', '.join(TARGETS)}")


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "?"
