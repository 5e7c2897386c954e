"""Slow and huge clients are cut off (issue #36, kind 3): the header block must arrive within the
read timeout of its first byte (408), the body within the read timeout of the headers (408); a
header block over ``max_header_bytes`` is 431 (RFC 6585 §5); connections past ``max_connections``
get 503; a client that sends its whole body before reading gets its 413, not a reset. Every one
of these answers is the error envelope."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from pcd_cli.server.app import AppConfig  # noqa: E402

from .harness import no_leftovers, port_of, raw, serve  # noqa: E402,F401

pytestmark = pytest.mark.usefixtures("no_leftovers")

FAST = AppConfig(read_timeout_s=1.0)


def _status_and_error(answer: bytes) -> tuple[int, dict]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body)["error"]


def _drip(srv, prefix: bytes, unit: bytes, *, watch: float = 6.0) -> tuple[bytes, float]:
    """Send ``prefix`` then ``unit`` every 0.2 s until the server answers or closes; returns what
    it sent back and when."""
    with socket.create_connection(("127.0.0.1", port_of(srv)), timeout=0.2) as s:
        s.sendall(prefix)
        t0, got = time.monotonic(), b""
        while time.monotonic() - t0 < watch:
            try:
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
                continue
            except socket.timeout:
                pass
            except ConnectionResetError:
                break
            try:
                s.sendall(unit)
            except OSError:
                break
        return got, time.monotonic() - t0


@pytest.mark.parametrize("prefix", [
    b"POST /v1/label HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ",  # a header trickled
    b"GET /v1/sch",                                              # the request line trickled
])
def test_a_trickled_header_block_gets_408_at_the_read_timeout(prefix):
    with serve(app_config=FAST) as srv:
        got, seconds = _drip(srv, prefix, b"x")
    status, err = _status_and_error(got)
    assert status == 408 and err["code"] == "request_timeout" and "--read-timeout-s" in err["message"]
    assert 0.9 <= seconds < 2.0


@pytest.mark.parametrize("path, ctype", [("/v1/label", "application/json"), ("/v1/systemone", "application/json"),
                                         ("/v1/decisions", "application/json")])
def test_a_trickled_body_gets_408_at_the_read_timeout(path, ctype):
    with serve(app_config=FAST) as srv:
        head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {ctype}\r\n"
                "Content-Length: 1000\r\n\r\n").encode()
        got, seconds = _drip(srv, head, b" ")
        alive = httpx.get(srv.url + "/health", timeout=5)
    status, err = _status_and_error(got)
    assert status == 408 and err["code"] == "request_timeout"
    assert 0.9 <= seconds < 2.0 and alive.status_code == 200


def test_a_connection_that_sends_nothing_is_closed_at_the_read_timeout():
    with serve(app_config=FAST) as srv:
        got, seconds = _drip(srv, b"", b"")
    assert got == b"" and 0.9 <= seconds < 2.0


def test_the_read_timeout_defaults_to_the_request_timeout():
    assert AppConfig(request_timeout_s=5).receive_timeout_s == 5.0
    assert AppConfig(request_timeout_s=5, read_timeout_s=2).receive_timeout_s == 2.0
    assert AppConfig(request_timeout_s=None).receive_timeout_s == 60.0


def test_keep_alive_requests_on_one_connection_are_not_cut_by_the_header_timer():
    with serve(app_config=FAST) as srv:
        with httpx.Client(timeout=5) as client:
            answers = []
            for _ in range(3):
                answers.append(client.post(srv.url + "/v1/label", json={"schema": "triage", "records": ["x"]}))
                time.sleep(0.6)  # 1.8 s on one connection, more than the read timeout
    assert [a.status_code for a in answers] == [200, 200, 200]


@pytest.mark.parametrize("header_bytes", [70_000, 1_000_000])
def test_a_header_block_over_the_limit_is_431(header_bytes):
    with serve() as srv:
        line = b"X-Big: " + b"a" * header_bytes + b"\r\n"
        got = raw(srv, b"GET /v1/schemas HTTP/1.1\r\nHost: 127.0.0.1\r\n" + line)
        alive = httpx.get(srv.url + "/health", timeout=5)
    status, err = _status_and_error(got)
    assert status == 431 and err["code"] == "headers_too_large" and "65536 bytes" in err["message"]
    assert alive.status_code == 200


def test_a_malformed_request_is_400_in_the_envelope():
    with serve() as srv:
        got = raw(srv, b"GET /v1/schemas HTTP/1.1\r\nHost: 127.0.0.1\r\nBad Header Line\r\n\r\n")
    status, err = _status_and_error(got)
    assert status == 400 and err["code"] == "invalid_http"


def test_connections_past_the_limit_get_503():
    with serve(app_config=AppConfig(max_connections=3)) as srv:
        held = [socket.create_connection(("127.0.0.1", port_of(srv)), timeout=5) for _ in range(3)]
        try:
            time.sleep(0.2)
            got = raw(srv, b"")
        finally:
            for s in held:
                s.close()
        time.sleep(0.2)
        after = httpx.get(srv.url + "/health", timeout=5)
    status, err = _status_and_error(got)
    assert status == 503 and err["code"] == "too_many_connections" and b"retry-after: 1" in got.lower()
    assert after.status_code == 200


@pytest.mark.parametrize("size", [1_500, 2_000])
def test_a_client_that_sends_its_whole_body_first_reads_the_413(size):
    """urllib writes the whole body before it reads: it gets the 413 (the server reads the body
    on, up to twice the limit, before answering), not a connection reset."""
    with serve(app_config=AppConfig(max_body_bytes=1000)) as srv:
        body = json.dumps({"schema": "triage", "records": ["x" * size]}).encode()
        request = urllib.request.Request(srv.url + "/v1/label", data=body,
                                         headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=10)
        error = json.loads(caught.value.read())["error"]
        caught.value.close()
    assert caught.value.code == 413 and error["code"] == "body_too_large"
