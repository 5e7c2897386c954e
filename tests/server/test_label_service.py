"""The server core of ``pcd serve`` (issue #27 items 2, 4, 5, 6) over a fake labeler (no model):
``/v1/label``, the queue and its packing, limits, keys, deadline, disconnects, drain and SIGTERM.

Every test serves on 127.0.0.1 (a free port) and checks that no thread or process it started is
left (``no_leftovers``)."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

from pcd_cli.schema.load import load_schema, parse_schema  # noqa: E402
from pcd_cli.server import app as app_module  # noqa: E402
from pcd_cli.server import middleware  # noqa: E402
from pcd_cli.server.app import AppConfig  # noqa: E402
from pcd_cli.server.main import ServerThread  # noqa: E402
from pcd_cli.job import LabelJob  # noqa: E402
from pcd_cli.server.service import LabelService, ServiceConfig  # noqa: E402

from .fakes import FakeHost  # noqa: E402
from .harness import check_nothing_left  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SMS = load_schema(ROOT / "schemas" / "sms_spam.yaml")
TRIAGE = load_schema(ROOT / "schemas" / "support_triage.yaml")


@pytest.fixture(autouse=True)
def no_leftovers():
    """No thread (and no child process) started by the test is left once it ends."""
    before = {t.ident for t in threading.enumerate()}
    yield
    check_nothing_left(before)


def serve(host=None, *, config=ServiceConfig(), app_config=AppConfig(), schemas=None, **kw) -> ServerThread:
    host = host or FakeHost()
    schemas = schemas or {"sms": (SMS, LabelJob())}
    return ServerThread(LabelService(host, schemas, config=config), app_config, **kw)


def post(url, body, **kw):
    return httpx.post(url + "/v1/label", json=body, timeout=30, **kw)


async def _gather_posts(url, bodies, *, timeout=30):
    async with httpx.AsyncClient(timeout=timeout) as client:
        return await asyncio.gather(*(client.post(url + "/v1/label", json=b) for b in bodies))


def _until(predicate, timeout=10.0):
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "timed out waiting"
        time.sleep(0.005)


# -- /v1/label --------------------------------------------------------------------------------------
def test_label_rows_errors_metadata_usage():
    with serve() as srv:
        r = post(srv.url, {"schema": "sms", "records": ["WIN a prize", {"text": "see you at 6"}, "FAIL here", "  "],
                           "all_probs": True}, headers={"x-request-id": "my-req-1"})
    assert r.status_code == 200
    assert r.headers["x-request-id"] == "my-req-1"
    body = r.json()
    assert [list(row) for row in body["rows"]] == [["row", "is_spam", "is_spam__prob", "is_spam__mass",
                                                    "is_spam__probs", "__truncated"]] * 2
    assert [row["row"] for row in body["rows"]] == [0, 1]
    row = body["rows"][0]
    assert isinstance(row["is_spam"], bool) and set(row["is_spam__probs"]) == {"true", "false"}
    assert row["is_spam__prob"] == pytest.approx(0.7) and row["is_spam__mass"] == pytest.approx(0.9)
    assert body["errors"] == [{"row": 2, "record": 2, "error": "record 2: too long for the model (fake)"},
                              {"row": 3, "record": 3, "error": "row 3: the text is empty"}]
    assert body["metadata"]["pcd.schema_name"] == "sms_spam" and body["metadata"]["pcd.records_failed"] == "2"
    assert body["metadata"]["pcd.records_labelled"] == "2" and body["metadata"]["pcd.model"] == "fake-model"
    assert body["usage"]["records"] == 4 and body["usage"]["input_tokens"] == 3 + 4 + 2  # words, fake tokenizer
    assert body["usage"]["queue_ms"] >= 0 and body["usage"]["decode_ms"] >= 0


def test_label_ids_and_validation():
    with serve() as srv:
        ids = post(srv.url, {"schema": "sms", "records": [{"id": "a", "text": "x"}, {"id": 7, "text": "y"}]}).json()
        assert [row["id"] for row in ids["rows"]] == ["a", "7"] and "is_spam__probs" not in ids["rows"][0]
        missing = post(srv.url, {"schema": "sms", "records": [{"id": "a", "text": "x"}, {"text": "y"}]}).json()
        assert missing["errors"] == [{"row": 1, "record": None, "error": "row 1: id column 'id' is missing or empty"}]
        bad = httpx.post(srv.url + "/v1/label", content=b'{"schema": "sms", "records": [', timeout=10)
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"
        assert "x-request-id" in bad.headers
        for body, word in [([1], "JSON object"), ({"schema": "nope", "records": []}, "'nope' is not served"),
                           ({"schema": "sms", "records": "x"}, "'records'"),
                           ({"schema": "sms", "records": [], "extra": 1}, "unknown key 'extra'"),
                           ({"schema": "sms", "records": [], "all_probs": "yes"}, "'all_probs'")]:
            r = post(srv.url, body)
            assert r.status_code == 422 and word in r.json()["error"]["message"], (body, r.text)
        schemas = httpx.get(srv.url + "/v1/schemas").json()
    assert schemas["model"] == "fake-model"
    assert schemas["schemas"] == [{"name": "sms", "fields": [{"name": "is_spam", "type": "boolean",
                                                              "labels": ["true", "false"]}],
                                   "schema_sha256": SMS.source_sha256, "prompt_head_sha256": "f" * 64,
                                   "warnings": []}]


# -- packing and the queue ------------------------------------------------------------------------
def _blocked_then(srv, host, bodies, *, expect_queued):
    """Send a 1-record blocker, hold the worker on it, queue ``bodies`` concurrently, release;
    returns (blocker response, responses)."""
    async def run():
        async with httpx.AsyncClient(timeout=30) as client:
            blocker = asyncio.ensure_future(client.post(srv.url + "/v1/label",
                                                        json={"schema": "sms", "records": ["blocker"]}))
            while not host.entered.is_set():
                await asyncio.sleep(0.005)
            futures = []
            for body in bodies:  # in order, so the queue order is known
                futures.append(asyncio.ensure_future(client.post(srv.url + "/v1/label", json=body)))
                n = len(futures)
                while srv.service.queue_depth[0] < min(n, expect_queued):
                    await asyncio.sleep(0.005)
            host.gate.set()
            return await blocker, await asyncio.gather(*futures)

    return asyncio.run(run())


def test_concurrent_requests_share_one_decode_call():
    host = FakeHost(gate=threading.Event())
    with serve(host) as srv:
        passes = srv.service.forward_passes
        blocker, responses = _blocked_then(srv, host, [{"schema": "sms", "records": [f"text {i}"]} for i in range(6)],
                                           expect_queued=6)
        forward = srv.service.forward_passes - passes
    assert blocker.status_code == 200 and all(r.status_code == 200 for r in responses)
    calls = host.calls[1:]  # after the warm-up
    assert calls == [[(0, "blocker")], [(0, f"text {i}") for i in range(6)]]
    assert forward == 4  # two decode calls of the fake's 2 passes each
    # each request gets its own record back
    for i, r in enumerate(responses):
        assert r.json()["usage"]["records"] == 1 and r.json()["rows"][0]["row"] == 0


def test_no_packing_decodes_one_request_per_call():
    host = FakeHost(gate=threading.Event())
    with serve(host, config=ServiceConfig(packing=False)) as srv:
        _blocked_then(srv, host, [{"schema": "sms", "records": [f"text {i}"]} for i in range(3)], expect_queued=3)
    assert host.calls[1:] == [[(0, "blocker")]] + [[(0, f"text {i}")] for i in range(3)]


@pytest.mark.parametrize("packing", [True, False])
def test_a_small_request_waits_one_chunk_behind_a_large_one(packing):
    host = FakeHost(gate=threading.Event())
    big = [f"big {i}" for i in range(100)]
    with serve(host, config=ServiceConfig(packing=packing)) as srv:
        _, (r_big, r_small) = _blocked_then(srv, host, [{"schema": "sms", "records": big},
                                                        {"schema": "sms", "records": ["small"]}], expect_queued=2)
    assert r_big.status_code == r_small.status_code == 200
    calls = host.calls[2:]  # after the warm-up and the blocker
    small_call = next(i for i, c in enumerate(calls) if (0, "small") in c)
    if packing:  # packed with the big request's first chunk of 16
        assert small_call == 0 and calls[0] == [(i, f"big {i}") for i in range(16)] + [(0, "small")]
    else:  # one chunk of the big request first, then the small one
        assert small_call == 1 and calls[0] == [(i, f"big {i}") for i in range(16)]
    assert [len(c) for c in calls if (0, "small") not in c] == [16] * (5 if packing else 6) + [4]
    assert [row["row"] for row in r_big.json()["rows"]] == list(range(100))


def test_different_schemas_are_never_packed_together():
    host = FakeHost(gate=threading.Event())
    schemas = {"sms": (SMS, LabelJob()), "triage": (TRIAGE, LabelJob())}
    bodies = [{"schema": "sms" if i % 2 else "triage", "records": [f"t{i}"]} for i in range(6)]
    with serve(host, schemas=schemas) as srv:
        _, responses = _blocked_then(srv, host, bodies, expect_queued=6)
    assert all(r.status_code == 200 for r in responses)
    calls = list(zip(host.call_schemas, host.calls))[3:]  # two warm-ups and the blocker
    assert sorted((name, sorted(t for _, t in c)) for name, c in calls) == [
        ("sms_spam", ["t1", "t3", "t5"]), ("support_triage", ["t0", "t2", "t4"])]


def test_request_built_schemas_share_a_bounded_cache():
    host = FakeHost()
    with serve(host, config=ServiceConfig(max_cached_schemas=2)) as srv:
        q = lambda i: parse_schema({"name": f"q{i}", "fields": {"f": {"type": "boolean", "description": f"{i}"}}})  # noqa: E731
        for i in [0, 0, 1, 0, 2, 3]:
            asyncio.run(srv.service.submit(q(i), [_rec("x")], request_id=f"r{i}"))
        cached = [e.schema.name for e in srv.service._cache.values()]
        same = srv.service.submit(SMS, [_rec("x")], request_id="pinned")
        asyncio.run(same)
    assert host.compiled == ["sms_spam", "q0", "q1", "q2", "q3"]  # q0 compiled once for its three requests
    assert cached == ["q2", "q3"] and len(srv.service._cache) == 2


def _rec(text):
    from pcd_cli.results import Record

    return Record(0, text)


# -- limits ----------------------------------------------------------------------------------------
def test_queue_full_is_429_with_retry_after_and_validation_comes_first():
    host = FakeHost(gate=threading.Event())
    with serve(host, config=ServiceConfig(max_queued_requests=1, max_queued_records=10)) as srv:
        async def run():
            async with httpx.AsyncClient(timeout=30) as client:
                running = asyncio.ensure_future(client.post(srv.url + "/v1/label", json={"schema": "sms", "records": ["a"]}))
                while not host.entered.is_set():
                    await asyncio.sleep(0.005)
                queued = asyncio.ensure_future(client.post(srv.url + "/v1/label", json={"schema": "sms", "records": ["b"]}))
                while srv.service.queue_depth[0] < 1:
                    await asyncio.sleep(0.005)
                full = await client.post(srv.url + "/v1/label", json={"schema": "sms", "records": ["c"]})
                invalid = await client.post(srv.url + "/v1/label", json={"schema": "nope", "records": ["c"]})
                host.gate.set()
                return full, invalid, await running, await queued
        full, invalid, running, queued = asyncio.run(run())
        metrics = httpx.get(srv.url + "/metrics").text
    assert full.status_code == 429 and full.json()["error"]["code"] == "queue_full"
    assert int(full.headers["retry-after"]) >= 1 and "--max-queued-requests 1" in full.json()["error"]["message"]
    assert invalid.status_code == 422
    assert running.status_code == queued.status_code == 200
    assert 'pcd_requests_refused_total{reason="queue_full"} 1.0' in metrics
    assert 'pcd_requests_total{route="/v1/label",status="429"} 1.0' in metrics


def test_too_many_queued_records_is_429_and_retry_after_follows_the_rate():
    service = LabelService(FakeHost(), config=ServiceConfig(max_queued_records=10))
    service._queued_records = 8
    service._rate.extend([(20, 1.0), (20, 1.0)])  # 20 records/s
    from pcd_cli.server.errors import api_error
    from pcd_cli.server.service_errors import QueueFull

    with pytest.raises(QueueFull) as err:
        service._check_room(45)  # 43 over the limit: 43 / 20 -> 3 s
    assert err.value.retry_after == 3
    assert api_error(err.value).status == 429 and api_error(err.value).headers["Retry-After"] == "3"
    service._check_room(2)  # fits


def test_body_too_large_is_refused_without_being_read_whole():
    """A chunked body without Content-Length: the app stops reading just past the limit."""
    service = LabelService(FakeHost(), {"sms": (SMS, LabelJob())})
    service.ready.set()
    app = app_module.create_app(service, AppConfig(max_body_bytes=8 << 20))
    chunk, read, sent = b"x" * (1 << 20), [0], []

    async def receive():
        read[0] += 1
        return {"type": "http.request", "body": chunk, "more_body": True}  # an endless body

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/label", "headers": [(b"content-type", b"application/json")],
             "query_string": b"", "http_version": "1.1", "scheme": "http", "server": ("127.0.0.1", 80),
             "client": ("127.0.0.1", 1), "root_path": "", "raw_path": b"/v1/label"}
    asyncio.run(app(scope, receive, send))
    assert sent[0]["status"] == 413 and read[0] <= 9  # 8 MiB + one chunk, of an endless body
    assert json.loads(sent[1]["body"])["error"]["code"] == "body_too_large"


def test_declared_content_length_over_the_limit_is_413_at_once_on_a_socket():
    with serve(app_config=AppConfig(max_body_bytes=1000)) as srv:
        port = int(srv.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"POST /v1/label HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 100000000\r\n\r\n{")  # 100 MB announced, 1 byte sent
            answer = s.recv(65536).decode()
        assert answer.startswith("HTTP/1.1 413") and "body_too_large" in answer
        r = post(srv.url, {"schema": "sms", "records": ["a"] * 5})
    assert r.status_code == 200


def test_too_many_records_is_413():
    with serve(app_config=AppConfig(max_records_per_request=3)) as srv:
        r = post(srv.url, {"schema": "sms", "records": ["a", "b", "c", "d"]})
    assert r.status_code == 413 and r.json()["error"]["code"] == "too_many_records"
    assert "--max-records-per-request" in r.json()["error"]["message"]


def test_deadline_is_503_and_the_rest_of_the_request_is_not_decoded():
    host = FakeHost(gate=threading.Event())
    with serve(host, app_config=AppConfig(request_timeout_s=0.3)) as srv:
        r = post(srv.url, {"schema": "sms", "records": [f"r{i}" for i in range(40)]})  # 3 chunks
        assert r.status_code == 503 and r.json()["error"]["code"] == "deadline_exceeded"
        assert "retry-after" in r.headers
        host.gate.set()
        _until(lambda: srv.service.idle)
        time.sleep(0.05)
    assert [len(c) for c in host.calls[1:]] == [16]  # the chunk running at the deadline; none after


def test_a_client_that_disconnects_while_queued_costs_no_decoding():
    host = FakeHost(gate=threading.Event())
    with serve(host) as srv:
        async def run():
            async with httpx.AsyncClient(timeout=30) as client:
                blocker = asyncio.ensure_future(client.post(srv.url + "/v1/label",
                                                            json={"schema": "sms", "records": ["blocker"]}))
                while not host.entered.is_set():
                    await asyncio.sleep(0.005)
                async with httpx.AsyncClient(timeout=0.3) as impatient:
                    with pytest.raises(httpx.ReadTimeout):
                        await impatient.post(srv.url + "/v1/label", json={"schema": "sms", "records": ["gone"]})
                while srv.service.queue_depth[0]:  # dropped from the queue once the server sees it
                    await asyncio.sleep(0.01)
                host.gate.set()
                return await blocker
        assert asyncio.run(run()).status_code == 200
        metrics = httpx.get(srv.url + "/metrics").text
    assert all((0, "gone") not in c for c in host.calls)
    assert "pcd_records_total 1.0" in metrics  # the blocker (the startup warm-up is not counted)


def test_a_crashing_batch_fails_its_requests_and_the_server_goes_on():
    with serve() as srv:
        crash = post(srv.url, {"schema": "sms", "records": ["CRASH now"]})
        after = post(srv.url, {"schema": "sms", "records": ["fine"]})
        ready = httpx.get(srv.url + "/ready")
    assert crash.status_code == 500 and crash.json()["error"]["code"] == "decode_failed"
    assert "CRASH" not in crash.text  # no record text in errors
    assert after.status_code == 200 and ready.status_code == 200


def test_schema_that_does_not_compile_is_422():
    bad = parse_schema({"name": "uncompilable", "fields": {"y": {"type": "boolean", "description": "y"}}})
    with serve() as srv:
        from pcd_cli.server.errors import api_error
        from pcd_cli.server.service_errors import NotCompilable

        with pytest.raises(NotCompilable) as err:
            asyncio.run(srv.service.submit(bad, [_rec("x")], request_id="r"))
    assert api_error(err.value).status == 422 and "needs a token the model lacks" in err.value.message


# -- auth, CORS, probes ----------------------------------------------------------------------------
def test_api_keys_protect_every_route_but_the_probes(monkeypatch):
    compared = []
    real = middleware.hmac.compare_digest

    def spy(a, b):
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(middleware.hmac, "compare_digest", spy)
    with serve(app_config=AppConfig(api_keys=("key-one", "key-two"))) as srv:
        body = {"schema": "sms", "records": ["a"]}
        assert post(srv.url, body).status_code == 401
        wrong = post(srv.url, body, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "authentication_error"
        assert wrong.headers["www-authenticate"] == "Bearer" and "x-request-id" in wrong.headers
        assert post(srv.url, body, headers={"Authorization": "Bearer key-two"}).status_code == 200
        assert post(srv.url, body, headers={"x-api-key": "key-one"}).status_code == 200
        assert httpx.get(srv.url + "/metrics").status_code == 401
        assert httpx.get(srv.url + "/v1/schemas").status_code == 401
        assert httpx.get(srv.url + "/health").status_code == 200 and httpx.get(srv.url + "/ready").status_code == 200
    assert (b"nope", b"key-one") in compared and (b"nope", b"key-two") in compared  # every key, constant time


def test_cors_only_with_origins():
    with serve() as srv:
        plain = httpx.get(srv.url + "/health", headers={"Origin": "https://a.example"})
    assert "access-control-allow-origin" not in plain.headers
    with serve(app_config=AppConfig(cors_origins=("https://a.example",), api_keys=("k",))) as srv:
        ok = httpx.get(srv.url + "/health", headers={"Origin": "https://a.example"})
        pre = httpx.options(srv.url + "/v1/label", headers={"Origin": "https://a.example",
                                                             "Access-Control-Request-Method": "POST"})
        other = httpx.get(srv.url + "/health", headers={"Origin": "https://b.example"})
    assert ok.headers["access-control-allow-origin"] == "https://a.example"
    assert pre.status_code == 200 and "access-control-allow-origin" not in other.headers


def test_ready_waits_for_the_model_while_health_answers():
    loaded = threading.Event()
    host = FakeHost(load_gate=loaded)
    with serve(host, wait_ready=False) as srv:
        assert httpx.get(srv.url + "/health").status_code == 200
        early = httpx.get(srv.url + "/ready")
        work = post(srv.url, {"schema": "sms", "records": ["a"]})
        loaded.set()
        assert srv.service.ready.wait(10)
        late = httpx.get(srv.url + "/ready")
    assert early.status_code == 503 and early.json()["error"]["code"] == "not_ready"
    assert work.status_code == 503 and late.status_code == 200


# -- drain -----------------------------------------------------------------------------------------
def test_drain_finishes_queued_work_and_refuses_new():
    host = FakeHost(gate=threading.Event())
    with serve(host) as srv:
        async def run():
            async with httpx.AsyncClient(timeout=30) as client:
                running = asyncio.ensure_future(client.post(srv.url + "/v1/label",
                                                            json={"schema": "sms", "records": ["running"]}))
                while not host.entered.is_set():  # the worker holds it
                    await asyncio.sleep(0.005)
                inflight = [running] + [asyncio.ensure_future(client.post(
                    srv.url + "/v1/label", json={"schema": "sms", "records": [f"r{i}"] * 3})) for i in range(2)]
                while srv.service.queue_depth[0] < 2:  # both queued behind it
                    await asyncio.sleep(0.005)
                srv.drain()
                ready = await client.get(srv.url + "/ready")
                new = await client.post(srv.url + "/v1/label", json={"schema": "sms", "records": ["new"]})
                host.gate.set()
                return ready, new, await asyncio.gather(*inflight)
        ready, new, done = asyncio.run(run())
        srv.thread.join(10)
        assert not srv.thread.is_alive()  # the server stopped by itself once drained
    assert ready.status_code == 503 and ready.json()["error"]["code"] == "draining"
    assert new.status_code == 503 and new.json()["error"]["code"] == "draining"
    assert [r.status_code for r in done] == [200, 200, 200]


def test_a_drain_past_its_timeout_answers_the_queued_503_at_once():
    """Past --shutdown-timeout-s the queued requests hear 503 while the server can still answer
    (not after the HTTP server stopped); only the decode call running then is waited for."""
    host = FakeHost(gate=threading.Event())
    with serve(host, shutdown_timeout_s=0.5) as srv:
        async def run():
            async with httpx.AsyncClient(timeout=30) as client:
                running = asyncio.ensure_future(client.post(srv.url + "/v1/label",
                                                            json={"schema": "sms", "records": ["running"]}))
                while not host.entered.is_set():
                    await asyncio.sleep(0.005)
                queued = [asyncio.ensure_future(client.post(srv.url + "/v1/label",
                                                            json={"schema": "sms", "records": [f"q{i}"]}))
                          for i in range(2)]
                while srv.service.queue_depth[0] < 2:
                    await asyncio.sleep(0.005)
                started = time.monotonic()
                srv.drain()
                shed = await asyncio.gather(*queued)
                waited = time.monotonic() - started
                host.gate.set()  # the running call ends after the timeout: its answer still goes out
                return waited, shed, await running
        waited, shed, running = asyncio.run(run())
        srv.thread.join(10)
        assert not srv.thread.is_alive()
    assert [r.status_code for r in shed] == [503, 503]
    assert {r.json()["error"]["code"] for r in shed} == {"shutting_down"} and shed[0].headers["retry-after"] == "1"
    assert 0.5 <= waited < 5, waited
    assert running.status_code == 200 and len(running.json()["rows"]) == 1
    assert [c[0][1] for c in host.calls][1:] == ["running"]  # after the warm-up; the shed were never decoded


def test_sigterm_drains_requests_in_flight_and_exits_0():
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "server" / "fakes.py"), "0.3", "20"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        url = f"http://127.0.0.1:{port}"
        _until(lambda: _ready(url), timeout=30)

        async def run():
            async with httpx.AsyncClient(timeout=30) as client:
                inflight = [asyncio.ensure_future(client.post(url + "/v1/label",
                                                              json={"schema": "sms", "records": [f"r{i}"] * 20}))
                            for i in range(4)]
                await asyncio.sleep(0.2)  # all four arrived; the first chunk is decoding (0.3 s per call)
                proc.send_signal(signal.SIGTERM)
                await asyncio.sleep(0.1)
                ready = await client.get(url + "/ready")
                return ready, await asyncio.gather(*inflight)
        ready, done = asyncio.run(run())
        code = proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = proc.stderr.read()
    assert ready.status_code == 503
    assert [r.status_code for r in done] == [200] * 4 and all(len(r.json()["rows"]) == 20 for r in done)
    assert code == 0, log
    assert "drained" in log and "r0" not in log  # record text never logged
    assert not Path(f"/proc/{proc.pid}").exists() or "Z" in Path(f"/proc/{proc.pid}/stat").read_text().split()[2]


def _ready(url) -> bool:
    try:
        return httpx.get(url + "/ready", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
