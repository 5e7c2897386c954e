"""Load test of ``pcd serve`` over loopback (issue #27 item 8).

    python benchmarks/serve_load.py [--quick] [--json benchmarks/serve_load.json] [--model M] [--device D]
                                    [--schema schemas/sms_spam.yaml] [--data sample_data/sms_spam.jsonl ...]
                                    [--records 64] [--seconds 15] [--request-timeout-s 60]

``--quick`` runs fewer cells (one-record requests at 1, 4, 16 clients, 16-record requests at 1
and 4; Poisson at 0.5, 1 and 2 times capacity; the unpacked server at 1 and 16 clients), 10 s
of sending each: on a slow CPU the full grid (64 clients of 16 records: 1,024 records queued at
once) takes far longer than a run should.

The script starts the server itself (``pcd serve`` in a subprocess on a free 127.0.0.1 port,
the embedded model, one schema), drives it with an async ``httpx`` client, and stops it with
SIGTERM at the end (the exit status is recorded). Steps, all on the same records:

1. **CLI baseline**: ``pcd label``'s records/s, model load excluded: the Python API's
   ``Labeler`` (what ``pcd label`` runs) over the records in ``pcd label``'s chunks of 16, after
   one warm-up chunk. Its probabilities are the reference for step 2's differences.
2. **Packed server** (the default): closed loop at concurrency 1, 4, 16, 64 with 1- and
   16-record ``/v1/label`` requests (each client sends its next request when the last is
   answered); then Poisson arrivals of 1-record requests at 0.5, 1, 1.5 and 2 times the
   capacity (the best records/s of the 1-record closed loops), with ``/health`` probed every
   50 ms meanwhile.
3. **Unpacked server** (``--no-packing``): closed loop with 1-record requests at 1, 16 (and 64)
   concurrent clients.

Per run: requests/s and records/s (answered 200s over the wall time from the first send to the
last answer), p50/p90/p99 latency (client side) and queue wait (``usage.queue_ms``), forward
passes per record (``pcd_forward_passes_total`` / ``pcd_records_total`` from ``/metrics``,
differences over the run), status counts, and the largest difference of any probability from
the CLI baseline's for the same record (labels compared too). Targets (issue #27): at 16
concurrent one-record requests, >= 1.5x the unpacked server's records/s and >= 0.7x the CLI's;
``/health`` p99 < 50 ms at twice capacity; no status but 200, 429 and 503 under overload.

Every figure here comes from one machine at one time: with other jobs sharing the cores the
absolute rates move from run to run; the ratios measured in one run are what compare.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CONCURRENCY = (1, 4, 16, 64)
SIZES = (1, 16)
POISSON_FACTORS = (0.5, 1.0, 1.5, 2.0)
#: Server limits for the run: a bounded queue so that overload shows as 429 (and deadlines as 503).
#: --quick: fewer cells (the one-record grid up to 16 clients, 16-record requests up to 4).
QUICK_CELLS = [(1, 1), (4, 1), (16, 1), (1, 16), (4, 16)]
QUICK_FACTORS = (0.5, 1.0, 2.0)
ALLOWED_UNDER_OVERLOAD = {200, 429, 503}


# -- records and the CLI baseline -----------------------------------------------------------------
def load_records(paths: list[str], limit: int) -> list[dict]:
    """``{"id", "text"}`` rows from JSONL files, ids made unique, at most ``limit``."""
    rows = []
    for path in paths:
        for line in open(ROOT / path, encoding="utf-8"):
            row = json.loads(line)
            rows.append({"id": f"{Path(path).stem}:{row['id']}", "text": row["text"]})
    return rows[:limit]


def cli_baseline(schema_path: str, rows: list[dict], model: str | None, device: str) -> dict:
    """Records/s of the Labeler over ``rows`` in ``pcd label``'s chunks (load and one warm-up
    chunk excluded), and its probabilities by id (the float32 values ``pcd label`` writes)."""
    from pcd_cli.api import Labeler
    from pcd_cli.engines.local import CHUNK_RECORDS
    from pcd_cli.results import Record, RecordResult

    started = time.perf_counter()
    labeler = Labeler(schema_path, model=model, device=device)
    load_s = time.perf_counter() - started
    records = [Record(r["id"], r["text"].strip()) for r in rows]  # as pcd label and pcd serve read a text
    labeler.label_batch(records[:CHUNK_RECORDS])  # warm-up
    passes = labeler.forward_passes
    started = time.perf_counter()
    out = []
    for i in range(0, len(records), CHUNK_RECORDS):
        out += labeler.label_batch(records[i:i + CHUNK_RECORDS])
    seconds = time.perf_counter() - started
    probs = {}  # id -> field -> (value, {label: float32 probability}), as pcd label's Parquet holds them
    for r in out:
        if isinstance(r, RecordResult):
            probs[r.id] = {f.name: (r.fields[part[0]].value,
                                    {label: float(np.float32(p)) for label, p in zip(f.labels, r.fields[part[0]].probs)})
                           for f, part in labeler.schema.declared_parts() if not f.is_multi}
    result = {"records": len(records), "seconds": seconds, "records_per_s": len(records) / seconds,
              "passes_per_record": (labeler.forward_passes - passes) / len(records), "model_load_s": load_s,
              "model": labeler.metadata().get("pcd.model")}
    del labeler
    return result | {"probs": probs}


# -- the server -----------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``pcd serve`` in a subprocess on a free loopback port; ``stop()`` sends SIGTERM and waits."""

    def __init__(self, schema_path: str, *, packing: bool, log_path: Path, model: str | None, device: str,
                 request_timeout_s: float):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "pcd_cli.cli", "serve", "--schema", f"bench={schema_path}",
               "--port", str(self.port), "--max-queued-requests", "128", "--request-timeout-s", str(request_timeout_s),
               "--device", device, "--quiet", *(["--model", model] if model else []),
               *([] if packing else ["--no-packing"])]
        self.log = open(log_path, "wb")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT)
        self.exit_code: int | None = None

    def wait_ready(self, timeout: float = 600.0) -> float:
        started = time.perf_counter()
        while time.perf_counter() - started < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"pcd serve exited {self.proc.returncode}: see {self.log.name}")
            try:
                if httpx.get(self.url + "/ready", timeout=2).status_code == 200:
                    return time.perf_counter() - started
            except httpx.TransportError:
                pass
            time.sleep(0.25)
        raise TimeoutError("pcd serve was not ready in time")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        self.exit_code = self.proc.returncode
        return self.exit_code


