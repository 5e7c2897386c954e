"""Stopping ``make test`` with Ctrl-C leaves no process behind (issue 51, item 7): a pytest run of
``interrupt_target.py`` (SeaweedFS, fake-gcs-server, a local Ray, ``pcd serve``) is sent SIGINT
once every service is up, and afterwards no process of that run is alive. Every process the run
started carries a marker in its environment (``PCD_INTERRUPT_MARK``, inherited by whatever it
starts, Ray's raylet and workers included), so leftovers are found by it in ``/proc`` whatever
their process group; ``tests/conftest.py`` (``stop_started_processes``) is what stops them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def marked(mark: str) -> dict[int, str]:
    """pid -> command line of every live process whose environment holds ``PCD_INTERRUPT_MARK=mark``."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes()
            if f"PCD_INTERRUPT_MARK={mark}".encode() in env.split(b"\0"):
                stat = (entry / "stat").read_text()
                if stat.rsplit(")", 1)[1].split()[0] != "Z":  # a zombie is dead, only not yet reaped
                    found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
        except OSError:
            continue
    return found


@pytest.mark.full
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds processes through /proc (Linux)")
def test_an_interrupted_pytest_run_leaves_no_service_running(tmp_path):
    pytest.importorskip("ray")
    mark, ready = uuid.uuid4().hex, tmp_path / "ready.json"
    env = dict(os.environ, PCD_INTERRUPT_MARK=mark, PCD_INTERRUPT_READY=str(ready))
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             "tests/engines/interrupt_target.py"], cwd=ROOT, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read().decode()[-3000:]
            time.sleep(0.2)
        started = json.loads(ready.read_text())
        assert set(started.values()) <= set(marked(mark)), (started, marked(mark))  # the marker reaches them all
        proc.send_signal(signal.SIGINT)
        code = proc.wait(120)
        output = proc.stdout.read().decode()
        end = time.monotonic() + 10  # a process ends a moment after its parent reaped nothing more
        while marked(mark) and time.monotonic() < end:
            time.sleep(0.2)
        assert marked(mark) == {}, output[-3000:]
        assert code == 2 and "KeyboardInterrupt" in output, output[-3000:]
    finally:
        for pid in marked(mark):  # never leave them, even when the test fails
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
