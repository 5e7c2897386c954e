"""Gold labels from annotation tools: a Label Studio JSON export, an Argilla export, or the
spreadsheet ``pcd review --to csv`` wrote, filled in. ``read_gold`` (``pcd eval``, ``pcd
calibrate``, ``pcd tune``, ``pcd bench --gold``) and the few-shot ``--examples`` read them
through here, so review -> recalibrate is two commands.

Every reader gives plain gold rows: the record's data (its id, its ``text``) and one value per
field, the label the annotators chose (``None`` where nobody did, or where they tied);
booleans come back as the strings ``"true"``/``"false"``, which the gold readers accept.
Where several people answered, the gold is the answer most of them gave (``resolve``): a tie
is no gold, never broken by who answered last; ``pcd eval`` reports the disagreements and the
agreement (``agreement``) from the counted answers ``read_gold`` keeps in
``frame.attrs[GOLD_ATTR]``.

What is recognised, by content (not by file name):

- **Label Studio** (``Export -> JSON``): a JSON list of tasks, each ``{"id", "data": {...},
  "annotations": [{"result": [{"from_name": FIELD, "type": "choices", "value": {"choices":
  [LABEL]}}], "completed_by", "was_cancelled", "ground_truth", "created_at", "updated_at"}]}``.
  Counted per task (``task_answers``): annotations not cancelled (skipped); where one is a
  ``ground_truth`` annotation, those alone; one per annotator (``completed_by``), the latest.
  One choice gives that label; several (or none: a ``choices`` result left empty) give the
  list, a multi-select field's options; an annotation without a result for a multi-select
  field answers "none of these" (``[]``; Label Studio writes no result when nothing is
  ticked), for another field it gives nothing. Predictions (pre-annotations) are never gold.
  The record id is ``data.<id column>`` (the key ``pcd review`` wrote), never Label Studio's
  own task ``id``. Refused: the JSON-MIN export and the CSV/TSV export (``id`` is Label
  Studio's task id, one row per annotation, cancelled ones dropped without a trace, several
  choices as a JSON cell).
- **Argilla 2.x**: the records written by ``dataset.records.to_json(PATH)``, the folder
  written by ``dataset.to_disk(FOLDER)`` (its ``records.json``), a JSON list of
  ``record.to_dict()`` (``{"id", "fields", "metadata", "suggestions", "responses": {QUESTION:
  [{"value", "user_id"}]}}``), or flattened rows (``dataset.records.to_list(flatten=True)``
  saved as JSON, ``to_datasets()`` saved as JSONL or Parquet: ``QUESTION.responses``,
  ``QUESTION.responses.users`` and ``QUESTION.responses.status`` lists). Only ``submitted``
  responses count where the status is recorded: in the flattened forms. The nested forms
  (``to_json``, ``to_disk``) keep no status, so draft and discarded responses cannot be told
  apart there: every response counts, and ``pcd eval`` warns (``take_notes``). One answer
  per user; a user's submitted response without a multi-select question answers "none of
  these" (``[]``). The record id is the record's ``id``; question names are those
  ``server_name`` gives the schema's fields.
- **The review spreadsheet**: a column ``<field>__gold`` replaces the column ``<field>`` (the
  model's label): an empty cell is no gold for that row.
- Any other JSON list of flat objects is read as gold rows as they are.
"""

from __future__ import annotations