def scrape(url: str) -> dict[str, float]:
    """``pcd_forward_passes_total`` and ``pcd_records_total`` from ``/metrics``."""
    out = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("pcd_forward_passes_total", "pcd_records_total"):
            out[name] = float(value)
    return out


# -- load -----------------------------------------------------------------------------------------
class Tally:
    """Answers of one run: latency (s), queue wait (ms), status counts, records answered."""

    def __init__(self, reference: dict, schema_name: str):
        self.latency: list[float] = []
        self.queue_ms: list[float] = []
        self.status: dict[str, int] = {}
        self.records = 0
        self.requests = 0
        self.first: float | None = None
        self.last: float | None = None
        self.reference = reference
        self.max_prob_diff = 0.0
        self.label_mismatches = 0
        self.compared = 0

    def add(self, sent: float, done: float, status: str, body: dict | None, rows: list[dict]) -> None:
        self.first = sent if self.first is None else min(self.first, sent)
        self.last = done if self.last is None else max(self.last, done)
        self.status[status] = self.status.get(status, 0) + 1
        if status != "200" or body is None:
            return
        self.latency.append(done - sent)
        self.queue_ms.append(body["usage"]["queue_ms"])
        self.requests += 1
        self.records += len(body["rows"]) + len(body["errors"])
        for row in body["rows"]:
            want = self.reference.get(row["id"])
            if want is None:
                continue
            self.compared += 1
            for name, (label, probs) in want.items():
                if row[name] != label:
                    self.label_mismatches += 1
                got = row[f"{name}__probs"]
                for key, p in probs.items():
                    self.max_prob_diff = max(self.max_prob_diff, abs(got[key] - p))

    def summary(self) -> dict:
        wall = (self.last - self.first) if self.first is not None else 0.0
        pct = lambda xs, q: float(np.percentile(xs, q)) if xs else None  # noqa: E731
        return {"wall_s": wall, "requests_ok": self.requests, "records_ok": self.records,
                "requests_per_s": self.requests / wall if wall else 0.0,
                "records_per_s": self.records / wall if wall else 0.0,
                "latency_ms": {f"p{q}": (pct(self.latency, q) or 0.0) * 1e3 for q in (50, 90, 99)},
                "queue_wait_ms": {f"p{q}": pct(self.queue_ms, q) for q in (50, 90, 99)},
                "status": dict(sorted(self.status.items())), "compared_records": self.compared,
                "max_prob_diff": self.max_prob_diff, "label_mismatches": self.label_mismatches}


