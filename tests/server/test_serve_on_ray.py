"""``pcd serve --engine ray`` (issue #27 item 7): the server's routes through Ray Serve's proxy.

One test starts ``pcd serve --engine ray --replicas 1`` in a subprocess (a local Ray started by
pcd, 127.0.0.1 on a free port, the tiny random model saved to a folder), drives ``/health``,
``/ready``, ``/v1/label`` and ``/v1/systemone`` through Serve's proxy, sends SIGTERM, and checks
the exit status and that no Ray or pcd process is left. Skipped only when Ray Serve is not
installed (``make install`` installs it).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..helpers import pcd, tiny_backend

ROOT = Path(__file__).resolve().parents[2]
SMS = ROOT / "schemas" / "sms_spam.yaml"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_and_pcd_processes() -> dict[int, str]:
    """Ray's processes and ``pcd serve`` processes on this machine, pid -> command line."""
    import psutil

    found = {}
    for p in psutil.process_iter(["pid", "cmdline", "name"]):
        try:
            line = " ".join(p.info["cmdline"] or []) or (p.info["name"] or "")
        except psutil.Error:
            continue
        if any(k in line for k in ("ray::", "raylet", "gcs_server", "default_worker.py", "pcd_cli.cli serve")):
            found[p.info["pid"]] = line[:120]
    return found


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("serve-ray") / "tiny-model"
    backend = tiny_backend(chat_template=True)
    backend.model.save_pretrained(folder)
    backend.tokenizer._tok.save_pretrained(folder)
    return str(folder)


