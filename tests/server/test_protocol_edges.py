"""The protocol edges (issue #36, kind 5): routing errors in the error envelope (405 with
``Allow``), CORS preflights of both official clients, no redirect built from the client's Host, a
client leaving mid-upload is one INFO line (499), labels that look alike are refused, two requests
with the same client id stay apart in the log."""

from __future__ import annotations

import logging
import socket
import time

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from pcd_cli.server.app import AppConfig  # noqa: E402
from pcd_cli.server.textcheck import label_problem  # noqa: E402

from .harness import envelope, no_leftovers, port_of, serve  # noqa: E402,F401

pytestmark = pytest.mark.usefixtures("no_leftovers")

ORIGIN = "http://app.example"


@pytest.mark.parametrize("method, path, status, allow", [
    ("POST", "/v1/chat/completions", 404, None),
    ("GET", "/nothing/here", 404, None),
    ("GET", "/v1/label", 405, "POST"),
    ("PUT", "/v1/systemone", 405, "POST"),
    ("OPTIONS", "/v1/decisions", 405, "POST"),
    ("DELETE", "/v1/schemas", 405, "GET, HEAD"),
    ("POST", "/health", 405, "GET, HEAD"),
])
def test_routing_errors_are_envelopes_and_405_sends_allow(method, path, status, allow):
    with serve() as srv:
        r = httpx.request(method, srv.url + path, content=b"{}" if method in ("POST", "PUT") else None,
                          headers={"Content-Type": "application/json"}, timeout=10)
    assert r.status_code == status and r.headers["content-type"] == "application/json"
    err = envelope(r)
    assert err["code"] == ("not_found" if status == 404 else "method_not_allowed")
    assert r.headers.get("allow") == allow and "x-request-id" in r.headers


def test_head_health_is_200_without_a_body():
    with serve() as srv:
        r = httpx.head(srv.url + "/health", timeout=10)
    assert r.status_code == 200 and r.content == b""


def test_the_openai_client_reads_the_404_code():
    openai = pytest.importorskip("openai")
    with serve() as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.NotFoundError) as caught:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.code == "not_found" and caught.value.type == "invalid_request_error"


STAINLESS = ",".join(["authorization", "content-type"] + [f"x-stainless-{x}" for x in (
    "os", "lang", "arch", "runtime", "runtime-version", "package-version", "retry-count", "timeout", "async")])


@pytest.mark.parametrize("path, requested", [
    ("/v1/decisions", STAINLESS),
    ("/v1/decisions", "Authorization, Content-Type, OpenAI-Organization, Idempotency-Key"),
    ("/v1/systemone", "authorization,content-type,content-encoding,x-typesafe-sdk,x-typesafe-runtime,"
                      "x-typesafe-retry-count"),
    ("/v1/label", "x-api-key,content-type,x-request-id"),
])
def test_preflights_of_the_official_clients_pass(path, requested, caplog):
    with caplog.at_level(logging.INFO, logger="pcd.server"):
        with serve(app_config=AppConfig(api_keys=("k",), cors_origins=(ORIGIN,))) as srv:
            r = httpx.options(srv.url + path, headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
                                                       "Access-Control-Request-Headers": requested}, timeout=10)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ORIGIN
    allowed = {h.strip().lower() for h in r.headers["access-control-allow-headers"].split(",")}
    assert {h.strip().lower() for h in requested.split(",")} <= allowed
    rid = r.headers["x-request-id"]
    assert any(rid in m and "OPTIONS" in m and "(CORS preflight)" in m for m in caplog.messages)


@pytest.mark.parametrize("origin, requested, why", [
    (ORIGIN, "content-type,x-evil-header", "header 'x-evil-header'"),
    ("http://evil.example", "content-type", "origin"),
])
def test_a_refused_preflight_is_an_envelope(origin, requested, why):
    with serve(app_config=AppConfig(cors_origins=(ORIGIN,))) as srv:
        r = httpx.options(srv.url + "/v1/decisions", headers={"Origin": origin, "Access-Control-Request-Method": "POST",
                                                              "Access-Control-Request-Headers": requested}, timeout=10)
    assert r.status_code == 400 and envelope(r)["code"] == "cors_preflight_refused" and why in envelope(r)["message"]
    assert (r.headers.get("access-control-allow-origin") == ORIGIN) == (origin == ORIGIN)


@pytest.mark.parametrize("path, method", [("/v1/label/", "POST"), ("/v1/schemas/", "GET"), ("/health/", "GET")])
def test_a_trailing_slash_is_served_not_redirected(path, method):
    with serve() as srv:
        r = httpx.request(method, srv.url + path, json={"schema": "triage", "records": ["x"]} if method == "POST" else None,
                          headers={"X-Forwarded-Proto": "https", "X-Forwarded-Host": "evil.example"}, timeout=10,
                          follow_redirects=False)
    assert r.status_code == 200 and "location" not in r.headers


def test_a_client_leaving_mid_upload_is_one_info_line(caplog):
    with caplog.at_level(logging.INFO, logger="pcd.server"):
        with serve() as srv:
            with socket.create_connection(("127.0.0.1", port_of(srv)), timeout=5) as s:
                s.sendall(b"POST /v1/label HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          b"Content-Length: 5000\r\nX-Request-Id: leaver-1\r\n\r\n{\"schema\": \"tri")
                time.sleep(0.3)
            end = time.monotonic() + 5
            while not any("leaver-1" in m for m in caplog.messages) and time.monotonic() < end:
                time.sleep(0.05)
    mine = [rec for rec in caplog.records if "leaver-1" in rec.getMessage()]
    assert len(mine) == 1 and mine[0].levelno == logging.INFO and " 499 " in mine[0].getMessage()
    assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR]


def test_two_requests_with_one_client_id_stay_apart_in_the_log(caplog):
    with caplog.at_level(logging.INFO, logger="pcd.server"):
        with serve() as srv:
            answers = [httpx.post(srv.url + "/v1/label", json={"schema": "triage", "records": ["x"]},
                                  headers={"x-request-id": "same-id"}, timeout=10) for _ in range(2)]
    assert [a.headers["x-request-id"] for a in answers] == ["same-id", "same-id"]
    access = [m for m in caplog.messages if m.startswith("same-id#") and "POST /v1/label 200" in m]
    assert len(access) == 2 and len({m.split()[0] for m in access}) == 2
    queued = [m for m in caplog.messages if "records queued" in m and "same-id#" in m]
    assert len({m.split()[1] for m in queued}) == 2


@pytest.mark.parametrize("labels, fragment", [
    (["caf\u00e9", "cafe\u0301"], "look the same"),            # NFC and NFD
    (["yes", "ye\u200bs"], "look the same"),                  # a zero-width space
    (["\ufb01le", "file"], "look the same"),                   # a ligature (NFKC)
    (["ok", "\u200b\u200d"], "has no visible character"),
    (["left", "\u202eright"], "bidirectional control"),
    (["a\u2066b", "c"], "bidirectional control"),
])
def test_labels_that_look_alike_are_refused(labels, fragment):
    assert fragment in label_problem(labels)
    with serve() as srv:
        r = httpx.post(srv.url + "/v1/systemone", timeout=10, json={
            "state": "x", "questions": {"q": {"type": "choice", "instructions": "Which?",
                                              "criteria": {label: None for label in labels}}}})
    assert r.status_code == 422, r.text
    err = envelope(r)
    assert err["code"] == "invalid_option" and fragment in err["message"]


def test_labels_that_differ_visibly_pass():
    assert label_problem(["café", "cafe", "Cafe", "naïve", "na\u00efve!"]) is None