async def one_request(client: httpx.AsyncClient, url: str, rows: list[dict], tally: Tally) -> None:
    sent = time.perf_counter()
    try:
        response = await client.post(url + "/v1/label", json={"schema": "bench", "records": rows, "all_probs": True})
        status, body = str(response.status_code), (response.json() if response.status_code == 200 else None)
    except httpx.HTTPError as exc:
        status, body = type(exc).__name__, None
    tally.add(sent, time.perf_counter(), status, body, rows)


def _client(concurrency: int) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=concurrency + 8, max_keepalive_connections=concurrency + 8)
    return httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(120.0))


async def closed_loop(url: str, rows: list[dict], *, concurrency: int, size: int, seconds: float,
                      reference: dict, grace: float) -> Tally:
    """``concurrency`` clients, each sending ``size``-record requests back to back for
    ``seconds``; the last requests are waited for at most ``grace`` seconds more, then
    dropped by the client (counted as ``cancelled``: the server decodes nothing more for them)."""
    tally = Tally(reference, "bench")
    end = time.perf_counter() + seconds
    cursor = {"i": 0}

    async def client_loop(client):
        while time.perf_counter() < end:
            i = cursor["i"]
            cursor["i"] += size
            batch = [rows[(i + k) % len(rows)] for k in range(size)]
            await one_request(client, url, batch, tally)

    async with _client(concurrency) as client:
        tasks = [asyncio.create_task(client_loop(client)) for _ in range(concurrency)]
        await _settle(tasks, end + grace - time.perf_counter(), tally)
    return tally


async def _settle(tasks: list, timeout: float, tally: Tally) -> None:
    """Wait for ``tasks`` at most ``timeout`` seconds; cancel the rest (each counted ``cancelled``)."""
    _done, pending = await asyncio.wait(tasks, timeout=max(0.0, timeout)) if tasks else (set(), set())
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)
        tally.status["cancelled"] = tally.status.get("cancelled", 0) + len(pending)


async def poisson(url: str, rows: list[dict], *, rate: float, seconds: float, reference: dict, grace: float,
                  seed: int = 0) -> tuple[Tally, list[float], dict]:
    """One-record requests arriving as a Poisson process of ``rate`` per second for ``seconds``;
    ``/health`` probed every 50 ms meanwhile. Returns the tally, the probe latencies (s) and
    the probes' status counts."""
    tally = Tally(reference, "bench")
    rng = random.Random(seed)
    health: list[float] = []
    health_status: dict[str, int] = {}
    stop = asyncio.Event()

    async def probe():
        async with httpx.AsyncClient(timeout=httpx.Timeout(30.0)) as client:
            while not stop.is_set():
                sent = time.perf_counter()
                try:
                    status = str((await client.get(url + "/health")).status_code)
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
                health.append(time.perf_counter() - sent)
                health_status[status] = health_status.get(status, 0) + 1
                await asyncio.sleep(0.05)

    async with _client(512) as client:
        prober = asyncio.create_task(probe())
        tasks = []
        start = time.perf_counter()
        t, i = start, 0
        while True:
            t += rng.expovariate(rate)
            if t - start > seconds:
                break
            await asyncio.sleep(max(0.0, t - time.perf_counter()))
            tasks.append(asyncio.create_task(one_request(client, url, [rows[i % len(rows)]], tally)))
            i += 1
        await _settle(tasks, grace, tally)
        stop.set()
        await prober
    return tally, health, health_status


def run_closed(url, rows, reference, concurrency, size, seconds, grace) -> dict:
    before = scrape(url)
    tally = asyncio.run(closed_loop(url, rows, concurrency=concurrency, size=size, seconds=seconds,
                                    reference=reference, grace=grace))
    after = scrape(url)
    out = {"concurrency": concurrency, "size": size} | tally.summary()
    records = after["pcd_records_total"] - before["pcd_records_total"]
    out["passes_per_record"] = (after["pcd_forward_passes_total"] - before["pcd_forward_passes_total"]) / records \
        if records else None
    return out


