"""The gold journal (``pcd_cli.io.gold_journal``): appends survive restarts and torn writes, the
latest save of an annotation wins, deletions remove it, cancelled annotations are never gold,
ground truth wins, and what it writes is read by ``pcd eval``'s own reader (``read_gold``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from pcd_cli.quality import read_gold
from pcd_cli.io.gold_journal import GoldJournal


def task(tid, text="a text"):
    return {"id": tid, "data": {"text": text, "id": f"r{tid}"}}


def ann(aid, tid, label, *, user=1, at="2026-12-04T22:00:00Z", cancelled=False, gt=False):
    return {"id": aid, "task": tid, "completed_by": user, "was_cancelled": cancelled, "ground_truth": gt,
            "created_at": at, "updated_at": at,
            "result": [] if cancelled else [{"from_name": "sentiment", "to_name": "text", "type": "choices",
                                             "value": {"choices": [label]}}]}


def gold(journal):
    return {row["id"]: row.get("sentiment") for row in journal.gold_rows()}


def test_latest_save_wins_and_survives_a_restart(tmp_path):
    path = tmp_path / "p" / "gold.jsonl"
    j = GoldJournal(path)
    j.append_annotation(task(1), ann(10, 1, "NEGATIVE"))
    j.append_annotation(task(2), ann(11, 2, "POSITIVE"))
    j.append_annotation(task(1), ann(10, 1, "NEUTRAL", at="2026-12-04T22:09:00Z"))  # ANNOTATION_UPDATED
    assert gold(GoldJournal(path)) == {"r1": "NEUTRAL", "r2": "POSITIVE"}  # a new object: read from disk
    assert len(path.read_text().splitlines()) == 3


def test_delete_removes_and_cancelled_is_never_gold(tmp_path):
    j = GoldJournal(tmp_path / "gold.jsonl")
    j.append_annotation(task(1), ann(10, 1, "NEGATIVE"))
    j.append_annotation(task(2), ann(11, 2, "POSITIVE", cancelled=True))
    j.append_annotation(task(3), ann(12, 3, "NEUTRAL"))
    j.append_delete(12)
    assert gold(j) == {"r1": "NEGATIVE"}
    assert [t["id"] for t in j.tasks()] == [1, 2]  # the cancelled one is kept, as an export keeps it


def test_ground_truth_wins_over_the_majority(tmp_path):
    j = GoldJournal(tmp_path / "gold.jsonl")
    j.append_annotation(task(1), ann(10, 1, "NEGATIVE", user=1))
    j.append_annotation(task(1), ann(11, 1, "NEGATIVE", user=2))
    j.append_annotation(task(1), ann(12, 1, "POSITIVE", user=3, gt=True))
    assert gold(j) == {"r1": "POSITIVE"}


def test_a_torn_last_line_is_skipped_and_the_next_append_starts_a_new_line(tmp_path):
    path = tmp_path / "gold.jsonl"
    j = GoldJournal(path)
    j.append_annotation(task(1), ann(10, 1, "NEGATIVE"))
    with path.open("ab") as fh:
        fh.write(b'{"event": "annotation", "task": {"id": 2, "da')  # a crash mid-write
    assert gold(GoldJournal(path)) == {"r1": "NEGATIVE"}
    j.append_annotation(task(3), ann(13, 3, "POSITIVE"))
    assert gold(GoldJournal(path)) == {"r1": "NEGATIVE", "r3": "POSITIVE"}


def test_appends_from_a_killed_process_are_whole(tmp_path):
    path = tmp_path / "gold.jsonl"
    code = ("import sys; from pcd_cli.io.gold_journal import GoldJournal; j = GoldJournal(sys.argv[1])\n"
            "for i in range(100000):\n"
            "    j.append_annotation({'id': i, 'data': {'text': 'x' * 2000, 'id': str(i)}}, {'id': i, 'result': "
            "[{'from_name': 'sentiment', 'type': 'choices', 'value': {'choices': ['NEUTRAL']}}]})\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)])
    try:
        while not path.exists() or path.stat().st_size < 50_000:
            assert proc.poll() is None
        os.kill(proc.pid, 9)
    finally:
        proc.wait(10)
    rows = GoldJournal(path).gold_rows()
    assert len(rows) >= 20 and all(r["sentiment"] == "NEUTRAL" for r in rows)
    assert [int(r["id"]) for r in rows] == list(range(len(rows)))


def test_the_export_it_writes_is_read_by_pcd_evals_reader(tmp_path):
    j = GoldJournal(tmp_path / "gold.jsonl")
    j.append_annotation({"id": 7, "data": {"review": "late again"}}, ann(10, 7, "NEGATIVE"))
    j.append_annotation({"id": 8, "data": {"review": "fine"}}, ann(11, 8, "NEUTRAL", cancelled=True))
    assert j.write_export(tmp_path / "export.json", text_var="review") == 2
    frame = read_gold(tmp_path / "export.json", id_field="id")
    assert frame.loc[frame["id"] == "ls-7", "sentiment"].tolist() == ["NEGATIVE"]
    assert frame.loc[frame["id"] == "ls-7", "text"].tolist() == ["late again"]
    exported = json.loads((tmp_path / "export.json").read_text())
    assert exported[1]["annotations"][0]["was_cancelled"] is True
