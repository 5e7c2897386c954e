"""A deadline ends the work (issue #36, kind 2): a request past its deadline, or whose client left,
is dropped before compiling, between compile and decode and between chunks; compiling a new
question set runs on its own thread and never holds up requests for schemas already compiled; a
question set over the compile-cost bound is refused up front (413) and never compiled."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from pcd_cli.results import Record  # noqa: E402
from pcd_cli.server.app import AppConfig  # noqa: E402
from pcd_cli.server.errors import api_error  # noqa: E402
from pcd_cli.server.service_errors import DeadlineExceeded  # noqa: E402
from pcd_cli.job import LabelJob  # noqa: E402
from pcd_cli.server.service import LabelService, ServiceConfig  # noqa: E402
from pcd_cli.server.textcheck import compile_cost, estimate_label_tokens  # noqa: E402

from .harness import AIRLINE, TokenizingHost, envelope, no_leftovers, serve  # noqa: E402,F401

pytestmark = pytest.mark.usefixtures("no_leftovers")


def _choice(tag: str, n: int, label_len: int = 8) -> dict:
    labels = {f"{tag}_{i:03d}".ljust(label_len, "x"): None for i in range(n)}
    return {"state": f"The parcel for {tag} was sent from Lyon to Osaka.",
            "questions": {"dest": {"type": "choice", "instructions": "Where does it go?", "criteria": labels}}}


def _decoded_texts(host) -> list[str]:
    return [text for call in host.calls for _, text in call if text]


def test_a_slow_compile_never_holds_up_compiled_schemas_and_its_request_is_dropped_at_its_deadline():
    host = TokenizingHost(compile_s=1.5)
    cfg = AppConfig(request_timeout_s=1.0)
    with serve(host, config=ServiceConfig(request_timeout_s=1.0), app_config=cfg) as srv:
        out = {}

        def big():
            t = time.monotonic()
            out["big"] = httpx.post(srv.url + "/v1/systemone", json=_choice("alpha", 40), timeout=10)
            out["big_s"] = time.monotonic() - t

        thread = threading.Thread(target=big)
        thread.start()
        assert host.compile_started.wait(5)
        t = time.monotonic()
        small = httpx.post(srv.url + "/v1/label", json={"schema": "triage", "records": ["late again"]}, timeout=10)
        small_s = time.monotonic() - t
        thread.join(10)
        time.sleep(1.0)  # the compile ends meanwhile; nothing may be decoded for the dropped request
        texts = _decoded_texts(host)
    assert small.status_code == 200 and small_s < 0.5  # answered while the compile ran
    assert out["big"].status_code == 503 and envelope(out["big"])["code"] == "deadline_exceeded"
    assert 0.9 <= out["big_s"] < 1.4  # at its deadline, not at the compile's end
    assert "late again" in texts and not any("alpha" in t for t in texts)


def test_a_request_past_its_deadline_is_not_compiled_at_all():
    """Two new question sets queued together: the first compiles for 1 s, during which the
    second's deadline (0.6 s) passes; the second is never compiled."""
    host = TokenizingHost(compile_s=1.0)
    cfg = AppConfig(request_timeout_s=0.6)
    with serve(host, config=ServiceConfig(request_timeout_s=0.6), app_config=cfg) as srv:
        async def both():
            async with httpx.AsyncClient(timeout=10) as c:
                return await asyncio.gather(c.post(srv.url + "/v1/systemone", json=_choice("first", 3)),
                                            c.post(srv.url + "/v1/systemone", json=_choice("second", 4)))

        answers = asyncio.run(both())
        time.sleep(1.2)  # the first compile ends; the compile thread then looks at the second
        compiled = [name for name in host.compiled if name not in ("airline_sentiment", "sms_spam")]
    assert [a.status_code for a in answers] == [503, 503]
    assert len(compiled) == 1  # the first question set only
    assert _decoded_texts(host) == ["Warm-up record: hello."] * 2


def test_a_request_is_dropped_between_chunks_at_its_deadline():
    """48 records (three chunks of 16) at 0.3 s a call and a 0.45 s deadline: 503, and no chunk
    is started after the deadline."""
    host = TokenizingHost(delay=0.3)
    service = LabelService(host, {"triage": (AIRLINE, LabelJob())}, config=ServiceConfig(packing=False))
    service.start()
    assert service.ready.wait(10)
    records = [Record(f"r{i}", f"text {i}") for i in range(48)]
    try:
        with pytest.raises(DeadlineExceeded) as caught:
            asyncio.run(service.submit(AIRLINE, records, request_id="long", deadline=time.monotonic() + 0.45))
        time.sleep(0.7)  # a chunk running at the deadline ends; no other may start
    finally:
        service.close()
    assert api_error(caught.value).status == 503 and caught.value.code == "deadline_exceeded"
    chunks = [call for call in host.calls if call[0][0] != "warm-up"]
    assert len(chunks) == 2 and [len(c) for c in chunks] == [16, 16]


