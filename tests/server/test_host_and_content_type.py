"""A keyless server on loopback cannot be driven by a web page (issue #36, kind 4): a Host that is
not a loopback name (or one given with ``allowed_hosts``) is 421 (DNS rebinding), a body that is
not JSON is 415 with ``Accept`` (RFC 9110 §15.5.16), a cross-origin POST from an origin not
allowed by ``cors_origins`` is 403; ``/health`` stays open."""

from __future__ import annotations

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from pcd_cli.server.app import AppConfig
from pcd_cli.server.middleware import allowed_hosts, host_name, is_loopback  # noqa: E402

import threading  # noqa: E402

from .harness import check_nothing_left, envelope, no_leftovers, serve  # noqa: E402,F401

pytestmark = pytest.mark.usefixtures("no_leftovers")


@pytest.fixture(scope="module")
def srv():
    """One keyless server on loopback with the default options for the tables below."""
    before = {t.ident for t in threading.enumerate()}
    with serve() as server:
        yield server
    check_nothing_left(before)

JEV = {"state": "note", "questions": {"a": {"type": "noul", "instructions": "ok?"}}}
LABEL = {"schema": "triage", "records": ["x"]}


@pytest.mark.parametrize("host", ["attacker.example", "attacker.example:8000", "127.0.0.1.nip.io", "[::2]:80",
                                  "LOCALHOST.attacker.example"])
@pytest.mark.parametrize("method, path, body", [("POST", "/v1/systemone", JEV), ("POST", "/v1/label", LABEL),
                                                ("GET", "/v1/schemas", None), ("GET", "/metrics", None),
                                                ("GET", "/v1/models", None)])
def test_a_foreign_host_is_421_on_every_route(srv, host, method, path, body):
    r = httpx.request(method, srv.url + path, json=body, headers={"Host": host}, timeout=10)
    health = httpx.get(srv.url + "/health", headers={"Host": host}, timeout=10)
    assert r.status_code == 421
    err = envelope(r)
    assert err["code"] == "misdirected_request" and "--allowed-host" in err["message"]
    assert health.status_code == 200  # probes stay open


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost:8000", "LocalHost", "[::1]:9"])
def test_loopback_hosts_are_answered(srv, host):
    r = httpx.post(srv.url + "/v1/label", json=LABEL, headers={"Host": host}, timeout=10)
    assert r.status_code == 200


def test_allowed_host_names_are_answered_and_star_turns_the_check_off():
    with serve(app_config=AppConfig(allowed_hosts=("pcd.internal",))) as srv:
        named = httpx.get(srv.url + "/v1/schemas", headers={"Host": "pcd.internal:8000"}, timeout=10)
        other = httpx.get(srv.url + "/v1/schemas", headers={"Host": "other.internal"}, timeout=10)
    with serve(app_config=AppConfig(allowed_hosts=("*",))) as srv:
        anything = httpx.get(srv.url + "/v1/schemas", headers={"Host": "other.internal"}, timeout=10)
    assert (named.status_code, other.status_code, anything.status_code) == (200, 421, 200)


def test_which_hosts_are_checked():
    assert allowed_hosts(AppConfig(), "127.0.0.1") == {"127.0.0.1", "localhost", "::1", "[::1]"}
    assert allowed_hosts(AppConfig(), "0.0.0.0") is None  # public: keys guard it (pcd serve needs one)
    assert allowed_hosts(AppConfig(allowed_hosts=("a.example",)), "0.0.0.0") == {"a.example"}
    assert "pcd.lan" in allowed_hosts(AppConfig(allowed_hosts=("PCD.lan",)), "::1")
    assert [host_name(h) for h in ("Example.com:80", "[::1]:8000", "::1", "a")] == ["example.com", "[::1]", "::1", "a"]
    assert [is_loopback(h) for h in ("127.0.0.2", "::1", "localhost", "10.0.0.1", "pcd")] == [True, True, True, False,
                                                                                                False]


@pytest.mark.parametrize("ctype", ["text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                                   "application/xml", "text/json"])
@pytest.mark.parametrize("path, body", [("/v1/systemone", JEV), ("/v1/label", LABEL),
                                        ("/v1/decisions", {"input": "x", "questions": []})])
def test_a_body_that_is_not_json_is_415_with_accept(srv, ctype, path, body):
    import json

    r = httpx.post(srv.url + path, content=json.dumps(body).encode(), headers={"Content-Type": ctype}, timeout=10)
    assert r.status_code == 415 and r.headers["accept"] == "application/json"
    assert envelope(r)["code"] == "unsupported_media_type"


@pytest.mark.parametrize("ctype", ["application/json", "application/json; charset=utf-8", "Application/JSON",
                                   "application/merge-patch+json", None])
def test_json_content_types_and_none_are_read(srv, ctype):
    import json

    headers = {"Content-Type": ctype} if ctype else {}
    r = httpx.post(srv.url + "/v1/label", content=json.dumps(LABEL).encode(), headers=headers, timeout=10)
    assert r.status_code == 200


def test_an_unknown_content_encoding_is_415_with_accept_encoding(srv):
    r = httpx.post(srv.url + "/v1/label", content=b"{}", timeout=10,
                   headers={"Content-Type": "application/json", "Content-Encoding": "br"})
    assert r.status_code == 415 and r.headers["accept-encoding"] == "zstd, identity"
    assert envelope(r)["code"] == "unsupported_encoding"


@pytest.mark.parametrize("origin, cors, status", [
    ("http://evil.example", (), 403),
    ("null", (), 403),
    ("http://app.example", ("http://app.example",), 200),
    ("http://evil.example", ("http://app.example",), 403),
])
def test_a_cross_origin_post_needs_an_allowed_origin(origin, cors, status):
    with serve(app_config=AppConfig(cors_origins=cors)) as srv:
        r = httpx.post(srv.url + "/v1/label", json=LABEL, headers={"Origin": origin}, timeout=10)
        same = httpx.post(srv.url + "/v1/label", json=LABEL, headers={"Origin": srv.url}, timeout=10)
    assert r.status_code == status and same.status_code == 200
    if status == 403:
        assert envelope(r)["code"] == "origin_not_allowed"