@pytest.mark.full  # 20 s of Ray Serve (make test was 56 s over 15 min)
def test_serve_on_ray_one_replica_answers_through_the_proxy_and_stops_clean(tiny_model, tmp_path):
    pytest.importorskip("ray.serve")
    httpx = pytest.importorskip("httpx")
    from pcd_cli.api import Labeler
    from pcd_cli.results import Record

    before = _ray_and_pcd_processes()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    log = open(tmp_path / "serve.log", "wb")
    deadline = time.monotonic() + 150
    for attempt in range(3):
        # a free port can be taken before Serve's proxy binds it (Ray's own connections take
        # ephemeral ports): pcd then exits 2 naming the port, and the test asks for another one
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        proc = subprocess.Popen([sys.executable, "-m", "pcd_cli.cli", "serve", "--engine", "ray", "--replicas", "1",
                                 "--schema", f"sms={SMS}", "--model", tiny_model, "--device", "cpu",
                                 "--port", str(port)], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                if httpx.get(url + "/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.25)
        if proc.poll() == 2 and "cannot listen there" in (tmp_path / "serve.log").read_text():
            continue
        break
    try:
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                if httpx.get(url + "/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()[-3000:]
            time.sleep(0.25)

        health = httpx.get(url + "/health")
        assert health.status_code == 200 and health.json() == {"status": "ok"}
        assert len(health.headers.get_list("x-request-id")) == 1  # Serve's id, not two copies
        given = httpx.get(url + "/health", headers={"x-request-id": "mine-1"})
        assert given.headers["x-request-id"] == "mine-1"

        texts = ["WINNER!! Claim your free prize now, text WIN to 80082", "ok see you at 7 then"]
        label = httpx.post(url + "/v1/label", json={"schema": "sms", "all_probs": True,
                                                    "records": [{"id": f"m{i}", "text": t} for i, t in enumerate(texts)]},
                           timeout=60)
        assert label.status_code == 200, label.text
        body = label.json()
        assert body["errors"] == [] and body["usage"]["records"] == 2
        assert body["metadata"]["pcd.model"] == "tiny-model"
        assert [r["id"] for r in body["rows"]] == ["m0", "m1"]
        # alone on an idle replica: exactly what the local Labeler (pcd label) gives, float32 as in Parquet
        import numpy as np

        local = Labeler(str(SMS), model=tiny_model, device="cpu").label_batch(
            [Record(f"m{i}", t) for i, t in enumerate(texts)])
        for row, want in zip(body["rows"], local):
            assert row["is_spam"] == want.fields[0].value
            assert row["is_spam__prob"] == float(np.float32(want.fields[0].prob))
            assert row["is_spam__probs"] == {"true": float(np.float32(want.fields[0].probs[0])),
                                             "false": float(np.float32(want.fields[0].probs[1]))}

        jev = httpx.post(url + "/v1/systemone", json={
            "model": "whatever", "state": "my card was charged twice for one order",
            "questions": {"team": {"type": "choice", "criteria": {"billing": "money and charges",
                                                                  "shipping": "deliveries", "other": None}}}},
            timeout=60)
        assert jev.status_code == 200, jev.text
        answer = jev.json()
        assert list(answer) == ["model", "answers", "usage"] and answer["model"] == "tiny-model"
        team = answer["answers"]["team"]
        assert team["type"] == "choice" and list(team["probabilities"]) == ["billing", "shipping", "other"]
        assert sum(team["probabilities"].values()) == pytest.approx(1.0, abs=1e-5)
        assert team["choice"] == max(team["probabilities"], key=team["probabilities"].get)
        assert jev.headers.get("x-typesafe-request-id")

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, (tmp_path / "serve.log").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    left = {}
    for _ in range(40):  # Ray's last processes may take a moment to be reaped
        left = {pid: line for pid, line in _ray_and_pcd_processes().items() if pid not in before}
        if not left:
            break
        time.sleep(0.25)
    assert left == {}
    with pytest.raises(httpx.TransportError):
        httpx.get(url + "/health", timeout=2)


def test_without_ray_engine_ray_exits_3_naming_the_pip_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed: `import ray` fails
    monkeypatch.setitem(sys.modules, "ray.serve", None)
    result = pcd("serve", "--engine", "ray", "--schema", f"sms={SMS}", "--port", str(_free_port()), code=None)
    assert result.exit_code == 3, result.output
    assert "pip install 'pcd-cli[ray]'" in " ".join(result.output.split())


def test_a_taken_port_exits_2_naming_it_before_ray_starts():
    pytest.importorskip("ray.serve")
    before = _ray_and_pcd_processes()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = pcd("serve", "--engine", "ray", "--schema", f"sms={SMS}", "--port", str(port), code=None)
    assert result.exit_code == 2, result.output
    assert f"--host 127.0.0.1 --port {port}: cannot listen there (Address already in use)" in " ".join(
        result.output.split())
    assert "Ray started" not in result.output
    assert {pid: line for pid, line in _ray_and_pcd_processes().items() if pid not in before} == {}


@pytest.mark.full  # 30 s of Ray Serve; the port taken before the check stays in make test
def test_a_port_taken_after_the_check_is_named_by_the_proxy_not_an_internal_error():
    """The race the check above cannot close: the proxy itself fails to bind. Real Ray, real Serve."""
    pytest.importorskip("ray.serve")
    import ray

    from pcd_cli.engines.ray_engine import connect, stop_local_ray
    from pcd_cli.errors import InputError
    from pcd_cli.server.ray_serve import require_serve, start_proxy

    if ray.is_initialized():
        pytest.skip("a Ray is already initialised in this process")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        connect(None)
        serve = require_serve()
        try:
            with pytest.raises(InputError) as raised:
                start_proxy(serve, "127.0.0.1", port)
        finally:
            serve.shutdown()
            stop_local_ray(ray)
    assert str(raised.value) == (f"--host 127.0.0.1 --port {port}: cannot listen there "
                                 f"(Ray Serve's proxy: Failed to bind to address '127.0.0.1:{port}'.)")


def test_replicas_need_engine_ray():
    result = pcd("serve", "--replicas", "2", "--schema", f"sms={SMS}", code=None)
    assert result.exit_code == 2, result.output
    assert "--replicas applies to --engine ray only" in " ".join(result.output.split())


@pytest.mark.full
def test_a_replica_that_cannot_load_the_model_exits_3_with_the_reason_and_leaves_nothing(tmp_path):
    pytest.importorskip("ray.serve")
    bad = tmp_path / "not-a-model"
    bad.mkdir()
    (bad / "config.json").write_text("{}")  # a folder the replica cannot load
    before = _ray_and_pcd_processes()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    result = subprocess.run([sys.executable, "-m", "pcd_cli.cli", "serve", "--engine", "ray", "--schema", f"sms={SMS}",
                             "--model", str(bad), "--device", "cpu", "--port", str(_free_port())],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 3, result.stderr[-3000:]
    assert f"the replicas could not start: pcd_cli.errors.ModelError: --model '{bad}'" in result.stderr
    time.sleep(1)
    assert {pid: line for pid, line in _ray_and_pcd_processes().items() if pid not in before} == {}