def test_a_client_that_left_is_not_compiled_for():
    """The client of a request waiting for its compile leaves: its question set is not compiled
    once the compile thread reaches it."""
    host = TokenizingHost(compile_s=0.8)
    with serve(host) as srv:
        first = threading.Thread(target=lambda: httpx.post(srv.url + "/v1/systemone", json=_choice("keep", 3),
                                                           timeout=10))
        first.start()
        assert host.compile_started.wait(5)
        with pytest.raises(httpx.TimeoutException):
            httpx.post(srv.url + "/v1/systemone", json=_choice("leave", 5), timeout=0.3)
        first.join(10)
        time.sleep(0.5)
        compiled = [name for name in host.compiled if name not in ("airline_sentiment", "sms_spam")]
    assert len(compiled) == 1


@pytest.mark.parametrize("n, label_len, bound, status", [
    (10, 16, 100, 200),    # 10 × 5 estimated tokens = 50
    (30, 16, 100, 413),    # 150
    (255, 130, 8192, 413),  # 255 × 33 = 8415, over the default bound
    (255, 16, 8192, 200),  # 255 × 5 = 1275: the documented maximum of options, short labels
])
def test_the_compile_cost_bound_is_refused_up_front(n, label_len, bound, status):
    host = TokenizingHost()
    with serve(host, config=ServiceConfig(max_compile_cost=bound)) as srv:
        r = httpx.post(srv.url + "/v1/systemone", json=_choice("port", n, label_len), timeout=30)
        label = httpx.post(srv.url + "/v1/label", json={"schema": "triage", "records": ["x"]}, timeout=10)
    assert r.status_code == status, r.text
    assert label.status_code == 200  # startup schemas are not bounded
    if status == 413:
        err = envelope(r)
        assert err["code"] == "too_costly" and f"at most {bound}" in err["message"]
        assert host.compiled == ["airline_sentiment", "sms_spam"]  # nothing compiled for it


def test_compile_cost_counts_options_times_tokens():
    assert estimate_label_tokens("abcd") == 2 and estimate_label_tokens("é") == 1
    assert compile_cost(AIRLINE) == sum(len(label.encode()) // 4 + 1 for f in AIRLINE.fields for label in f.labels)


@pytest.mark.full  # about 8 s: the drain's grace for the last responses, then the join of the compile
def test_sigterm_during_a_compile_exits_0_and_abandons_the_compile():
    """A compile cannot be interrupted: on SIGTERM its request gets its answer, the server drains,
    and the process exits 0 at once, saying it abandoned the compile (leaving it to the
    interpreter's exit aborted with the real model: exit 134)."""
    import signal
    import subprocess
    import sys

    from .harness import ROOT

    proc = subprocess.Popen([sys.executable, "-m", "tests.server.slow_compile_server", "60", "1"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{int(proc.stdout.readline())}"
        end = time.monotonic() + 30
        while time.monotonic() < end:
            try:
                if httpx.get(url + "/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        out = {}
        thread = threading.Thread(target=lambda: out.setdefault(
            "r", httpx.post(url + "/v1/systemone", json=_choice("sig", 3), timeout=30)))
        thread.start()
        time.sleep(0.5)  # compiling now (60 s)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
        took = time.monotonic() - started
        thread.join(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = proc.stderr.read()
    assert code == 0, log
    assert took < 15 and "pcd-compile-worker still running after the drain" in log
    assert out["r"].status_code == 503 and out["r"].json()["error"]["code"] in ("shutting_down", "draining")


def test_the_deadline_counts_from_the_request_arrival_body_reading_included():
    """Headers at 0 s, body at 0.7 s, 0.6 s of decoding, --request-timeout-s 1: 503 at about 1 s
    from arrival (counted from the end of the body it would be answered 200 at 1.3 s)."""
    import json
    import socket

    from .harness import port_of

    host = TokenizingHost(delay=0.6)
    with serve(host, app_config=AppConfig(request_timeout_s=1.0, read_timeout_s=5.0)) as srv:
        body = json.dumps({"schema": "triage", "records": ["slow body"]}).encode()
        with socket.create_connection(("127.0.0.1", port_of(srv)), timeout=5) as s:
            started = time.monotonic()
            s.sendall(b"POST /v1/label HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      + f"Content-Length: {len(body)}\r\n\r\n".encode())
            time.sleep(0.7)
            s.sendall(body)
            answer = s.recv(65536)
            took = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 503") and b"deadline_exceeded" in answer
    assert 0.9 <= took < 1.25