def run_poisson(url, rows, reference, rate, seconds, factor, grace) -> dict:
    before = scrape(url)
    tally, health, health_status = asyncio.run(poisson(url, rows, rate=rate, seconds=seconds, reference=reference,
                                                       grace=grace))
    after = scrape(url)
    out = {"factor": factor, "offered_per_s": rate, "seconds": seconds} | tally.summary()
    records = after["pcd_records_total"] - before["pcd_records_total"]
    out["passes_per_record"] = (after["pcd_forward_passes_total"] - before["pcd_forward_passes_total"]) / records \
        if records else None
    out["health_ms"] = {f"p{q}": float(np.percentile(health, q)) * 1e3 for q in (50, 99)} if health else {}
    out["health_status"] = health_status
    return out


# -- report ---------------------------------------------------------------------------------------
def _fmt(x, spec=".1f"):
    return "-" if x is None else format(x, spec)


def table(result: dict) -> str:
    lines = []
    cli = result["cli"]
    lines.append(f"machine: {result['machine']}")
    lines.append(f"model {cli['model']}, schema {result['schema']}, {cli['records']} records; "
                 f"CLI baseline (Labeler, load excluded): {cli['records_per_s']:.2f} records/s, "
                 f"{cli['passes_per_record']:.2f} passes/record")
    head = (f"{'server':<9}{'load':<12}{'req/s':>7}{'rec/s':>7}{'p50 ms':>8}{'p90 ms':>8}{'p99 ms':>8}"
            f"{'qw50':>7}{'qw99':>7}{'pass/rec':>9}{'maxΔp':>9}  status")
    lines.append(head)
    for name, runs in (("packed", result["packed"]["closed"]), ("unpacked", result["unpacked"]["closed"])):
        for r in runs:
            lines.append(f"{name:<9}{'c=%d x%d' % (r['concurrency'], r['size']):<12}{r['requests_per_s']:>7.2f}"
                         f"{r['records_per_s']:>7.2f}{r['latency_ms']['p50']:>8.0f}{r['latency_ms']['p90']:>8.0f}"
                         f"{r['latency_ms']['p99']:>8.0f}{_fmt(r['queue_wait_ms']['p50'], '.0f'):>7}"
                         f"{_fmt(r['queue_wait_ms']['p99'], '.0f'):>7}{_fmt(r['passes_per_record'], '.2f'):>9}"
                         f"{r['max_prob_diff']:>9.1e}  {r['status']}")
    for r in result["packed"]["poisson"]:
        lines.append(f"{'packed':<9}{'poisson %.1fx' % r['factor']:<12}{r['requests_per_s']:>7.2f}"
                     f"{r['records_per_s']:>7.2f}{r['latency_ms']['p50']:>8.0f}{r['latency_ms']['p90']:>8.0f}"
                     f"{r['latency_ms']['p99']:>8.0f}{_fmt(r['queue_wait_ms']['p50'], '.0f'):>7}"
                     f"{_fmt(r['queue_wait_ms']['p99'], '.0f'):>7}{_fmt(r['passes_per_record'], '.2f'):>9}"
                     f"{r['max_prob_diff']:>9.1e}  {r['status']} offered {r['offered_per_s']:.2f}/s, "
                     f"/health p99 {r['health_ms'].get('p99', float('nan')):.1f} ms")
    lines.append(f"capacity (best 1-record closed loop, packed): {result['capacity_records_per_s']:.2f} records/s")
    for t in result["targets"]:
        lines.append(f"target {t['name']}: {t['measured']} -> {'MET' if t['met'] else 'MISSED'}")
    lines.append(f"server exits after SIGTERM: packed {result['packed']['exit_code']}, "
                 f"unpacked {result['unpacked']['exit_code']}")
    return "\n".join(lines)


def targets(result: dict) -> list[dict]:
    def cell(runs, c, size):
        return next((r for r in runs if r["concurrency"] == c and r["size"] == size), None)

    packed16 = cell(result["packed"]["closed"], 16, 1)
    unpacked16 = cell(result["unpacked"]["closed"], 16, 1)
    cli = result["cli"]["records_per_s"]
    vs_unpacked = packed16["records_per_s"] / unpacked16["records_per_s"] if unpacked16["records_per_s"] else None
    vs_cli = packed16["records_per_s"] / cli
    top = max(result["packed"]["poisson"], key=lambda r: r["factor"])
    over = [r for r in result["packed"]["poisson"] if r["factor"] > 1.0]
    other = sorted({s for r in over for s in r["status"]
                    if s != "cancelled" and (not s.isdigit() or int(s) not in ALLOWED_UNDER_OVERLOAD)}
                   | {s for r in over for s in r["health_status"] if s != "200"})
    return [
        {"name": "c=16 x1 packed / unpacked records/s >= 1.5", "measured": f"{vs_unpacked:.2f}x",
         "met": vs_unpacked is not None and vs_unpacked >= 1.5},
        {"name": "c=16 x1 packed / CLI records/s >= 0.7", "measured": f"{vs_cli:.2f}x", "met": vs_cli >= 0.7},
        {"name": f"/health p99 < 50 ms at {top['factor']:.1f}x capacity",
         "measured": f"{top['health_ms'].get('p99', float('nan')):.1f} ms", "met": top['health_ms'].get('p99', 1e9) < 50},
        {"name": "no status but 200/429/503 over capacity", "measured": "other: " + (", ".join(other) or "none"),
         "met": not other},
    ]


