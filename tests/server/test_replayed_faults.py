"""The six replayed server faults of issue #36 (``cases/``, each from a public bug report of a
similar server): each script runs unchanged against a server over the fake host, started with the
options its docstring names, and must exit 0. The kinds they belong to are tested on more inputs
in test_request_isolation, test_deadlines, test_slow_clients, test_host_and_content_type and
test_protocol_edges."""

from __future__ import annotations

import pytest

pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from pcd_cli.server.app import AppConfig  # noqa: E402
from pcd_cli.server.service import ServiceConfig  # noqa: E402

from .harness import TokenizingHost, no_leftovers, run_case, serve  # noqa: E402,F401

pytestmark = pytest.mark.usefixtures("no_leftovers")


def _passes(name, srv, timeout=120):
    done = run_case(name, srv, timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("PASS: ")
    return done.stdout


def test_surrogate_state_fails_only_its_own_request():
    """A Jev state holding "\\ud83d" packed with a good request: the good one 200, the bad 422."""
    host = TokenizingHost(delay=0.5)
    with serve(host) as srv:
        out = _passes("surrogate-state-fails-packed-neighbours", srv)
    assert "good request: 200" in out and "bad request: 422 invalid_text" in out


@pytest.mark.full  # 8 s; test_deadlines.py holds the same faults in about a second each
def test_slow_compile_outlives_no_deadline():
    """A question set that compiles for 6 s with --request-timeout-s 5: its 503 comes at 5 s, its
    record is never decoded, and a request for a startup schema sent meanwhile is answered."""
    host = TokenizingHost(compile_s=6.0)
    with serve(host, config=ServiceConfig(request_timeout_s=5), app_config=AppConfig(request_timeout_s=5)) as srv:
        out = _passes("slow-compile-outlives-deadline", srv)
    assert "255-option request: 503 deadline_exceeded" in out and "small request for the startup schema: 200" in out
    decoded = [text for call in host.calls for _, text in call]
    assert "late again" in decoded and not any("Lyon" in (text or "") for text in decoded)


def test_slowloris_header_and_body_drips_are_cut_off():
    with serve(config=ServiceConfig(request_timeout_s=5), app_config=AppConfig(request_timeout_s=5)) as srv:
        out = _passes("slowloris-headers-and-body", srv, timeout=90)
    assert "header drip: 408 after" in out


def test_dns_rebinding_and_text_plain_are_refused_keyless():
    with serve() as srv:
        out = _passes("dns-rebinding-simple-post-keyless", srv)
    assert "(rebound Host, text/plain): 421" in out and "text/plain from loopback Host: 415" in out


def test_404_405_are_error_envelopes_read_by_the_openai_client():
    pytest.importorskip("openai")
    with serve() as srv:
        out = _passes("error-envelope-404-405-plaintext", srv)
    assert "code='not_found'" in out and "Allow=POST" in out


def test_cors_preflights_of_both_official_clients_pass():
    with serve(app_config=AppConfig(api_keys=("s3cr3t-key-AAAA",), cors_origins=("http://app.example",))) as srv:
        out = _passes("cors-preflight-sdk-headers", srv)
    assert "preflight openai-node: 200" in out and "preflight typesafe: 200" in out
