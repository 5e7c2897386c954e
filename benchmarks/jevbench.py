"""JevBench (``pip install jevbench``, Apache-2.0: coherence and stability relations for
``/v1/systemone`` servers) against a real ``pcd serve`` on the embedded model.

    python benchmarks/jevbench.py [--suite jevbench-mini] [--domains customer_support] [--dimensions BAT]
                                  [--relations option_permutation]
                                  [--concurrency 4] [--server-root DIR] [--name pcd]
                                  [--out benchmarks/jevbench.json]

The script starts ``pcd serve`` itself (a subprocess on a free 127.0.0.1 port, the embedded model on
the CPU, ``schemas/sms_spam.yaml`` as its one startup schema, defaults otherwise), runs
``jevbench.evaluate`` over it, stops the server with SIGTERM and writes:

* ``<out>``: the summary: the per-dimension, per-group and per-relation tables, each relation's
  largest deviation and violations, the requests sent and the run's wall time;
* ``<out stem>.report.json.gz``: JevBench's own report (``Report.save``), readable with
  ``jevbench report``.

``--server-root DIR`` runs the server from another checkout of pcd (e.g. the code before question
isolation, unpacked with ``git archive <commit> pcd_cli schemas | tar -x -C DIR``), with the same
Python environment, for a before/after comparison. ``--domains`` selects cases, ``--dimensions`` /
``--relations`` select relations (their union, as JevBench's own options); none selects the whole
suite.

JevBench's own warning applies: coherence is not accuracy (a model answering every question
uniformly scores 89.4 on jevbench-mini at chance accuracy); read its scores beside ``pcd eval`` on a
labelled set (docs/quality.md).
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# this script shares the package's name: import the installed jevbench, not this file
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Serve:
    """``pcd serve`` from ``root`` in a subprocess on a free loopback port (context manager)."""

    def __init__(self, root: Path, log: Path, extra: tuple[str, ...] = ()):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(log, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "pcd_cli.cli", "serve", "--schema",
                                      f"sms={ROOT / 'schemas' / 'sms_spam.yaml'}", "--port", str(self.port),
                                      "--device", "cpu", "--quiet", "--request-timeout-s", "600", *extra],
                                     cwd=root, stdout=self.log, stderr=subprocess.STDOUT)

    def __enter__(self) -> "Serve":
        import httpx

        end = time.monotonic() + 600
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"pcd serve exited {self.proc.returncode}: see {self.log.name}")
            try:
                if httpx.get(self.url + "/ready", timeout=5).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.25)
        raise TimeoutError("pcd serve was not ready in 600 s")

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def summary(report, seconds: float) -> dict:
    """The tables and per-relation deviations of a JevBench ``Report``."""
    result, scores = report.result, report.scores
    worst: dict[str, dict] = {}
    for o in result["outcomes"]:
        w = worst.setdefault(o["relation"], {"tests": 0, "violations": 0, "max_deviation": 0.0})
        w["tests"] += 1
        w["violations"] += bool(o["violated"])
        w["max_deviation"] = max(w["max_deviation"], float(o["deviation"]))
    return {"overall": scores.get("overall"), "dimensions": scores.get("pillars"), "groups": scores.get("groups"),
            "relations": scores.get("relations"), "outcomes_by_relation": worst,
            "requests": result.get("requests"), "wall_seconds": round(seconds, 1),
            "table_dimension": report.table("dimension"), "table_relation": report.table("relation")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="jevbench-mini")
    parser.add_argument("--domains", default=None, help="comma-separated case domains, e.g. customer_support")
    parser.add_argument("--dimensions", default=None, help="comma-separated, e.g. BAT,CHO")
    parser.add_argument("--relations", default=None, help="comma-separated relation names")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--server-root", type=Path, default=ROOT)
    parser.add_argument("--name", default="pcd")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "jevbench.json")
    args = parser.parse_args()
    import jevbench as jb

    split = lambda v: [x.strip() for x in v.split(",") if x.strip()] if v else None  # noqa: E731
    log = args.out.with_suffix(".serve.log")
    started = time.perf_counter()
    with Serve(args.server_root, log) as server:
        model = jb.systemone(server.url + "/v1/systemone", model="pcd")
        report = jb.evaluate(model, suite=args.suite, domains=split(args.domains), dimensions=split(args.dimensions),
                             relations=split(args.relations), concurrency=args.concurrency, cache=None,
                             name=args.name, progress=True)
    seconds = time.perf_counter() - started
    report.save(args.out.with_name(args.out.stem + ".report.json.gz"))
    out = {"suite": args.suite, "domains": args.domains, "dimensions": args.dimensions, "relations": args.relations,
           "server_root": str(args.server_root), "name": args.name, "concurrency": args.concurrency,
           "model": "smollm2-135m-instruct (embedded), CPU float32", "jevbench": jb.__version__,
           **summary(report, seconds)}
    args.out.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    log.unlink(missing_ok=True)
    print(out["table_dimension"])
    print(f"{out['requests']} requests in {out['wall_seconds']} s; wrote {args.out}")


if __name__ == "__main__":
    main()
