"""The run ``test_interrupted_run.py`` interrupts: one test that starts every kind of service the
suite starts (a SeaweedFS S3 store through its fixture, a fake-gcs-server started by hand with
no fixture to stop it, a local Ray with a worker, ``pcd serve``), says their pids in the file
``PCD_INTERRUPT_READY`` names, and waits to be interrupted. Not collected by ``make test`` (not
named ``test_*.py``): that test runs it by path."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_start_every_service_then_wait(s3_store, local_ray, tmp_path):
    ready = os.environ.get("PCD_INTERRUPT_READY")
    if not ready:
        pytest.skip("run by tests/engines/test_interrupted_run.py")
    import ray

    from .. import gcs_server

    gcs = gcs_server.start(tmp_path / "gcs")
    worker = ray.get(ray.remote(lambda: os.getpid()).remote())
    serve = subprocess.Popen([sys.executable, "-m", "pcd_cli.cli", "serve", "--schema",
                              f"sms={ROOT / 'schemas' / 'sms_spam.yaml'}", "--port", "0", "--device", "cpu"],
                             cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while not re.search(r"listening on http://127.0.0.1:\d+", serve.stderr.readline() or "listening on http://127.0.0.1:0"):
        pass
    Path(ready).write_text(json.dumps({"weed": s3_store.process.pid, "fake-gcs-server": gcs.process.pid,
                                       "ray worker": worker, "pcd serve": serve.pid}))
    time.sleep(600)
