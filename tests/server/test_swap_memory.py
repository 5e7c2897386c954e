"""A swap that costs one model (issue #45, kind 3): after any number of retrains and swaps the
process holds the served labeler (and the host's model) and nothing of the ones swapped out; the
state dir keeps the run folders of the served version and the one before it, and deletes the
rest; a restart's ``/ready`` (and ``/setup``) wait until the restored version serves.

The memory itself, with the real model, is measured by ``benchmarks/serve_swap_memory.py`` and
by the handed case ``cases/ls-tune-swap-memory.py`` (``test_replayed_case_ls_tune_swap_memory``,
under ``full``: real tune retrains take minutes on a CPU)."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from pcd_cli.server.app import AppConfig  # noqa: E402
from pcd_cli.server.label_studio import LabelStudioConfig  # noqa: E402

from ..helpers import FakeFit, retrained_labeler  # noqa: E402
from .harness import CASES, ROOT, TokenizingHost, check_nothing_left, envelope, port_of, serve  # noqa: E402

BODIES = json.loads((Path(__file__).parent / "cases" / "label_studio" / "bodies.json").read_text())
BETTER = ({"accuracy": 0.5, "nll": 1.0}, {"accuracy": 0.75, "nll": 0.8})
WORSE = ({"accuracy": 0.8, "nll": 0.5}, {"accuracy": 0.7, "nll": 0.6})


def post(srv, path, body):
    return httpx.post(srv.url + path, json=body, timeout=30)


def _config(state):
    return AppConfig(label_studio=LabelStudioConfig(state_dir=str(state), min_gold_rows=1))


def _retrain(srv, backend, figures):
    backend.fit = FakeFit(*figures)
    assert post(srv, "/webhook", BODIES["start_training"]).json()["training"] == "started"
    backend.wait_training(30)


def test_three_swaps_hold_only_the_served_labeler_and_the_state_dir_keeps_two_runs(tmp_path):
    before = {t.ident for t in threading.enumerate()}
    state = tmp_path / "state"
    host = TokenizingHost()
    with serve(host, app_config=_config(state)) as srv:
        backend = srv.server.config.app.state.label_studio
        built: list[weakref.ref] = [weakref.ref(srv.service.named["triage"].labeler)]  # the startup one

        def build(schema, job, own):
            labeler = retrained_labeler(schema, job, host, prob=0.9)
            built.append(weakref.ref(labeler))
            return labeler

        backend.build = build
        post(srv, "/setup", BODIES["setup"])
        post(srv, "/webhook", BODIES["annotation_created"])
        for _ in range(3):
            _retrain(srv, backend, BETTER)
            assert post(srv, "/predict", BODIES["predict"]).status_code == 200  # decoded on the new one
        _retrain(srv, backend, WORSE)  # a rejected run: its folder goes
        gc.collect()
        alive = [r() for r in built if r() is not None]
        assert len(built) == 4 and alive == [srv.service.named["triage"].labeler]
        history = backend.histories["triage"].items
        accepted = [v for v in history if v.accepted and v.method != "base"]
        assert len(accepted) == 3 and not history[-1].accepted
        runs = sorted(p.name for p in (state / "schemas" / "triage").glob("run-*"))
        kept = sorted(Path(v.path).parent.name for v in accepted[-2:])
        assert runs == kept  # the served version's run and the one before it; nothing else
        assert Path(accepted[-1].path).is_file() and not Path(accepted[0].path).exists()
        assert not Path(history[-1].path).exists()
    check_nothing_left(before)


def test_ready_and_setup_wait_until_the_restored_version_serves(tmp_path):
    before = {t.ident for t in threading.enumerate()}
    state = tmp_path / "state"
    with serve(TokenizingHost(), app_config=_config(state)) as srv:
        backend = srv.server.config.app.state.label_studio
        post(srv, "/setup", BODIES["setup"])
        post(srv, "/webhook", BODIES["annotation_created"])
        _retrain(srv, backend, BETTER)
        served = backend.histories["triage"].current
    load, restoring = threading.Event(), threading.Event()
    release = threading.Event()
    with serve(TokenizingHost(load_gate=load), app_config=_config(state), wait_ready=False) as srv:
        backend = srv.server.config.app.state.label_studio
        default_build = backend.build

        def slow_build(schema, job, own):  # the restored version takes a while to build
            restoring.set()
            release.wait(10)
            return default_build(schema, job, own)

        backend.build = slow_build
        load.set()
        assert restoring.wait(10)
        ready = httpx.get(srv.url + "/ready", timeout=5)
        setup = post(srv, "/setup", BODIES["setup"])
        predict = post(srv, "/predict", BODIES["predict"])
        release.set()
        assert srv.service.ready.wait(10)
        after = httpx.get(srv.url + "/ready", timeout=5)
        setup_after = post(srv, "/setup", BODIES["setup"]).json()
        first = post(srv, "/predict", BODIES["predict"]).json()
    assert ready.status_code == 503 and envelope(ready)["code"] == "not_ready"
    assert setup.status_code == 503 and envelope(setup)["code"] == "not_ready"
    assert predict.status_code == 503 and envelope(predict)["code"] == "not_ready"
    assert after.status_code == 200
    assert setup_after == {"model_version": served} and served != "embedded:base"
    assert first["results"][0]["model_version"] == served
    check_nothing_left(before)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.full  # minutes: real `pcd tune` retrains of the embedded model on a CPU
def test_replayed_case_ls_tune_swap_memory(tmp_path):
    """The handed case, unchanged, against ``pcd serve`` with the embedded model: two tune
    retrains in a row (ROUNDS=2), each with /predict answered during it and the process's RSS
    after the swap within 1 GB of what it was before."""
    pytest.importorskip("peft")
    state, port = tmp_path / "state", _free_port()
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen([str(Path(sys.executable).parent / "pcd"), "serve", "--schema",
                             "triage=schemas/airline_sentiment.yaml", "--label-studio", "--state-dir", str(state),
                             "--port", str(port), "--tune-from-rows", "20"], cwd=ROOT, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            time.sleep(1)
        done = subprocess.run([sys.executable, str(CASES / "ls-tune-swap-memory.py"), str(port), str(state)],
                              capture_output=True, text=True, timeout=3600, cwd=ROOT,
                              env={**os.environ, "ROUNDS": "2"})
    finally:
        proc.terminate()
        proc.wait(60)
        log.close()
    print(done.stdout)  # the case's one line: RSS before, peak and after each round, the state dir
    assert done.returncode == 0, done.stdout + done.stderr