import json
import math
import re
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
#: Columns label-studio-sdk's converter writes into every Label Studio CSV/TSV export.
_LS_CSV_KEYS = ("annotator", "annotation_id", "created_at", "updated_at", "lead_time")
#: Key under which the readers leave a row's counted answers (one ``{field: value}`` per
#: annotator) until ``take_notes`` moves them out.
ANSWERS_KEY = "__pcd_answers__"
#: Key under which the Argilla readers leave whether the responses' status was recorded.
STATUS_KEY = "__pcd_response_status__"
#: ``DataFrame.attrs`` key of a gold frame's notes (``take_notes``): counted answers per row,
#: whether a response status was read, warnings for ``pcd eval``.
GOLD_ATTR = "pcd.gold"
#: Argilla server's rule for field, question and metadata property names
#: (argilla-server's ``*_CREATE_NAME_REGEX``; argilla-io/argilla#3548).
ARGILLA_NAME = re.compile(r"^(?=.*[a-z0-9])[a-z0-9_-]+$")
#: Most options argilla-server accepts in a label question (``LABEL_SELECTION_OPTIONS_MAX_ITEMS``).
ARGILLA_MAX_OPTIONS = 500


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
        rows); each row a dict (the record's data and one value per field; annotation tools'
        rows also the private ``ANSWERS_KEY``/``STATUS_KEY``, for ``take_notes``).

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
    if id_field and rows and not any(id_field in row or "row" in row for row in rows):
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
    """Gold rows from Label Studio tasks (module doc): ``data`` and, per field, the answer most
    of the task's counted annotations give (``task_answers``: not cancelled, the ground-truth
    ones alone where there are any, one per annotator); a tie gives ``None``. One choice is
    that label, several the list (a list on a single-label field is reported by ``pcd eval``
    as not a label). The counted answers stay on the row under ``ANSWERS_KEY``.

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
        answers = task_answers(task.get("annotations", task.get("completions")) or [])
        for field in dict.fromkeys(f for answer in answers for f in answer):
            row[field] = resolve(answers, field)[0]
        row[ANSWERS_KEY] = answers
        rows.append(row)
    return rows


def task_answers(annotations: list) -> list[dict]:
    """The answers a Label Studio task's annotations count for, one ``{field: value}`` per
    annotator: cancelled (skipped) annotations never count; where some annotation is marked
    ``ground_truth`` only those count; an annotator with several annotations counts once, with
    the latest (``updated_at``, else ``created_at``, else list order). A ``choices`` result
    gives its one choice, or the list of its choices (empty or several); other results are
    ignored."""
    kept = [(i, a) for i, a in enumerate(annotations)
            if isinstance(a, dict) and not a.get("was_cancelled") and not a.get("skipped")]
    truth = [(i, a) for i, a in kept if a.get("ground_truth")]
    latest: dict = {}
    for i, a in truth or kept:
        user = a.get("completed_by")
        user = user.get("id", user.get("email")) if isinstance(user, dict) else user
        key = ("user", str(user)) if user is not None else ("annotation", i)
        stamp = (str(a.get("updated_at") or a.get("created_at") or ""), i)
        if key not in latest or stamp > latest[key][0]:
            latest[key] = (stamp, a)
    answers = []
    for _, annotation in sorted(latest.values(), key=lambda p: p[0][1]):
        answer = {}
        for result in annotation.get("result") or []:
            if not isinstance(result, dict) or result.get("type", "choices") != "choices":
                continue
            value = result.get("value") if isinstance(result.get("value"), dict) else {}
            choices, field = value.get("choices"), result.get("from_name")
            if isinstance(field, str) and isinstance(choices, list):
                answer[field] = choices[0] if len(choices) == 1 else list(choices)
        answers.append(answer)
    return answers


def argilla_row(record: dict, id_field: str = "id", where: str = "record") -> dict:
    """A gold row from one nested Argilla record (``record.to_dict()``): its fields, its id
    under ``id_field``, and per question the answer most of the counted responses give
    (``resolve``; one answer per ``user_id``). A response whose ``status`` is recorded counts
    only when ``submitted``; ``records.to_json``/``to_disk`` record none (argilla 2.x's
    ``record.to_dict`` keeps ``value`` and ``user_id`` only), and then every response counts
    and the row says so under ``STATUS_KEY`` (``"absent"``).

    Raises:
        InputError: ``fields`` or ``responses`` of the wrong shape (names ``where``).
    """
    fields = record.get("fields") or {}
    responses = record.get("responses") or {}
    if not isinstance(fields, dict) or not isinstance(responses, dict):
        raise InputError(f"{where}: 'fields' and 'responses' must be objects; is this an Argilla export?")
    row = dict(fields)
    row.setdefault(id_field, record.get("id"))
    triples, status_seen = [], False
    for question, answers in responses.items():
        if not isinstance(answers, list):
            raise InputError(f"{where}: responses to {question!r} are not a list")
        for j, a in enumerate(answers):
            if isinstance(a, dict):
                status_seen = status_seen or "status" in a
                triples.append((question, a.get("value"), a.get("user_id") or f"#{question}.{j}", a.get("status")))
    return _argilla_answers(row, triples, list(responses), "read" if status_seen or not triples else "absent")


def _argilla_answers(row: dict, triples: list, questions: list, status: str) -> dict:
    """``row`` with, per question, the consensus of the counted responses ``(question, value,
    user, status)`` (submitted, or of unknown status), and ``ANSWERS_KEY``/``STATUS_KEY``."""
    by_user: dict = {}
    for question, value, user, state in triples:
        if state in (None, "submitted"):
            by_user.setdefault(str(user), {})[question] = _plain(value)
    answers = list(by_user.values())
    for question in questions:
        row[question] = resolve(answers, question)[0]
    row[ANSWERS_KEY] = answers
    row[STATUS_KEY] = status
    return row


def resolve(answers: list[dict], field: str, missing: object = None) -> tuple[object, bool]:
    """The gold value of ``field`` from several annotators' ``answers`` (``{field: value}``
    each): the value most of them give (``consensus``), and whether that was a tie (no gold).
    An answer without ``field`` counts as ``missing`` (``None``: it does not count; ``[]`` for
    a multi-select field, where ticking nothing is the answer "none of these")."""
    values = [a.get(field, missing) for a in answers]
    value = consensus(values)
    return value, value is None and len({_hashable(v) for v in values if _present(v)}) > 1


def agreement(answers: dict[str, list[dict]], field: str, ids, *, multi: bool = False) -> dict:
    """How the annotators of ``field`` agree on the rows ``ids`` (ids as strings, keys of
    ``answers``): ``rows`` with two answers or more, ``disagree`` (not all the same), ``ties``
    (no single most given answer: no gold) with up to 5 ``tie_ids``, and ``agreement``, the
    mean over those rows of the share of annotator pairs that gave the same answer (observed
    agreement, the basis of Fleiss' kappa; ``None`` without such rows). Lists compare as sets."""
    rows = disagree = ties = 0
    shares, tie_ids = [], []
    for rid in ids:
        values = [_set_like(a.get(field, [] if multi else None)) for a in answers.get(rid, ())]
        values = [v for v in values if _present(v)]
        if len(values) < 2:
            continue
        rows += 1
        counts = Counter(values)
        disagree += len(counts) > 1
        pairs = len(values) * (len(values) - 1) / 2
        shares.append(sum(c * (c - 1) / 2 for c in counts.values()) / pairs)
        top = counts.most_common(2)
        if len(top) > 1 and top[0][1] == top[1][1]:
            ties += 1
            if len(tie_ids) < 5:
                tie_ids.append(rid)
    return {"rows": rows, "disagree": disagree, "ties": ties, "tie_ids": tie_ids,
            "agreement": sum(shares) / len(shares) if shares else None}


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
    (empty -> ``None``), Argilla's flattened ``<q>.responses`` (with ``.users`` and
    ``.status``: only submitted responses count, one per user) -> ``<q>``, a nested Argilla
    record -> its row. Other rows are returned as they are."""
    if isinstance(row.get("fields"), dict) and isinstance(row.get("responses"), dict):
        return argilla_row(row)
    if not any(isinstance(k, str) and (k.endswith(GOLD_SUFFIX) or k.endswith(".responses")) for k in row):
        return row
    flattened = any(isinstance(k, str) and k.endswith(".responses") for k in row)
    out = {k: v for k, v in row.items()
           if not (isinstance(k, str) and (k.endswith(GOLD_SUFFIX) or ".responses" in k or ".suggestion" in k
                                           or (flattened and k in ("_server_id", "status"))))}
    for key, value in row.items():
        if isinstance(key, str) and key.endswith(GOLD_SUFFIX) and key != GOLD_SUFFIX:
            out[key[: -len(GOLD_SUFFIX)]] = value if _present(value) else None
    if not flattened:
        return out
    triples, questions, status_seen = [], [], False
    for key, value in row.items():
        if not (isinstance(key, str) and key.endswith(".responses")):
            continue
        question = key[: -len(".responses")]
        questions.append(question)
        values, users = _as_list(value), _as_list(row.get(f"{key}.users"))
        status = _as_list(row.get(f"{key}.status"))
        status_seen = status_seen or f"{key}.status" in row
        for j, v in enumerate(values):
            user = users[j] if len(users) == len(values) and users[j] is not None else f"#{question}.{j}"
            triples.append((question, v, user, status[j] if len(status) == len(values) else None))
    return _argilla_answers(out, triples, questions, "read" if status_seen or not triples else "absent")


def take_notes(rows: list[dict], id_field: str | None, where: str) -> dict:
    """Move the readers' private keys (``ANSWERS_KEY``, ``STATUS_KEY``) out of ``rows`` (in
    place) into the notes ``read_gold`` keeps in ``frame.attrs[GOLD_ATTR]``: ``answers`` (``{row
    id as a string: [answer per annotator]}``, the rows of an annotation tool's export, keyed
    by ``id_field``, else ``row``), ``status`` (``"read"``, ``"absent"`` or ``None``) and
    ``warnings`` (the export keeps no response status, naming ``where``)."""
    key = id_field if id_field and any(id_field in r for r in rows) else "row"
    answers, statuses = {}, set()
    for row in rows:
        counted = row.pop(ANSWERS_KEY, None)
        statuses.add(row.pop(STATUS_KEY, None))
        if counted is not None and _present(row.get(key)):
            value = row[key]
            answers[str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)] = counted
    statuses.discard(None)
    warnings = []
    if "absent" in statuses:
        warnings.append(f"{where}: this Argilla export keeps no response status (dataset.records.to_json and "
                        "dataset.to_disk write only each response's value and user): draft and discarded "
                        "answers cannot be told from submitted ones and all count as answers; for submitted "
                        "answers only, export dataset.records.to_list(flatten=True) as JSON or "
                        "dataset.records.to_datasets().to_parquet(FILE), which keep <question>.responses.status")
    return {"answers": answers, "status": "absent" if "absent" in statuses else "read" if statuses else None,
            "warnings": warnings}


def server_name(name: str) -> str:
    """A name as Argilla's server accepts it for a question, field or metadata property
    (``ARGILLA_NAME``: lower case letters, digits, ``_`` and ``-``, at least one letter or
    digit): lower-cased, any other character replaced by ``_``. ``pcd review --to argilla``
    writes these names and ``pcd eval`` maps them back to the schema's fields."""
    return re.sub(r"[^a-z0-9_-]", "_", name.lower())


