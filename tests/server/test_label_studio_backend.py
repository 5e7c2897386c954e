"""``pcd serve --label-studio`` answers what Label Studio sends (``label_studio/ml/api_connector.py``)
with the shapes it reads, over the fake host; no Label Studio needed. ``cases/label_studio/recorded.json``
holds bodies a real Label Studio 1.23.2 sent in ``test_label_studio_live.py`` (``make test-full``;
``PCD_RECORD_LABEL_STUDIO=FILE`` records them again, the token masked), replayed here;
``cases/label_studio/bodies.json`` holds variants of them (updates, skips, deletions, ``/train``)
made from Label Studio's serializers (``webhooks/models.py`` ``WebhookAction``)."""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")

from pcd_cli.schema.load import parse_schema  # noqa: E402
from pcd_cli.server.app import AppConfig  # noqa: E402
from pcd_cli.retrain import version_name  # noqa: E402
from pcd_cli.server.label_studio import LabelStudioConfig, MappingError, map_config, project_id  # noqa: E402

from .harness import AIRLINE, SMS, check_nothing_left, port_of, serve  # noqa: E402

BODIES = json.loads((Path(__file__).parent / "cases" / "label_studio" / "bodies.json").read_text())


@pytest.fixture
def srv(tmp_path):
    before = {t.ident for t in threading.enumerate()}
    config = AppConfig(label_studio=LabelStudioConfig(state_dir=str(tmp_path / "state"), min_gold_rows=1))
    with serve(app_config=config) as server:
        yield server
    check_nothing_left(before)


def post(srv, path, body, **kw):
    return httpx.post(srv.url + path, json=body, timeout=30, **kw)


def test_setup_maps_the_review_config_and_answers_the_model_version(srv, tmp_path):
    r = post(srv, "/setup", BODIES["setup"])
    assert r.status_code == 200
    assert r.json() == {"model_version": "embedded:base"}
    link = json.loads((tmp_path / "state" / "projects" / "3" / "link.json").read_text())
    assert link == {"project": "3", "mapping": {"schema": "triage", "fields": {"sentiment": "sentiment"},
                                                "to_name": "text", "text_var": "text", "choices": {}}}
    assert "0123456789abcdef" not in json.dumps(link)  # the token stays in memory


def test_predict_one_prediction_per_task_in_order_with_scores_and_distribution(srv):
    post(srv, "/setup", BODIES["setup"])
    r = post(srv, "/predict", BODIES["predict"])
    assert r.status_code == 200
    body = r.json()
    results = body["results"]
    assert len(results) == len(BODIES["predict"]["tasks"]) == 3
    labels = ("NEGATIVE", "NEUTRAL", "POSITIVE")
    decoded = srv.service.host.calls[-1]  # all tasks in one decode call, in order
    assert [text for _, text in decoded] == [t["data"]["text"] for t in BODIES["predict"]["tasks"]]
    for result in results:
        assert result["model_version"] == "embedded:base"
        (item,) = result["result"]
        assert item["from_name"] == "sentiment" and item["to_name"] == "text" and item["type"] == "choices"
        assert item["value"]["choices"][0] in labels
        assert item["score"] == pytest.approx(0.7)
        assert set(item["meta"]["probs"]) == set(labels)
        assert item["meta"]["probs"][item["value"]["choices"][0]] == pytest.approx(0.7)
        assert sum(item["meta"]["probs"].values()) == pytest.approx(1.0)
        assert result["score"] == pytest.approx(0.7)  # the review score: min over fields