def machine() -> str:
    load = os.getloadavg()
    return (f"{platform.machine()} {os.cpu_count()} cores (load average {load[0]:.1f} at the start: below 1 "
            f"means nothing else ran), Python {platform.python_version()}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer cells (QUICK_CELLS, QUICK_FACTORS), 10 s each")
    ap.add_argument("--model", default=None, help="as pcd label --model (default: the embedded model)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--request-timeout-s", type=float, default=60.0,
                    help="the server's deadline; also how long the client waits for the last answers of a cell")
    ap.add_argument("--schema", default="schemas/sms_spam.yaml")
    ap.add_argument("--data", nargs="+", default=["sample_data/sms_spam.jsonl", "sample_data/sms_spam.dev.jsonl"])
    ap.add_argument("--records", type=int, default=64, help="distinct records cycled through (default 64)")
    ap.add_argument("--seconds", type=float, default=None, help="seconds of sending per closed-loop cell (15; --quick 5)")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "serve_load.json"))
    args = ap.parse_args()
    seconds = args.seconds or (10.0 if args.quick else 15.0)
    grace = args.request_timeout_s + 5  # past the server's deadline a request is a 503 anyway
    rows = load_records(args.data, args.records)
    result: dict = {"machine": machine(), "schema": args.schema, "quick": args.quick, "seconds_per_cell": seconds,
                    "request_timeout_s": args.request_timeout_s}

    print(f"{result['machine']}\nCLI baseline over {len(rows)} records ...", flush=True)
    cli = cli_baseline(args.schema, rows, args.model, args.device)
    reference = cli.pop("probs")
    result["cli"] = cli
    print(f"  {cli['records_per_s']:.2f} records/s", flush=True)

    logs = Path(os.environ.get("TMPDIR", "/tmp"))
    for name, packing in (("packed", True), ("unpacked", False)):
        server = Server(args.schema, packing=packing, log_path=logs / f"serve_load_{name}.log", model=args.model,
                        device=args.device, request_timeout_s=args.request_timeout_s)
        try:
            ready_s = server.wait_ready()
            print(f"{name} server ready in {ready_s:.1f} s on {server.url}", flush=True)
            closed = []
            if packing:
                cells = QUICK_CELLS if args.quick else [(c, s) for s in SIZES for c in CONCURRENCY]
            else:
                cells = [(1, 1), (16, 1)] if args.quick else [(1, 1), (16, 1), (64, 1)]
            for c, size in cells:
                r = run_closed(server.url, rows, reference, c, size, seconds, grace)
                closed.append(r)
                print(f"  closed c={c} x{size}: {r['records_per_s']:.2f} records/s, p50 "
                      f"{r['latency_ms']['p50']:.0f} ms, {r['status']}", flush=True)
            part = {"ready_s": ready_s, "closed": closed}
            if packing:
                capacity = max(r["records_per_s"] for r in closed if r["size"] == 1)
                result["capacity_records_per_s"] = capacity
                part["poisson"] = []
                for factor in QUICK_FACTORS if args.quick else POISSON_FACTORS:
                    rate = capacity * factor
                    # at least ~8 arrivals expected, however slow the machine
                    r = run_poisson(server.url, rows, reference, rate, max(seconds, 8.0 / rate), factor, grace)
                    part["poisson"].append(r)
                    print(f"  poisson {factor}x ({capacity * factor:.2f}/s): {r['records_per_s']:.2f} records/s, "
                          f"{r['status']}, /health p99 {r['health_ms'].get('p99', float('nan')):.1f} ms", flush=True)
        finally:
            part_exit = server.stop()
        part["exit_code"] = part_exit
        result[name] = part
    result["targets"] = targets(result)
    text = table(result)
    result["table"] = text.splitlines()
    print("\n" + text)
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
