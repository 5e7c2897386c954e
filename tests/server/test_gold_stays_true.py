"""Gold that stays true under ``pcd serve --label-studio`` (issue #45 kind 2): deleted tasks and
projects leave the gold (Label Studio sends no ``ANNOTATIONS_DELETED`` for them); an event the
journal cannot keep is answered 503 naming the file and the reason, on every route that journals
(``/webhook`` actions, ``/train``, ``/setup``'s link), and the server goes on; an unusable
``--state-dir`` exits 2 naming it and the reason before the model loads; a retrain is not started
on too little gold per field, and ``/versions`` says which field has how many. The handed cases
``cases/ls-webhook-tasks-deleted-keeps-gold.py`` and ``cases/ls-state-dir-unusable.py`` (copied
unchanged from round 6) are replayed here."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")

from pcd_cli.errors import InputError, MachineError  # noqa: E402
from pcd_cli.io.gold_journal import GoldJournal  # noqa: E402
from pcd_cli.job import LabelJob  # noqa: E402
from pcd_cli.schema.load import parse_schema  # noqa: E402
from pcd_cli.server.app import AppConfig  # noqa: E402
from pcd_cli.server.command import check_state_dir  # noqa: E402
from pcd_cli.server.label_studio import LabelStudioConfig  # noqa: E402

from ..helpers import FakeFit, retrained_labeler  # noqa: E402
from .harness import CASES, ROOT, TokenizingHost, check_nothing_left, label_studio_server, port_of, serve  # noqa: E402

PCD = Path(sys.executable).with_name("pcd")
CONFIG = ('<View><Text name="text" value="$text"/><Choices name="sentiment" toName="text">'
          '<Choice value="NEGATIVE"/><Choice value="NEUTRAL"/><Choice value="POSITIVE"/></Choices></View>')


@pytest.fixture
def ls(tmp_path):
    """``label_studio_server`` with ``--state-dir tmp_path/state`` (its ``label-studio`` folder, as
    pcd serve lays it out); yields ``(server, backend, state folder)``."""
    with label_studio_server(tmp_path / "state" / "label-studio") as server:
        yield server


def post(srv, path, body):
    return httpx.post(srv.url + path, json=body, timeout=30)


def setup(srv, project, xml=CONFIG):
    return post(srv, "/setup", {"project": f"{project}.1796425530", "schema": xml, "hostname": "", "access_token": ""})


def annotation(project, tid, choices, *, results=None, aid=None):
    return {"action": "ANNOTATION_CREATED", "project": {"id": project},
            "task": {"id": tid, "data": {"text": f"tweet {tid}"}, "project": project},
            "annotation": {"id": aid or 1000 + tid, "task": tid, "completed_by": 1, "was_cancelled": False,
                           "result": results if results is not None else [
                               {"from_name": "sentiment", "to_name": "text", "type": "choices",
                                "value": {"choices": choices}}]}}


def gold_ids(backend, project):
    return [t["id"] for t in backend.journal(str(project)).tasks()]


def test_case_tasks_deleted_keeps_no_gold(ls):
    srv, backend, state = ls
    done = subprocess.run([sys.executable, str(CASES / "ls-webhook-tasks-deleted-keeps-gold.py"), str(port_of(srv)),
                           str(state.parent)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.startswith("PASS: "), done.stdout + done.stderr
    assert "'delete_tasks'" in done.stdout and "retrain gold_rows=2" in done.stdout
    assert gold_ids(backend, 48) == [1, 2]


def test_tasks_deleted_as_ids_or_objects_and_later_annotations_count(ls):
    srv, backend, _ = ls
    setup(srv, 71)
    for tid in (1, 2, 3):
        post(srv, "/webhook", annotation(71, tid, ["NEGATIVE"]))
    r = post(srv, "/webhook", {"action": "TASKS_DELETED", "tasks": [2], "project": {"id": 71}})
    assert r.json() == {"status": "ok", "action": "TASKS_DELETED", "events": 1, "training": None}
    assert gold_ids(backend, 71) == [1, 3]
    post(srv, "/webhook", annotation(71, 4, ["POSITIVE"]))  # a task made after the deletion is gold
    assert gold_ids(backend, 71) == [1, 3, 4] and backend.gold_rows("triage") == 3


def test_project_deleted_leaves_no_gold_and_forgets_the_project(ls):
    srv, backend, state = ls
    setup(srv, 72)
    setup(srv, 73)
    for project in (72, 73):
        post(srv, "/webhook", annotation(project, 1, ["NEUTRAL"], aid=100 + project))
    r = post(srv, "/webhook", {"action": "PROJECT_DELETED", "project": {"id": 72, "title": "gone"}})
    assert r.status_code == 200 and r.json()["events"] == 1
    assert gold_ids(backend, 72) == [] and gold_ids(backend, 73) == [1]
    assert "72" not in backend.links and not (state / "projects" / "72" / "link.json").exists()
    assert backend.gold_rows("triage") == 1
    assert [e["event"] for e in backend.journal("72").events()] == ["annotation", "delete_project"]


def test_the_journal_replays_task_and_project_deletions(tmp_path):
    journal = GoldJournal(tmp_path / "gold.jsonl")
    a = {"completed_by": 1, "result": [{"from_name": "f", "type": "choices", "value": {"choices": ["x"]}}]}
    for tid in (1, 2, 3):
        journal.append_annotation({"id": tid, "data": {"text": str(tid)}}, {**a, "id": tid})
    journal.append_task_delete([1, "3"])  # ids as Label Studio sends them, or as strings
    assert [t["id"] for t in journal.tasks()] == [2]
    journal.append_annotation({"id": 3, "data": {"text": "3"}}, {**a, "id": 33})
    assert [t["id"] for t in journal.tasks()] == [2, 3]
    journal.append_project_delete()
    assert journal.tasks() == []
    journal.append_annotation({"id": 9, "data": {"text": "9"}}, {**a, "id": 9})
    assert [t["id"] for t in GoldJournal(tmp_path / "gold.jsonl").tasks()] == [9]  # survives a reopen


def test_an_append_that_cannot_be_written_names_the_file_and_the_reason(tmp_path):
    (tmp_path / "projects").write_text("not a folder")
    journal = GoldJournal(tmp_path / "projects" / "5" / "gold.jsonl")
    with pytest.raises(MachineError, match=r"gold journal '.*projects/5/gold.jsonl': cannot write it .*Not a directory"):
        journal.append_delete(1)


@pytest.mark.parametrize("route, body", [
    ("/webhook", annotation(74, 1, ["NEGATIVE"])),
    ("/webhook", {"action": "ANNOTATIONS_DELETED", "annotations": [{"id": 1}], "project": {"id": 74}}),
    ("/webhook", {"action": "TASKS_DELETED", "tasks": [{"id": 1}], "project": {"id": 74}}),
    ("/webhook", {"action": "PROJECT_DELETED", "project": {"id": 74}}),
    ("/train", {"project": "74.1", "annotations": [{"id": 1, "data": {"text": "t"}, "annotations": [
        {"id": 5, "completed_by": 1, "result": []}]}]}),
])
def test_an_event_the_journal_cannot_keep_is_answered_503_naming_the_file(ls, route, body):
    srv, _, state = ls
    setup(srv, 74)
    shutil.rmtree(state / "projects")
    (state / "projects").write_text("not a folder")
    r = post(srv, route, body)
    assert r.status_code == 503 and r.headers["retry-after"] == "60"
    error = r.json()["error"]
    assert error["code"] == "journal_unwritable"
    assert f"{state / 'projects' / '74' / 'gold.jsonl'}" in error["message"] and "Not a directory" in error["message"]
    assert "was not kept" in error["message"]
    assert httpx.get(srv.url + "/health", timeout=10).status_code == 200  # the server goes on


def test_a_link_that_cannot_be_saved_is_answered_503_naming_it(ls):
    srv, _, state = ls
    shutil.rmtree(state / "projects", ignore_errors=True)
    (state / "projects").write_text("not a folder")
    r = setup(srv, 75)
    assert r.status_code == 503 and "projects/75" in r.json()["error"]["message"]
    assert "Not a directory" in r.json()["error"]["message"]


def test_an_unusable_state_dir_is_refused_naming_it_and_the_reason(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(InputError, match=r"--state-dir '.*afile': is a file, not a folder"):
        check_state_dir(tmp_path / "afile")
    with pytest.raises(InputError, match=r"--state-dir '.*afile/state': cannot create the folder .*\(Not a directory\)"):
        check_state_dir(tmp_path / "afile" / "state")
    check_state_dir(tmp_path / "good")
    assert sorted(p.name for p in (tmp_path / "good" / "label-studio").iterdir()) == ["projects", "schemas"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("sub", ["file/state", "file"])
def test_pcd_serve_exits_2_on_an_unusable_state_dir_before_the_model_loads(tmp_path, sub):
    (tmp_path / "file").write_text("x")
    done = subprocess.run([str(PCD), "serve", "--schema", f"triage={ROOT / 'schemas' / 'airline_sentiment.yaml'}",
                           "--label-studio", "--state-dir", str(tmp_path / sub), "--port", str(_free_port())],
                          capture_output=True, text=True, timeout=120)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 2 and "--state-dir" in last and str(tmp_path / sub) in last, done.stderr
    assert "listen" not in last and "loading the model" not in done.stderr


@pytest.mark.full  # 35 s: starts pcd serve on the embedded model
def test_case_state_dir_unusable():
    done = subprocess.run([sys.executable, str(CASES / "ls-state-dir-unusable.py"), str(PCD)], capture_output=True,
                          text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.startswith("PASS: "), done.stdout + done.stderr
    assert "webhook 503" in done.stdout and "0 traceback(s)" in done.stdout


TWO_FIELDS = parse_schema({"name": "tickets", "fields": {
    "sentiment": {"type": "enum", "description": "d", "labels": ["NEGATIVE", "NEUTRAL", "POSITIVE"]},
    "urgent": {"type": "boolean", "description": "d"}}})
TWO_CONFIG = ('<View><Text name="text" value="$text"/><Choices name="sentiment" toName="text"><Choice value="NEGATIVE"/>'
              '<Choice value="NEUTRAL"/><Choice value="POSITIVE"/></Choices><Choices name="urgent" toName="text">'
              '<Choice value="true"/><Choice value="false"/></Choices></View>')


def test_a_retrain_needs_enough_gold_per_field_and_versions_says_what_is_missing(tmp_path):
    """12 tasks, ``urgent`` answered on 6 of them (the issue's run: a calibration fitted on 6
    rows): not started, the webhook and /versions name ``urgent`` and its count; with 10 rows of
    each field the run starts."""
    before = {t.ident for t in threading.enumerate()}
    host = TokenizingHost()
    config = AppConfig(label_studio=LabelStudioConfig(state_dir=str(tmp_path)))
    with serve(host, app_config=config, schemas={"tickets": (TWO_FIELDS, LabelJob())}) as srv:
        backend = srv.server.config.app.state.label_studio
        backend.fit = FakeFit({"accuracy": 0.5, "nll": 1.0}, {"accuracy": 0.75, "nll": 0.8})
        backend.build = lambda schema, job, own: retrained_labeler(schema, job, host)
        assert setup(srv, 76, TWO_CONFIG).status_code == 200

        def result(name, value):
            return {"from_name": name, "to_name": "text", "type": "choices", "value": {"choices": [value]}}

        for tid in range(1, 13):
            results = [result("sentiment", "NEGATIVE")] + ([result("urgent", "true")] if tid <= 6 else [])
            post(srv, "/webhook", annotation(76, tid, None, results=results))
        answer = post(srv, "/webhook", {"action": "START_TRAINING", "project": {"id": 76}}).json()
        assert answer["training"] == "not_enough_gold"
        assert "field 'urgent' 6" in answer["reason"] and "'sentiment'" not in answer["reason"]
        last = httpx.get(srv.url + "/versions", timeout=10).json()["schemas"]["tickets"]["history"][-1]
        assert (last["accepted"], last["gold_rows"], last["reason"]) == (False, 12, answer["reason"])
        assert backend.fit.calls == [] and backend.histories["tickets"].current == "embedded:base"
        for tid in range(7, 11):  # urgent answered on 10 tasks now
            post(srv, "/webhook", annotation(76, tid, None, results=[result("sentiment", "NEGATIVE"),
                                                                     result("urgent", "false")], aid=2000 + tid))
        r = post(srv, "/train", {"project": "76.1", "annotations": []})
        assert r.status_code == 201 and r.json()["training"] == "started"
        assert "field 'urgent' 6" in r.json()["previous_run"]["reason"]  # the refusal before it
        backend.wait_training(30)
        assert len(backend.fit.calls) == 1 and backend.histories["tickets"].items[-1].accepted
    check_nothing_left(before)


def test_retrain_every_is_not_retried_on_every_annotation_while_gold_is_short(tmp_path):
    before = {t.ident for t in threading.enumerate()}
    config = AppConfig(label_studio=LabelStudioConfig(state_dir=str(tmp_path), retrain_every=2))
    with serve(app_config=config) as srv:
        backend = srv.server.config.app.state.label_studio
        setup(srv, 77)
        statuses = [post(srv, "/webhook", annotation(77, tid, ["NEGATIVE"])).json()["training"] for tid in range(1, 6)]
        assert statuses == [None, "not_enough_gold", None, "not_enough_gold", None]
        assert [v.reason.startswith("not enough gold") for v in backend.histories["triage"].items[1:]] == [True, True]
    check_nothing_left(before)


def test_an_annotation_without_its_task_is_never_dropped_silently(ls):
    srv, backend, _ = ls
    setup(srv, 78)
    a = annotation(78, 1, ["NEGATIVE"])["annotation"]
    r = post(srv, "/webhook", {"action": "ANNOTATION_CREATED", "project": {"id": 78}, "annotation": a})
    assert r.status_code == 422 and r.json()["error"]["code"] == "annotation_not_kept"
    assert "annotation 1001: its task 1 is not in the body" in r.json()["error"]["message"]
    r = post(srv, "/webhook", {"action": "ANNOTATION_CREATED", "project": {"id": 78}, "annotation": a,
                               "task": {"id": 1}})  # a task without its data
    assert r.status_code == 422 and "'data' object" in r.json()["error"]["message"]
    both = {"action": "ANNOTATIONS_CREATED", "project": {"id": 78}, "annotations": [a, {**a, "id": 7, "task": 2}],
            "tasks": [{"id": 1, "data": {"text": "t"}}, {"id": 3, "data": {"text": "u"}}]}
    r = post(srv, "/webhook", both)
    assert r.status_code == 200 and r.json()["events"] == 1
    assert r.json()["not_kept"] == [{"annotation": 7, "reason": "its task 2 is not in the body"}]
    assert gold_ids(backend, 78) == [1]


def test_a_version_history_that_cannot_be_written_is_blamed_on_the_state_dir(tmp_path):
    """A state folder that passed the start-up check but whose versions.json cannot be written
    (here a folder by that name): exit 2 naming the file and the reason, not the port."""
    from pcd_cli.server.label_studio import LabelStudioBackend

    (tmp_path / "schemas" / "triage" / "versions.json").mkdir(parents=True)
    with serve() as srv:
        with pytest.raises(InputError, match=r"--state-dir: the version history '.*versions.json': cannot write "
                                             r"\(Is a directory\)"):
            LabelStudioBackend(srv.service, LabelStudioConfig(state_dir=str(tmp_path)))