def test_predict_counts_its_deadline_from_arrival_as_every_route(tmp_path):
    """A /predict whose body takes longer than the request timeout to arrive is past its deadline
    when read (503 ``deadline_exceeded``, nothing decoded): the deadline counts from the request's
    arrival, as /v1/label's does, not from the end of its body (issue #42 item 2). A body within
    the timeout is answered, so the refusal is the deadline's, not the body's."""
    config = AppConfig(request_timeout_s=1.0, read_timeout_s=5.0,
                       label_studio=LabelStudioConfig(state_dir=str(tmp_path / "state")))
    body = json.dumps(BODIES["predict"]).encode()
    head = (f"POST /predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()

    def send(srv, pause_s: float) -> tuple[int, dict, float]:
        with socket.create_connection(("127.0.0.1", port_of(srv)), timeout=10) as s:
            s.sendall(head + body[:10])
            time.sleep(pause_s)  # the rest of the body comes late
            s.sendall(body[10:])
            t = time.monotonic()
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        status = int(data.split(b" ", 2)[1])
        return status, json.loads(data.split(b"\r\n\r\n", 1)[1]), time.monotonic() - t

    with serve(app_config=config) as srv:
        assert post(srv, "/setup", BODIES["setup"]).status_code == 200
        calls = len(srv.service.host.calls)
        in_time, answer, _ = send(srv, 0.2)
        assert in_time == 200 and len(answer["results"]) == len(BODIES["predict"]["tasks"])
        assert len(srv.service.host.calls) == calls + 1
        late, refused, waited = send(srv, 1.3)
        assert late == 503 and refused["error"]["code"] == "deadline_exceeded"
        assert waited < 0.9  # refused at once: its deadline had passed while its body arrived
        assert len(srv.service.host.calls) == calls + 1  # and nothing was decoded for it


def test_predict_passes_label_studio_sdk_validation(srv):
    sdk = pytest.importorskip("label_studio_sdk.label_interface")
    post(srv, "/setup", BODIES["setup"])
    results = post(srv, "/predict", BODIES["predict"]).json()["results"]
    interface = sdk.LabelInterface(BODIES["setup"]["schema"])
    for result in results:
        assert interface.validate_prediction(result, return_errors=True) == []


def test_predict_task_without_text_keeps_the_count(srv):
    """A task without its text gets no prediction (an empty list: Label Studio stores none for it,
    so no invented score 0.0 puts it first in uncertainty sampling); the count stays and the
    response's ``errors`` names the task and the key."""
    post(srv, "/setup", BODIES["setup"])
    body = dict(BODIES["predict"], tasks=[{"id": 1, "data": {"other": "x"}}, BODIES["predict"]["tasks"][1]])
    answer = post(srv, "/predict", body).json()
    results = answer["results"]
    assert len(results) == 2
    assert results[0] == []
    assert results[1]["result"][0]["value"]["choices"][0] in ("NEGATIVE", "NEUTRAL", "POSITIVE")
    assert answer["errors"] == [{"task": 1, "index": 0, "error": "task 1: text field 'text' is missing or null"}]


def test_predict_without_setup_maps_the_body_label_config(srv):
    r = post(srv, "/predict", dict(BODIES["predict"], project="9.1796421540"))
    assert r.status_code == 200 and len(r.json()["results"]) == 3


def test_setup_refuses_a_config_it_cannot_map_naming_the_control(srv):
    xml = ('<View><Text name="t" value="$review"/><Choices name="mood" toName="t">'
           '<Choice value="happy"/><Choice value="sad"/></Choices></View>')
    r = post(srv, "/setup", dict(BODIES["setup"], schema=xml))
    assert r.status_code == 422
    error = r.json()["error"]
    assert error["code"] == "label_config_not_mapped"
    assert "'mood'" in error["message"] and "schema 'triage'" in error["message"]


def test_hand_written_config_maps_by_its_choices():
    xml = ('<View><Text name="tweet" value="$content"/><Choices name="Mood" toName="tweet" choice="single">'
           '<Choice value="POSITIVE"/><Choice value="NEGATIVE"/><Choice value="NEUTRAL"/></Choices></View>')
    mapping = map_config(xml, {"triage": AIRLINE, "sms": SMS})
    assert (mapping.schema, mapping.fields, mapping.to_name, mapping.text_var) == \
        ("triage", {"Mood": "sentiment"}, "tweet", "content")


def test_a_config_two_schemas_serve_is_refused_naming_both():
    twin = parse_schema({"name": "twin", "fields": {"sentiment": {"type": "enum", "description": "d",
                                                                  "labels": ["NEGATIVE", "NEUTRAL", "POSITIVE"]}}})
    with pytest.raises(MappingError, match="several served schemas \\(triage, twin\\)"):
        map_config(BODIES["setup"]["schema"], {"triage": AIRLINE, "twin": twin})


def test_webhook_journals_and_answers_at_once(srv, tmp_path):
    post(srv, "/setup", BODIES["setup"])
    r = post(srv, "/webhook", BODIES["annotation_created"])
    assert r.status_code == 200
    assert r.json() == {"status": "ok", "action": "ANNOTATION_CREATED", "events": 1, "training": None}
    assert r.elapsed.total_seconds() < 1.0  # Label Studio's webhook timeout
    lines = (tmp_path / "state" / "projects" / "3" / "gold.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["annotation"]["id"] == 31
    r = post(srv, "/webhook", {"action": "PROJECT_UPDATED", "project": {"id": 3}})
    assert r.json() == {"status": "ignored", "action": "PROJECT_UPDATED"}


def test_webhook_deleted_and_train_bodies(srv, tmp_path):
    post(srv, "/setup", BODIES["setup"])
    post(srv, "/webhook", BODIES["annotation_created"])
    r = post(srv, "/webhook", BODIES["annotations_deleted"])
    assert r.json()["events"] == 1
    backend = srv.server.config.app.state.label_studio
    assert backend.journal("3").tasks() == []
    backend.fit = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("no trainer in this test"))
    r = post(srv, "/train", BODIES["train"])
    assert r.status_code == 201 and r.json() == {"events": 1, "training": "started"}
    backend.wait_training(30)
    history = httpx.get(srv.url + "/versions", timeout=10).json()
    failed = history["schemas"]["triage"]["history"][-1]
    assert failed["accepted"] is False and failed["reason"] == "RuntimeError: no trainer in this test"
    assert history["versions"] == ["embedded:base"]


def test_basic_auth_as_label_studio_sends_it(tmp_path):
    before = {t.ident for t in threading.enumerate()}
    config = AppConfig(api_keys=("sekrit",), label_studio=LabelStudioConfig(state_dir=str(tmp_path)))
    with serve(app_config=config) as server:
        good = "Basic " + base64.b64encode(b"labelstudio:sekrit").decode()
        bad = "Basic " + base64.b64encode(b"labelstudio:wrong").decode()
        assert post(server, "/setup", BODIES["setup"], headers={"Authorization": good}).status_code == 200
        assert post(server, "/setup", BODIES["setup"], headers={"Authorization": bad}).status_code == 401
        assert post(server, "/setup", BODIES["setup"]).status_code == 401
        assert httpx.get(server.url + "/health", timeout=10).status_code == 200  # probes stay open
    check_nothing_left(before)


@pytest.mark.parametrize("value, expected", [("3.1796421540", "3"), (3, "3"), ({"id": 12, "title": "x"}, "12"),
                                             ("", None), (None, None), ({"title": "x"}, None)])
def test_project_id_forms(value, expected):
    assert project_id(value) == expected


def test_version_name_is_model_name_and_hash():
    assert version_name("HuggingFaceTB/SmolLM2-135M-Instruct", None) == "SmolLM2-135M-Instruct:base"
    assert version_name("out/tuned/", b"abc") == "tuned:ba7816bf8f01"


def test_routes_absent_without_the_option():
    before = {t.ident for t in threading.enumerate()}
    with serve() as server:
        assert post(server, "/setup", BODIES["setup"]).status_code == 404
    check_nothing_left(before)


RECORDED = json.loads((Path(__file__).parent / "cases" / "label_studio" / "recorded.json").read_text())


def test_bodies_recorded_from_a_real_label_studio(srv, tmp_path):
    """The bodies Label Studio 1.23.2 sent in ``test_label_studio_live.py``, replayed: /setup,
    /predict, an ANNOTATION_CREATED webhook and START_TRAINING get the answers Label Studio reads."""
    assert post(srv, "/setup", RECORDED["setup"]).json() == {"model_version": "embedded:base"}
    predict = RECORDED["predict"]
    results = post(srv, "/predict", predict).json()["results"]
    assert len(results) == len(predict["tasks"]) >= 1
    assert [text for _, text in srv.service.host.calls[-1]] == [t["data"]["text"] for t in predict["tasks"]]
    assert all(r["result"][0]["value"]["choices"][0] in ("NEGATIVE", "NEUTRAL", "POSITIVE") for r in results)
    hook = RECORDED["webhook:ANNOTATION_CREATED"]
    assert post(srv, "/webhook", hook).json()["events"] == 1
    project = str(hook["project"]["id"])
    (row,) = srv.server.config.app.state.label_studio.journal(project).gold_rows()
    assert row["sentiment"] == hook["annotation"]["result"][0]["value"]["choices"][0]
    backend = srv.server.config.app.state.label_studio
    backend.fit = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("not in this test"))
    assert post(srv, "/webhook", RECORDED["webhook:START_TRAINING"]).json()["training"] == "started"
    backend.wait_training(30)
