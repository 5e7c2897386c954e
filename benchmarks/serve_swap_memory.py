"""Memory of ``pcd serve --label-studio`` over retrains and swaps (issue #45, kind 3).

Starts ``pcd serve`` with the embedded model (a process of its own, on a free 127.0.0.1 port, a
temporary ``--state-dir``), sends 30 annotations of airline tweets by webhook, then runs
``--rounds`` retrains in a row (``START_TRAINING``; ``--method calibrate`` or ``tune``, chosen by
``--tune-from-rows``) and reports the server's resident memory (VmRSS from /proc) before each
round, its peak during it (sampled every 0.5 s) and after the swap (5 s after the new version
line), whether ``/predict`` answered during and after it, and the state dir's size.

    .venv/bin/python benchmarks/serve_swap_memory.py --method calibrate --rounds 3
    .venv/bin/python benchmarks/serve_swap_memory.py --method tune --rounds 1

What to expect (docs/serve.md, "Memory and the state folder over retrains"): after each swap the RSS returns near
what it was before the round (the host's model plus the served version); a tune round peaks at
about one more model (the one being fitted) and leaves the served tuned model in memory.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ('<View>\n  <Text name="text" value="$text"/>\n  <Choices name="sentiment" toName="text" choice="single-radio">\n'
          '    <Choice value="NEGATIVE"/>\n    <Choice value="NEUTRAL"/>\n    <Choice value="POSITIVE"/>\n'
          '  </Choices>\n</View>')
PROJECT = 54


def rss_mb(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) // 1024
    return 0


def du_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def annotation(tid: int, text: str, label: str) -> dict:
    project = {"id": PROJECT, "label_config": CONFIG}
    return {"action": "ANNOTATION_CREATED", "project": project,
            "task": {"id": tid, "data": {"text": text}, "project": PROJECT},
            "annotation": {"id": 9000 + tid, "task": tid, "project": PROJECT, "was_cancelled": False,
                           "ground_truth": False, "completed_by": 1,
                           "result": [{"from_name": "sentiment", "to_name": "text", "type": "choices",
                                       "value": {"choices": [label]}}]}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--method", choices=("calibrate", "tune"), default="calibrate")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rows", type=int, default=30, help="annotations sent before the first round")
    args = ap.parse_args()
    pcd = str(Path(sys.executable).parent / "pcd")
    state = Path(tempfile.mkdtemp(prefix="pcd-swap-memory-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(state.parent / f"{state.name}.log", "w")
    proc = subprocess.Popen([pcd, "serve", "--schema", "triage=schemas/airline_sentiment.yaml", "--label-studio",
                             "--state-dir", str(state), "--port", str(port),
                             "--tune-from-rows", "20" if args.method == "tune" else "100000"],
                            cwd=ROOT, stdout=log, stderr=log)
    try:
        while True:
            try:
                if httpx.get(url + "/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                print(open(log.name).read()[-3000:])
                return 1
            time.sleep(0.5)
        print(f"pcd serve --label-studio, embedded model, {args.method} retrains; RSS in MB (VmRSS)")
        print(f"ready: RSS {rss_mb(proc.pid)}")
        c = httpx.Client(base_url=url, timeout=300)
        c.post("/setup", json={"project": f"{PROJECT}.1796425530", "schema": CONFIG})
        rows = [json.loads(line) for line in open(ROOT / "sample_data" / "airline_tweets.dev.jsonl")][10:10 + args.rows]
        for i, row in enumerate(rows):
            c.post("/webhook", json=annotation(1000 + i, row["text"], row["sentiment"]))
        predict = {"tasks": [{"id": 1, "data": {"text": "@united lost my bag again"}}],
                   "project": f"{PROJECT}.1796425530", "label_config": CONFIG}
        print(f"after setup and {len(rows)} annotations: RSS {rss_mb(proc.pid)}")
        for rnd in range(1, args.rounds + 1):
            n = len(c.get("/versions").json()["schemas"]["triage"]["history"])
            before = rss_mb(proc.pid)
            t0 = time.time()
            started = c.post("/webhook", json={"action": "START_TRAINING", "project": {"id": PROJECT}}).json()
            peak, during = before, []
            stop = threading.Event()

            def sample():
                nonlocal peak
                while not stop.is_set():
                    peak = max(peak, rss_mb(proc.pid))
                    time.sleep(0.5)

            sampler = threading.Thread(target=sample)
            sampler.start()
            while len(c.get("/versions").json()["schemas"]["triage"]["history"]) == n:
                if len(during) < 3:
                    during.append(c.post("/predict", json=predict).status_code)
                time.sleep(2)
            line = c.get("/versions").json()["schemas"]["triage"]["history"][-1]
            took = time.time() - t0
            time.sleep(5)
            stop.set()
            sampler.join()
            after = rss_mb(proc.pid)
            answer = c.post("/predict", json=predict)
            print(f"round {rnd} ({started.get('training')}): {line['method']} -> {line['version']} "
                  f"accepted={line['accepted']} in {took:.0f} s; RSS before {before}, peak {peak}, after {after}; "
                  f"/predict during {during}, after {answer.status_code} "
                  f"{answer.json().get('model_version') if answer.status_code == 200 else ''}; "
                  f"state dir {du_mb(state):.1f} MB in {len(list(state.glob('*/schemas/triage/run-*')))} "
                  "run folders")
        return 0
    finally:
        proc.terminate()
        proc.wait(60)
        log.close()
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
