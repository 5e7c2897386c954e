"""A real Label Studio (``label-studio`` 1.23.2 from the package registry, in a venv of this test's
own under ``~/.cache/pcd-test/label-studio-venv``, reused when present) with ``pcd serve
--label-studio`` as its ML backend, everything done through Label Studio's own API: a project from
``pcd review``'s config, the backend connected, predictions retrieved, annotations posted (the
webhook journals them), training pressed, and the remaining tasks predicted by the new version.
Label Studio runs on 127.0.0.1 with its SSRF switches off (``SSRF_PROTECTION_ENABLED``,
``ML_BLOCK_LOCAL_IP``: docs/review.md) and legacy tokens on (the token ``/setup`` sends), and is
stopped after; nothing is left running. ``make test-full`` only (marker ``full``).

pcd's side runs over the fake host and a fake fit that returns a better model (the protocol is
what this test checks; ``benchmarks/label_studio_loop.py`` measures the real model's retrain).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.full

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")

from pcd_cli.server.app import AppConfig  # noqa: E402
from pcd_cli.server.label_studio import LabelStudioConfig  # noqa: E402

from ..helpers import FakeFit, retrained_labeler  # noqa: E402
from .harness import TokenizingHost, check_nothing_left, children, serve  # noqa: E402

VERSION = "1.23.2"
VENV = Path(os.environ.get("PCD_TEST_CACHE", Path.home() / ".cache" / "pcd-test")) / "label-studio-venv"
TOKEN = "0123456789abcdef0123456789abcdef01234567"
BODIES = json.loads((Path(__file__).parent / "cases" / "label_studio" / "bodies.json").read_text())
TEXTS = ["@united lost my bag again", "@united great crew, thanks", "@united is 12 on time?",
         "@united worst delay ever", "@united lovely flight", "@united what gate for 404?"]


def label_studio_venv() -> Path:
    """The venv with label-studio installed (made once; skipped when the registry cannot be reached)."""
    exe = VENV / "bin" / "label-studio"
    if not exe.exists():
        VENV.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        done = subprocess.run([str(VENV / "bin" / "pip"), "install", "-q", f"label-studio=={VERSION}"],
                              check=False, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            pytest.skip(f"label-studio could not be installed: {done.stderr[-300:]}")
    return exe


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def label_studio(tmp_path):
    """Label Studio on 127.0.0.1 (a free port) for one test; afterwards its process group is gone
    and no thread or child process the test started is left (``check_nothing_left``)."""
    before = {t.ident for t in threading.enumerate()}
    exe = label_studio_venv()
    port = free_port()
    env = dict(os.environ, LABEL_STUDIO_BASE_DATA_DIR=str(tmp_path / "ls"), SSRF_PROTECTION_ENABLED="false",
               ML_BLOCK_LOCAL_IP="false", LABEL_STUDIO_ENABLE_LEGACY_API_TOKEN="true", DJANGO_DB="sqlite",
               LABEL_STUDIO_HOST=f"http://127.0.0.1:{port}")
    log = (tmp_path / "label-studio.log").open("wb")
    proc = subprocess.Popen([str(exe), "start", "--no-browser", "--internal-host", "127.0.0.1", "-p", str(port),
                             "--username", "pcd@example.com", "--password", "pcd-test-pass", "--user-token", TOKEN],
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 900
        while True:
            assert proc.poll() is None, (tmp_path / "label-studio.log").read_text()[-3000:]
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "Label Studio did not start within 900 s"
            time.sleep(2)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()
    check_nothing_left(before)
    assert proc.pid not in children()


def test_label_studio_round_trip(label_studio, tmp_path):
    api = httpx.Client(base_url=label_studio, headers={"Authorization": f"Token {TOKEN}"}, timeout=120)
    host = TokenizingHost()
    config = AppConfig(label_studio=LabelStudioConfig(state_dir=str(tmp_path / "state"), min_gold_rows=1))
    with serve(host, app_config=config) as srv:
        backend = srv.server.config.app.state.label_studio
        backend.fit = FakeFit({"accuracy": 0.5, "nll": 1.0}, {"accuracy": 0.75, "nll": 0.8})
        backend.build = lambda schema, job, own: retrained_labeler(schema, job, host)
        backend.recorded = []
        project = api.post("/api/projects", json={"title": "pcd live loop",
                                                  "label_config": BODIES["setup"]["schema"]}).json()
        pid = project["id"]
        r = api.post(f"/api/projects/{pid}/import", json=[{"data": {"text": t, "id": f"t{i}"}}
                                                           for i, t in enumerate(TEXTS)])
        assert r.status_code == 201, r.text
        ml = api.post("/api/ml", json={"url": srv.url, "project": pid, "title": "pcd", "is_interactive": False})
        assert ml.status_code == 201, ml.text
        assert ml.json()["state"] == "CO", ml.json()  # connected: /health and /setup answered
        tasks = api.get("/api/tasks", params={"project": pid, "page_size": 100}).json()["tasks"]
        ids = sorted(t["id"] for t in tasks)
        r = api.post("/api/dm/actions", params={"id": "retrieve_tasks_predictions", "project": pid},
                     json={"selectedItems": {"all": False, "included": ids[:3]}})
        assert r.status_code == 200, r.text
        predictions = api.get("/api/predictions", params={"project": pid}).json()
        assert {p["task"] for p in predictions} == set(ids[:3])
        assert {p["model_version"] for p in predictions} == {"embedded:base"}
        assert all(p["result"][0]["value"]["choices"][0] in ("NEGATIVE", "NEUTRAL", "POSITIVE") for p in predictions)
        for tid, label in zip(ids[:3], ("NEGATIVE", "POSITIVE", "NEUTRAL")):
            r = api.post(f"/api/tasks/{tid}/annotations", json={"result": [
                {"from_name": "sentiment", "to_name": "text", "type": "choices", "value": {"choices": [label]}}]})
            assert r.status_code == 201, r.text
        assert len(backend.journal(str(pid)).gold_rows()) == 3  # the webhook journalled them
        r = api.post(f"/api/ml/{ml.json()['id']}/train", json={})
        assert r.status_code == 200, r.text
        backend.wait_training(120)
        new_version = backend.histories["triage"].current
        assert new_version != "embedded:base"
        assert api.get(f"/api/projects/{pid}").json()["model_version"] == new_version
        r = api.post("/api/dm/actions", params={"id": "retrieve_tasks_predictions", "project": pid},
                     json={"selectedItems": {"all": False, "included": ids[3:]}})
        assert r.status_code == 200, r.text
        fresh = [p for p in api.get("/api/predictions", params={"project": pid}).json() if p["task"] in ids[3:]]
        assert {p["task"] for p in fresh} == set(ids[3:])
        assert {p["model_version"] for p in fresh} == {new_version}
        assert [p["score"] for p in fresh] == pytest.approx([0.9] * len(fresh), abs=1e-6), [p["score"] for p in fresh]
        link = backend.links[str(pid)]  # what /setup carried: the project's token, Label Studio's host
        assert link.access_token == TOKEN and link.hostname.startswith("http")
        sent = json.loads(backend.journal(str(pid)).path.read_text().splitlines()[0])["annotation"]
        assert set(sent) >= set(BODIES["annotation_created"]["annotation"]) - {"created_username", "created_ago"}
        api.close()
        check_recorded(backend.recorded)


def check_recorded(recorded: list) -> None:
    """What Label Studio sent has the shape of ``cases/label_studio/recorded.json``, the bodies the
    contract tests replay (``PCD_RECORD_LABEL_STUDIO=FILE`` writes them afresh, the token masked)."""
    kinds = {}
    for path, body in recorded:
        kind = path.strip("/") + (":" + body["action"] if "action" in body else "")
        kinds.setdefault(kind, body)
    assert {"setup", "predict", "webhook:ANNOTATION_CREATED", "webhook:START_TRAINING"} <= set(kinds), sorted(kinds)
    if os.environ.get("PCD_RECORD_LABEL_STUDIO"):
        text = json.dumps(kinds, indent=1, sort_keys=True).replace(TOKEN, "0" * len(TOKEN))
        Path(os.environ["PCD_RECORD_LABEL_STUDIO"]).write_text(text + "\n")
    saved = json.loads((Path(__file__).parent / "cases" / "label_studio" / "recorded.json").read_text())
    for kind, body in saved.items():
        assert set(kinds[kind]) == set(body), (kind, sorted(kinds[kind]), sorted(body))
