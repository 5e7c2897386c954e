"""Background retraining under ``pcd serve --label-studio``: a retrain started by Label Studio swaps
the new model in atomically between decode calls while ``/predict`` and ``/v1/label`` traffic
goes on (no response mixes the two models; requests queued before the swap finish on the old
one); only a model not worse on the holdout is swapped in; one run per schema at a time; the
webhook answers within Label Studio's 1 s while a run goes on; the new version reaches
``/versions`` and Label Studio's project."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")

from pcd_cli.server.app import AppConfig  # noqa: E402
from pcd_cli.retrain import not_worse  # noqa: E402
from pcd_cli.server.label_studio import LabelStudioConfig  # noqa: E402
from pcd_cli.server.service import ServiceConfig  # noqa: E402

from ..helpers import FakeFit, retrained_labeler  # noqa: E402
from .harness import TokenizingHost, check_nothing_left, serve  # noqa: E402

BODIES = json.loads((Path(__file__).parent / "cases" / "label_studio" / "bodies.json").read_text())
OLD_P, NEW_P = 0.7, 0.9


@pytest.fixture
def ls(tmp_path):
    before = {t.ident for t in threading.enumerate()}
    host = TokenizingHost(delay=0.01)
    config = AppConfig(label_studio=LabelStudioConfig(state_dir=str(tmp_path / "state"), min_gold_rows=1))
    with serve(host, config=ServiceConfig(chunk_records=2), app_config=config) as server:
        backend = server.server.config.app.state.label_studio
        backend.build = lambda schema, job, own: retrained_labeler(schema, job, host, prob=NEW_P)
        told = []
        backend.patch_project = lambda base, token, project, version: told.append((base, token, project, version)) \
            or "ok"
        yield server, backend, told
        backend.wait_training(30)
    check_nothing_left(before)


def post(srv, path, body):
    return httpx.post(srv.url + path, json=body, timeout=30)


def test_swap_under_concurrent_predict_and_label_traffic(ls):
    srv, backend, told = ls
    backend.fit = FakeFit({"accuracy": 0.5, "nll": 1.0}, {"accuracy": 0.75, "nll": 0.8}, seconds=0.3)
    assert post(srv, "/setup", BODIES["setup"]).json() == {"model_version": "embedded:base"}
    post(srv, "/webhook", BODIES["annotation_created"])
    seen: list = []  # (route, set of probabilities in one response, model_version)
    stop = threading.Event()
    errors: list = []

    def predict_loop():
        while not stop.is_set():
            r = post(srv, "/predict", BODIES["predict"])
            if r.status_code != 200:
                errors.append(r.text)
                continue
            results = r.json()["results"]
            seen.append(("predict", {round(x["result"][0]["score"], 6) for x in results},
                         {x["model_version"] for x in results}))

    def label_loop():
        records = [f"tweet number {i} about a delayed flight" for i in range(10)]  # 5 chunks: 5 decode calls
        while not stop.is_set():
            r = post(srv, "/v1/label", {"schema": "triage", "records": records})
            if r.status_code != 200:
                errors.append(r.text)
                continue
            seen.append(("label", {round(row["sentiment__prob"], 6) for row in r.json()["rows"]}, None))

    threads = [threading.Thread(target=f) for f in (predict_loop, predict_loop, label_loop, label_loop)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    r = post(srv, "/webhook", BODIES["start_training"])
    assert r.json()["training"] == "started"
    backend.wait_training(30)
    time.sleep(0.8)
    stop.set()
    for t in threads:
        t.join(30)
    assert not errors
    new_version = backend.histories["triage"].current
    assert new_version.startswith("embedded:") and new_version != "embedded:base"
    mixed = [s for s in seen if len(s[1]) != 1]
    assert not mixed, mixed[:3]  # no response saw half a model
    probs = [next(iter(s[1])) for s in seen]
    assert OLD_P in probs and NEW_P in probs
    first_new = probs.index(NEW_P)
    assert probs[first_new:].count(OLD_P) <= 4  # only requests queued before the swap finish on the old one
    for route, p, versions in seen:  # each prediction names the model that made it
        if route == "predict":
            assert versions == ({new_version} if p == {NEW_P} else {"embedded:base"})
    # the version, its holdout figures, and Label Studio told with /setup's host and token
    history = httpx.get(srv.url + "/versions", timeout=10).json()
    assert history["versions"] == ["embedded:base", new_version]
    last = history["schemas"]["triage"]["history"][-1]
    assert (last["method"], last["accepted"], last["gold_rows"], last["before"], last["after"]) == \
        ("calibrate", True, 1, {"accuracy": 0.5, "nll": 1.0}, {"accuracy": 0.75, "nll": 0.8})
    assert told == [("http://localhost:8080", "0123456789abcdef", "3", new_version)]
    assert post(srv, "/setup", BODIES["setup"]).json() == {"model_version": new_version}
    # the trainer read the journal as a Label Studio export
    method, tasks = backend.fit.calls[0]
    assert method == "calibrate" and tasks[0]["annotations"][0]["result"][0]["value"]["choices"] == ["NEGATIVE"]


def test_a_worse_model_is_not_swapped_in_and_says_why(ls):
    srv, backend, told = ls
    backend.fit = FakeFit({"accuracy": 0.8, "nll": 0.5}, {"accuracy": 0.7, "nll": 0.4})
    post(srv, "/setup", BODIES["setup"])
    post(srv, "/webhook", BODIES["annotation_created"])
    assert post(srv, "/webhook", BODIES["start_training"]).json()["training"] == "started"
    backend.wait_training(30)
    last = backend.histories["triage"].items[-1]
    assert (last.accepted, last.reason) == (False, "holdout accuracy 0.7000 below the served model's 0.8000")
    assert backend.histories["triage"].current == "embedded:base" and told == []
    result = post(srv, "/predict", BODIES["predict"]).json()["results"][0]
    assert result["model_version"] == "embedded:base" and result["score"] == pytest.approx(OLD_P)


def test_one_run_per_schema_and_the_webhook_answers_within_a_second(ls):
    srv, backend, _ = ls
    backend.fit = FakeFit({"accuracy": 0.5, "nll": 1.0}, {"accuracy": 0.5, "nll": 1.0}, seconds=2.0)
    post(srv, "/setup", BODIES["setup"])
    post(srv, "/webhook", BODIES["annotation_created"])
    assert post(srv, "/webhook", BODIES["start_training"]).json()["training"] == "started"
    r = post(srv, "/webhook", BODIES["start_training"])
    assert r.json()["training"] == "busy"
    r = post(srv, "/webhook", BODIES["annotation_updated"])
    assert r.status_code == 200 and r.elapsed.total_seconds() < 1.0
    backend.wait_training(30)
    assert len(backend.fit.calls) == 1


def test_retrain_every_n_gold_rows(tmp_path):
    before = {t.ident for t in threading.enumerate()}
    host = TokenizingHost()
    config = AppConfig(label_studio=LabelStudioConfig(state_dir=str(tmp_path), retrain_every=2, min_gold_rows=1))
    with serve(host, app_config=config) as srv:
        backend = srv.server.config.app.state.label_studio
        backend.fit = FakeFit({"accuracy": 0.5, "nll": 1.0}, {"accuracy": 0.6, "nll": 0.9})
        backend.build = lambda schema, job, own: retrained_labeler(schema, job, host, prob=NEW_P)
        post(srv, "/setup", BODIES["setup"])
        assert post(srv, "/webhook", BODIES["annotation_created"]).json()["training"] is None  # 1 gold row
        assert post(srv, "/webhook", BODIES["annotation_cancelled"]).json()["training"] is None  # never gold
        second = json.loads(json.dumps(BODIES["annotation_created"]).replace('"id": 31', '"id": 35')
                            .replace('"id": 11', '"id": 15'))
        assert post(srv, "/webhook", second).json()["training"] == "started"  # 2 gold rows
        backend.wait_training(30)
        assert backend.histories["triage"].items[-1].gold_rows == 2
    check_nothing_left(before)


@pytest.mark.parametrize("before, after, ok", [
    ({"accuracy": 0.5, "nll": 1.0}, {"accuracy": 0.5, "nll": 1.0}, True),
    ({"accuracy": 0.5, "nll": 1.0}, {"accuracy": 0.6, "nll": 1.1}, False),
    ({"accuracy": 0.5, "nll": 1.0}, {"accuracy": 0.4, "nll": 0.9}, False),
    ({"accuracy": None, "nll": 1.0}, {"accuracy": None, "nll": 0.9}, True),
    ({}, {}, False),
])
def test_not_worse(before, after, ok):
    assert not_worse(before, after)[0] is ok


def test_a_restart_serves_the_last_accepted_version_and_keeps_the_journal(tmp_path):
    before = {t.ident for t in threading.enumerate()}
    config = AppConfig(label_studio=LabelStudioConfig(state_dir=str(tmp_path), min_gold_rows=1))
    with serve(TokenizingHost(), app_config=config) as srv:
        backend = srv.server.config.app.state.label_studio
        backend.fit = FakeFit({"accuracy": 0.5, "nll": 1.0}, {"accuracy": 0.6, "nll": 0.9})
        post(srv, "/setup", BODIES["setup"])
        post(srv, "/webhook", BODIES["annotation_created"])
        post(srv, "/webhook", BODIES["start_training"])
        backend.wait_training(30)
        served = backend.histories["triage"].current
        assert served != "embedded:base" and srv.service.named["triage"].options.seed == 1
    with serve(TokenizingHost(), app_config=config) as srv:  # the same --state-dir
        deadline = time.monotonic() + 10
        while srv.service.named["triage"].options.seed != 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert srv.service.named["triage"].options.seed == 1  # the fitted job is served again
        assert post(srv, "/setup", BODIES["setup"]).json() == {"model_version": served}
        history = httpx.get(srv.url + "/versions", timeout=10).json()["schemas"]["triage"]["history"]
        assert [(v["version"], v["reason"]) for v in history[-2:]] == [("embedded:base", ""),
                                                                      (served, "restored at start-up")]
        assert len(srv.server.config.app.state.label_studio.journal("3").gold_rows()) == 1
    check_nothing_left(before)
