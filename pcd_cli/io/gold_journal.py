"""The gold journal of one Label Studio project: every annotation event ``pcd serve
--label-studio`` hears, kept on disk as an append-only JSON-lines file, read back as the tasks a
Label Studio ``Export -> JSON`` would hold.

One line per event (``GoldJournal.append_*``)::

    {"event": "annotation", "task": {"id": 7, "data": {...}}, "annotation": {"id": 31, "result": [...],
     "was_cancelled": false, "ground_truth": false, "completed_by": 1, "created_at": ..., "updated_at": ...}}
    {"event": "delete", "annotation": 31}
    {"event": "delete_tasks", "tasks": [3, 4]}
    {"event": "delete_project"}

Reading (``GoldJournal.tasks``) replays the lines in order: an annotation line replaces any
earlier line with the same annotation id (``ANNOTATION_UPDATED``: the latest wins), a delete line
removes it, a ``delete_tasks`` line removes every annotation of those tasks (Label Studio's
``TASKS_DELETED``: it deletes the tasks' annotations without an ``ANNOTATIONS_DELETED``), a
``delete_project`` line everything before it (``PROJECT_DELETED``); a task keeps its latest
``data``. What counts as gold is then decided by the one
reader ``pcd eval`` reads exports with (``pcd_cli.io.annotations.label_studio_rows``):
cancelled (skipped) annotations never count, ground-truth annotations alone where a task has
any, one answer per annotator (the latest), the majority over annotators.

Appends are atomic: each event is one ``os.write`` of a whole line on a file opened with
``O_APPEND``, then ``fsync``; a line torn by a crash (the file does not end with a newline) is
skipped when read, and the next append starts on a new line. The file survives restarts: a new
``GoldJournal`` over the same path reads everything appended before. An append that cannot be
written (the folder or file not writable, the disk full) raises ``MachineError`` naming the
path and the system's reason: the caller must tell whoever sent the event that it was not kept.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

from ..errors import MachineError
from .annotations import ANSWERS_KEY, label_studio_rows

log = logging.getLogger("pcd.server")

#: File name of a project's journal inside its folder.
JOURNAL_NAME = "gold.jsonl"


class GoldJournal:
    """An append-only journal of one project's annotations (module doc).

    Args:
        path: the JSON-lines file (created, with its folder, on the first append).

    Thread-safe: appends and reads take one lock (the webhook handler and the retrain thread
    share a journal).
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock = threading.Lock()

    # -- writing ----------------------------------------------------------------------------------
    def append_annotation(self, task: dict, annotation: dict) -> None:
        """Record an annotation created or updated (Label Studio's ``ANNOTATION_CREATED``,
        ``ANNOTATION_UPDATED``, or one of ``/train``'s tasks).

        Args:
            task: the task, at least ``{"id", "data"}`` (other keys are not kept).
            annotation: the annotation as Label Studio serialises it; its ``id`` identifies it
                (an annotation without one is keyed by task and annotator).

        Raises:
            ValueError: ``task`` has no ``id`` or no ``data`` object.
        """
        if not isinstance(task, dict) or "id" not in task or not isinstance(task.get("data"), dict):
            raise ValueError("an annotation event needs its task with 'id' and a 'data' object")
        if not isinstance(annotation, dict):
            raise ValueError("an annotation event needs the annotation object")
        self._append({"event": "annotation", "task": {"id": task["id"], "data": task["data"]},
                      "annotation": annotation})

    def append_delete(self, annotation_id) -> None:
        """Record that the annotation ``annotation_id`` was deleted (``ANNOTATIONS_DELETED``)."""
        self._append({"event": "delete", "annotation": annotation_id})

    def append_task_delete(self, task_ids) -> None:
        """Record that the tasks ``task_ids`` were deleted with their annotations (Label Studio's
        ``TASKS_DELETED``, which carries only the ids)."""
        self._append({"event": "delete_tasks", "tasks": list(task_ids)})

    def append_project_delete(self) -> None:
        """Record that the project was deleted (``PROJECT_DELETED``): nothing before counts."""
        self._append({"event": "delete_project"})

    def _append(self, event: dict) -> None:
        """Append one event line (module doc).

        Raises:
            MachineError: the line could not be written and synced; names the path and the
                system's reason (``strerror``).
        """
        line = json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
        with self._lock:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    size = os.fstat(fd).st_size
                    if size and _last_byte(self.path, size) != b"\n":
                        line = b"\n" + line  # a torn line before: start on a new one
                    os.write(fd, line)
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError as exc:
                where = exc.filename if isinstance(exc.filename, str) else str(self.path)
                raise MachineError(f"gold journal {str(self.path)!r}: cannot write it ({where!r}: "
                                   f"{exc.strerror or exc})") from None

    # -- reading ----------------------------------------------------------------------------------
    def events(self) -> list[dict]:
        """Every whole event line in order (a torn or unreadable line skipped, with a log line)."""
        if not self.path.is_file():
            return []
        with self._lock:
            data = self.path.read_bytes()
        out = []
        lines = data.split(b"\n")
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            if i == len(lines) - 1:  # no newline after it: torn by a crash mid-append
                log.warning("gold journal %s: the last line is incomplete (a crash while writing); skipped", self.path)
                continue
            try:
                event = json.loads(line)
            except ValueError:
                log.warning("gold journal %s: line %d is not JSON; skipped", self.path, i + 1)
                continue
            if isinstance(event, dict):
                out.append(event)
        return out

    def tasks(self) -> list[dict]:
        """The journal replayed as Label Studio export tasks ``{"id", "data", "annotations"}``, in
        the order tasks were first seen; tasks left without annotations are dropped."""
        tasks: dict = {}
        where: dict = {}  # annotation key -> task id
        for event in self.events():
            kind = event.get("event")
            if kind == "annotation":
                task, annotation = event.get("task") or {}, event.get("annotation") or {}
                tid = task.get("id")
                slot = tasks.setdefault(tid, {"id": tid, "data": {}, "annotations": {}})
                slot["data"] = task.get("data") or slot["data"]
                key = _annotation_key(tid, annotation)
                old = where.get(key)
                if old is not None and old != tid:
                    tasks[old]["annotations"].pop(key, None)
                slot["annotations"].pop(key, None)  # re-inserted last: list order follows the latest save
                slot["annotations"][key] = annotation
                where[key] = tid
            elif kind == "delete":
                key = ("id", str(event.get("annotation")))
                tid = where.pop(key, None)
                if tid is not None:
                    tasks[tid]["annotations"].pop(key, None)
            elif kind == "delete_tasks":
                for tid in {str(t) for t in event.get("tasks") or []}:
                    for key in [k for k, t in where.items() if str(t) == tid]:
                        where.pop(key)
                    for t in [t for t in tasks if str(t) == tid]:
                        del tasks[t]
            elif kind == "delete_project":
                tasks.clear()
                where.clear()
        return [{"id": t["id"], "data": t["data"], "annotations": list(t["annotations"].values())}
                for t in tasks.values() if t["annotations"]]

    def gold_rows(self) -> list[dict]:
        """The tasks' gold rows by ``pcd eval``'s rules (``label_studio_rows``: cancelled never
        gold, ground truth wins, one answer per annotator, majority), each row the task's
        ``data`` plus one value per answered field; rows without any answer are left out."""
        rows = label_studio_rows(self.tasks(), f"gold journal {str(self.path)!r}")
        return [r for r in rows if any(a for a in r.get(ANSWERS_KEY, []))]

    def write_export(self, path: str | Path, *, id_field: str = "id", text_field: str = "text",
                     text_var: str = "text") -> int:
        """Write the journal as a Label Studio ``Export -> JSON`` file, the form ``pcd tune`` and
        ``pcd calibrate`` read as gold (``read_gold``). Each task's ``data`` gets ``id_field``
        (Label Studio's task id as ``ls-<id>`` when the task has no such key) and
        ``text_field`` (copied from ``text_var``, the config's text variable, when they differ).

        Returns:
            The number of tasks with at least one annotation written.
        """
        from ..io.files import write_atomic

        tasks = self.tasks()
        for task in tasks:
            data = dict(task["data"])
            data.setdefault(id_field, f"ls-{task['id']}")
            if text_var != text_field and text_var in data:
                data[text_field] = data[text_var]
            task["data"] = data
        write_atomic(path, json.dumps(tasks, ensure_ascii=False).encode() + b"\n")
        return len(tasks)


def _annotation_key(task_id, annotation: dict) -> tuple:
    """An annotation's identity: its Label Studio id, else (task, annotator)."""
    if annotation.get("id") is not None:
        return ("id", str(annotation["id"]))
    user = annotation.get("completed_by")
    user = user.get("id", user.get("email")) if isinstance(user, dict) else user
    return ("task-user", str(task_id), str(user))


def _last_byte(path: Path, size: int) -> bytes:
    with path.open("rb") as fh:
        fh.seek(size - 1)
        return fh.read(1)
