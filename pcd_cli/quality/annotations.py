"""Gold labels from annotation tools: a Label Studio JSON export, an Argilla export, or the
spreadsheet ``pcd review --to csv`` wrote, filled in. ``read_gold`` (``pcd eval``, ``pcd
calibrate``, ``pcd tune``, ``pcd bench --gold``) and the few-shot ``--examples`` read them
through here, so review -> recalibrate is two commands.

Every reader gives plain gold rows: the record's data (its id, its ``text``) and one value per
field, the label a person chose (``None`` where nobody did); booleans come back as the strings
``"true"``/``"false"``, which the gold readers accept.

What is recognised, by content (not by file name):

- **Label Studio** (``Export -> JSON``): a JSON list of tasks, each ``{"id", "data": {...},
  "annotations": [{"result": [{"from_name": FIELD, "type": "choices", "value": {"choices":
  [LABEL]}}], "was_cancelled", "ground_truth", "created_at", "updated_at"}]}``. Per task the
  annotation read is the latest (``updated_at``, else ``created_at``, else list order) that
  is not cancelled, a ``ground_truth`` one first. One choice gives that label; several (or
  none: a ``choices`` result left empty) give the list, a multi-select field's options; a
  field without a result has no gold. The record id is ``data.<id column>`` (the
  key ``pcd review`` wrote), never Label Studio's own task ``id``. The JSON-MIN and CSV
  exports put Label Studio's task id in the ``id`` column and are refused.
- **Argilla 2.x**: the records written by ``dataset.records.to_json(PATH)``, the folder
  written by ``dataset.to_disk(FOLDER)`` (its ``records.json``), a JSON list of
  ``record.to_dict()`` (``{"id", "fields", "metadata", "suggestions", "responses": {QUESTION:
  [{"value", "user_id", "status"?}]}}``), or flattened rows (``dataset.records.to_list(flatten=
  True)``, ``to_datasets()`` saved as JSONL or Parquet: ``QUESTION.responses`` and
  ``QUESTION.responses.status`` lists). Per question the gold is the value most responses
  give (submitted ones where a status is recorded); a tie leaves it ``None``. The record id
  is the record's ``id``.
- **The review spreadsheet**: a column ``<field>__gold`` replaces the column ``<field>`` (the
  model's label): an empty cell is no gold for that row.
- Any other JSON list of flat objects is read as gold rows as they are.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Iterator

from ..errors import InputError

#: Suffix of the columns a person fills in the review spreadsheet (``pcd review --to csv``).
GOLD_SUFFIX = "__gold"
#: File inside an Argilla ``Dataset.to_disk`` folder holding the records.
ARGILLA_RECORDS = "records.json"
#: Keys of a Label Studio JSON-MIN export row that a task list never has at its top level.
_JSON_MIN_KEYS = ("annotator", "annotation_id", "lead_time")


def is_export(path: str | Path) -> bool:
    """Whether ``path`` is read here as a whole (a folder, or a JSON file holding a list) rather
    than row by row as JSONL/CSV/Parquet."""
    path = Path(path)
    if path.is_dir():
        return True
    if not path.is_file() or path.suffix.lower() not in (".json", ".jsonl", ".ndjson"):
        return False
    with path.open("rb") as fh:
        head = fh.read(4096)
    return head.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"[")


def read_export(path: str | Path, *, id_field: str | None = "id") -> tuple[str, list[dict]]:
    """Read an annotation-tool export (``is_export``) into gold rows.

    Args:
        id_field: the id column the rows must carry (``None``: do not check).

    Returns:
        ``(kind, rows)``: kind ``"label-studio"``, ``"argilla"`` or ``"json"`` (a plain list of
        rows); each row a dict (the record's data and one value per field).

    Raises:
        InputError: not JSON, not a list of objects, a JSON-MIN export, a task without ``data``,
            a field with more than one choice, a folder without ``records.json``, no row
            carrying ``id_field``; each names the file and the task or record.
    """
    path = Path(path)
    shown = repr(str(path))
    if path.is_dir():
        records = path / ARGILLA_RECORDS
        if not records.is_file():
            raise InputError(f"{shown} is a folder without {ARGILLA_RECORDS}; give a gold file, or the folder "
                             "Argilla's dataset.to_disk(FOLDER) wrote")
        path, shown = records, repr(str(records))
    try:
        items = json.loads(path.read_bytes().decode("utf-8-sig"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"{shown}: not a JSON file ({exc}); gold files are JSONL/CSV/Parquet, a Label Studio "
                         "JSON export or an Argilla export") from None
    if not isinstance(items, list):
        raise InputError(f"{shown}: a JSON {type(items).__name__}, not a list of records")
    bad = next((i for i, item in enumerate(items) if not isinstance(item, dict)), None)
    if bad is not None:
        raise InputError(f"{shown} item {bad}: {type(items[bad]).__name__}, not an object; a gold file is a list "
                         "of records")
    kind = export_kind(items)
    if kind == "label-studio":
        rows = label_studio_rows(items, shown)
    elif kind == "label-studio-tasks":
        raise InputError(f"{shown}: Label Studio tasks without annotations (the file pcd review wrote?); "
                         "import it into Label Studio, annotate, then Export -> JSON and pass that file")
    elif kind == "label-studio-min":
        raise InputError(f"{shown}: a Label Studio JSON-MIN export, whose 'id' is Label Studio's own task id, "
                         "not the record's; export as JSON (the full format) instead")
    elif kind == "argilla":
        if not any(item.get("responses") for item in items):
            raise InputError(f"{shown}: Argilla records without responses (the folder pcd review wrote?); import it "
                             "with rg.Dataset.from_disk, annotate, then pass what dataset.to_disk(FOLDER) or "
                             "dataset.records.to_json(FILE) writes")
        rows = [argilla_row(item, id_field or "id", f"{shown} record {i}") for i, item in enumerate(items)]
    else:
        rows = [normalize_row(item) for item in items]
    if id_field and rows and not any(id_field in row for row in rows):
        where = "data" if kind == "label-studio" else "records"
        keys = sorted({k for row in rows[:50] for k in row})
        raise InputError(f"{shown}: the {where} have no id {id_field!r} (keys: {', '.join(map(str, keys[:12]))}); "
                         "pcd review writes the record id under the output's id column; pass --id-field")
    return ("json" if kind == "plain" else kind), rows


def export_kind(items: list[dict]) -> str:
    """``label-studio`` (tasks with annotations), ``label-studio-tasks`` (tasks, none annotated),
    ``label-studio-min``, ``argilla`` (nested ``record.to_dict()``; flattened rows are
    ``plain``, handled by ``normalize_row``) or ``plain``, from the first items."""
    head = items[:20]
    if head and all("data" in item for item in head) and any(isinstance(item["data"], dict) for item in head):
        if any("annotations" in item or "completions" in item for item in head):
            return "label-studio"
        return "label-studio-tasks"
    if head and all(isinstance(item.get("fields"), dict) for item in head) and \
            any("responses" in item or "suggestions" in item for item in head):
        return "argilla"
    if head and all(all(k in item for k in _JSON_MIN_KEYS) for item in head):
        return "label-studio-min"
    return "plain"


def label_studio_rows(tasks: list[dict], where: str = "the export") -> list[dict]:
    """Gold rows from Label Studio tasks (module doc): ``data`` and, per ``choices`` result of
    the chosen annotation, ``row[from_name] = the choice`` (the list of choices unless there is
    exactly one: a list on a single-label field is reported by ``pcd eval`` as not a label).

    Raises:
        InputError: a task without a ``data`` object.
    """
    rows = []
    for i, task in enumerate(tasks):
        data = task.get("data")
        name = f"{where} task {task.get('id', i)!r}" if "id" in task else f"{where} task {i}"
        if not isinstance(data, dict):
            raise InputError(f"{name}: no 'data' object; is this a Label Studio JSON export?")
        row = dict(data)
        annotation = _chosen_annotation(task.get("annotations", task.get("completions")) or [])
        for result in (annotation or {}).get("result") or []:
            if not isinstance(result, dict) or result.get("type", "choices") != "choices":
                continue
            value = result.get("value") if isinstance(result.get("value"), dict) else {}
            choices = value.get("choices")
            field = result.get("from_name")
            if not isinstance(field, str) or not isinstance(choices, list):
                continue
            row[field] = choices[0] if len(choices) == 1 else list(choices)
        rows.append(row)
    return rows


def _chosen_annotation(annotations: list) -> dict | None:
    """The annotation read from a task: not cancelled; a ground-truth one first, then the latest."""
    kept = [(i, a) for i, a in enumerate(annotations)
            if isinstance(a, dict) and not a.get("was_cancelled") and not a.get("skipped")]
    if not kept:
        return None
    _, best = max(kept, key=lambda p: (bool(p[1].get("ground_truth")),
                                       str(p[1].get("updated_at") or p[1].get("created_at") or ""), p[0]))
    return best


def argilla_row(record: dict, id_field: str = "id", where: str = "record") -> dict:
    """A gold row from one nested Argilla record (``record.to_dict()``): its fields, its id
    under ``id_field``, and per question the responses' consensus (module doc).

    Raises:
        InputError: ``fields`` or ``responses`` of the wrong shape (names ``where``).
    """
    fields = record.get("fields") or {}
    responses = record.get("responses") or {}
    if not isinstance(fields, dict) or not isinstance(responses, dict):
        raise InputError(f"{where}: 'fields' and 'responses' must be objects; is this an Argilla export?")
    row = dict(fields)
    row.setdefault(id_field, record.get("id"))
    for question, answers in responses.items():
        if not isinstance(answers, list):
            raise InputError(f"{where}: responses to {question!r} are not a list")
        row[question] = consensus([a.get("value") for a in answers if isinstance(a, dict)
                                   and a.get("status", "submitted") in (None, "submitted")])
    return row


def consensus(values: list) -> object:
    """The value most of ``values`` give (``None`` ignored); ``None`` when there is none or a tie."""
    counts = Counter(_hashable(v) for v in values if _present(v))
    if not counts:
        return None
    (top, n), *rest = counts.most_common()
    if rest and rest[0][1] == n:
        return None
    return list(top) if isinstance(top, tuple) else top


def normalize_row(row: dict) -> dict:
    """A gold row with the annotation-tool columns resolved: ``<field>__gold`` over ``<field>``
    (empty -> ``None``), Argilla's flattened ``<q>.responses`` (+ ``.status``) -> ``<q>``, a
    nested Argilla record -> its row. Other rows are returned as they are."""
    if isinstance(row.get("fields"), dict) and isinstance(row.get("responses"), dict):
        return argilla_row(row)
    if not any(isinstance(k, str) and (k.endswith(GOLD_SUFFIX) or k.endswith(".responses")) for k in row):
        return row
    flattened = any(isinstance(k, str) and k.endswith(".responses") for k in row)
    out = {k: v for k, v in row.items()
           if not (isinstance(k, str) and (k.endswith(GOLD_SUFFIX) or ".responses" in k or ".suggestion" in k
                                           or (flattened and k in ("_server_id", "status"))))}
    for key, value in row.items():
        if not isinstance(key, str):
            continue
        if key.endswith(GOLD_SUFFIX) and key != GOLD_SUFFIX:
            out[key[: -len(GOLD_SUFFIX)]] = value if _present(value) else None
        elif key.endswith(".responses"):
            values = _as_list(value)
            status = _as_list(row.get(f"{key}.status"))
            if len(status) == len(values):
                values = [v for v, s in zip(values, status) if s in (None, "submitted")]
            out[key[: -len(".responses")]] = consensus(values)
    return out


def gold_rows(path: str | Path, spec, *, fmt: str | None = None) -> Iterator[tuple[int | None, "dict | str"]]:
    """``read_table_rows`` for gold files: every row as ``(line, columns)`` or ``(line, why it is
    unusable)``, an annotation-tool export read whole (lines ``None``), rows normalised
    (``normalize_row``). Used for the few-shot ``--examples``.

    Raises:
        InputError: as ``read_table_rows`` and ``read_export``.
    """
    from ..io.readers import read_table_rows

    if fmt is None and is_export(path):
        _, rows = read_export(path, id_field=None)
        return ((None, row) for row in rows)
    return ((line, normalize_row(row) if isinstance(row, dict) else row)
            for line, row in read_table_rows(path, spec, fmt=fmt))


def _present(value) -> bool:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return False
    return not (isinstance(value, str) and not value.strip())


def _hashable(value):
    return tuple(value) if isinstance(value, list) else value


def _as_list(value) -> list:
    if value is None or isinstance(value, (str, bytes, float, int, bool)):
        return []
    try:
        return list(value)
    except TypeError:
        return []
