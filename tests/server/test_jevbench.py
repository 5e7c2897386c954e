"""JevBench in the project (issue #35 item 5): ``jevbench check`` and the ``examples`` suite's batch
and option-permutation relations against a real ``pcd serve`` (a subprocess on 127.0.0.1, the
embedded model, its defaults). JevBench is a test dependency (pyproject's test extra)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("jevbench")
httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")

ROOT = Path(__file__).resolve().parents[2]
#: JevBench's batch-independence dimension (``jevbench.relations.bat``) and the option-order relation.
BATCH = ("batch_solo", "batch_order", "duplicate_question", "batch_content", "batch_size_sweep")


@pytest.fixture(scope="module")
def pcd_serve():
    """``pcd serve`` on the embedded model, its defaults, port picked by the OS; SIGTERM at the end."""
    proc = subprocess.Popen([sys.executable, "-m", "pcd_cli.cli", "serve", "--schema",
                             f"sms={ROOT / 'schemas' / 'sms_spam.yaml'}", "--port", "0", "--device", "cpu"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        found = None
        while found is None:
            line = proc.stderr.readline()
            assert line, "pcd serve ended before listening"
            found = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
        url = found.group(1)
        end = time.monotonic() + 300
        while httpx.get(url + "/ready", timeout=30).status_code != 200:
            assert time.monotonic() < end and proc.poll() is None
            time.sleep(0.2)
        yield url
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def jevbench(*args: str, cwd: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "jevbench", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_jevbench_check_and_the_examples_suite_hold_batch_and_option_order(pcd_serve, tmp_path):
    url = pcd_serve + "/v1/systemone"
    said = jevbench("check", "--url", url, "--model", "pcd", cwd=tmp_path)
    assert said.startswith("jevbench check: OK.") and "in the standard Jev format" in said
    out = tmp_path / "examples.json"
    jevbench("eval", "--url", url, "--model", "pcd", "--suite", "examples", "--dimensions", "BAT",
             "--relations", "option_permutation", "--no-cache", "--out", str(out), cwd=tmp_path)
    report = json.loads(out.read_text())
    assert report["scores"]["pillars"]["BAT"] == 1.0
    assert {r: report["scores"]["relations"][r] for r in (*BATCH, "option_permutation")} == \
        dict.fromkeys((*BATCH, "option_permutation"), 1.0)
    outcomes = report["result"]["outcomes"]
    assert {o["relation"] for o in outcomes} == {*BATCH, "option_permutation"}
    # each question is its own branch after the state: a deviation is packing's float32 rounding
    # at most (the bound the decision endpoints state, docs/serve.md); a duplicate is decoded once,
    # so it is exact
    assert all(o["deviation"] <= 2e-5 and not o["violated"] for o in outcomes), \
        [(o["relation"], o["deviation"]) for o in outcomes if o["deviation"] > 2e-5]
    assert all(o["deviation"] == 0.0 for o in outcomes if o["relation"] == "duplicate_question")