def is_label_studio_csv(columns) -> bool:
    """Whether a CSV/TSV header is Label Studio's CSV export (label-studio-sdk's converter
    always writes ``annotator``, ``annotation_id``, ``created_at``, ``updated_at`` and
    ``lead_time``): one row per annotation, Label Studio's task id in ``id``, several choices
    as a JSON cell, cancelled annotations left out without a trace."""
    return all(key in columns for key in _LS_CSV_KEYS)


def _plain(value):
    """A response value as Python data (a Parquet list cell is a numpy array)."""
    if value is None or isinstance(value, (str, bool, int, float, dict, list)):
        return value
    try:
        return [v for v in value]
    except TypeError:
        return value


def _set_like(value):
    return tuple(sorted(map(str, value))) if isinstance(value, (list, tuple)) else value


def gold_rows(path: str | Path, spec, *, fmt: str | None = None,
              fields=()) -> Iterator[tuple[int | None, "dict | str"]]:
    """``read_table_rows`` for gold files: every row as ``(line, columns)`` or ``(line, why it is
    unusable)``, an annotation-tool export read whole (lines ``None``), rows normalised
    (``normalize_row``). Used for the few-shot ``--examples``.

    Args:
        fields: the schema's fields (``.name``, ``.is_multi``): each read as ``pcd eval`` reads
            it, under its name where Argilla wrote ``server_name(name)``, and a multi-select
            field left out of an annotator's answer as ``[]`` ("none of these").

    Raises:
        InputError: as ``read_table_rows`` and ``read_export``.
    """
    from .readers import read_table_rows

    if fmt is None and is_export(path):
        _, rows = read_export(path, id_field=None)
        return ((None, _as_fields(row, fields)) for row in rows)
    return ((line, _as_fields(normalize_row(row), fields) if isinstance(row, dict) else row)
            for line, row in read_table_rows(path, spec, fmt=fmt))


def _as_fields(row: dict, fields) -> dict:
    """``row`` with ``fields`` read as ``pcd eval`` reads them (``gold_rows``), the private keys dropped."""
    answers = row.get(ANSWERS_KEY)
    for f in fields:
        column = f.name if f.name in row else server_name(f.name)
        if f.is_multi and answers is not None:
            row[f.name] = resolve(answers, column, missing=[])[0]
        elif column != f.name and column in row:
            row[f.name] = row[column]
    return _private_dropped(row)


def _private_dropped(row: dict) -> dict:
    row.pop(ANSWERS_KEY, None)
    row.pop(STATUS_KEY, None)
    return row


def _present(value) -> bool:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return False
    return not (isinstance(value, str) and not value.strip())


def _hashable(value):
    return tuple(sorted(value, key=str)) if isinstance(value, list) else value


def _as_list(value) -> list:
    if value is None or isinstance(value, (str, bytes, float, int, bool)):
        return []
    try:
        return list(value)
    except TypeError:
        return []
