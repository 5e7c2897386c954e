"""A new wire format is one module and one line: the toy format of ``tests/server/toy_format.py``
(its own route, request-id header and client header) registered by one line beside the real ones
(``create_app(..., formats=(*FORMATS, toy.FORMAT))``, as a real one is a line of ``app.FORMATS``),
served over the fake host and answering; the middleware and CORS read its headers from its
declaration (``wire.WireFormat``), and the real formats' headers stay what they were."""

from __future__ import annotations

from contextlib import contextmanager

import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")
pytest.importorskip("prometheus_client")

from starlette.testclient import TestClient  # noqa: E402

from pcd_cli.job import LabelJob  # noqa: E402
from pcd_cli.results import Record  # noqa: E402
from pcd_cli.server.app import FORMATS, AppConfig, create_app  # noqa: E402
from pcd_cli.server.service import LabelService  # noqa: E402

from . import toy_format as toy  # noqa: E402
from .fakes import FakeHost, FakeLabeler  # noqa: E402
from .harness import AIRLINE, envelope, no_leftovers  # noqa: E402,F401

pytestmark = pytest.mark.usefixtures("no_leftovers")

ORIGIN = "http://app.example"
WITH_TOY = (*FORMATS, toy.FORMAT)  # the one line that registers it


@contextmanager
def app_client(app_config: AppConfig = AppConfig(), formats=WITH_TOY):
    service = LabelService(FakeHost(), {"triage": (AIRLINE, LabelJob())})
    service.start()
    assert service.ready.wait(30), service.startup_error
    try:
        with TestClient(create_app(service, app_config, formats=formats)) as client:
            yield client
    finally:
        service.close()


def test_the_toy_format_is_served_and_answers_with_its_own_request_id_header():
    text = "the flight was late and the crew rude"
    with app_client() as client:
        r = client.post("/v1/toy", json={"text": text}, headers={"x-request-id": "toy-1"})
        label = client.post("/v1/label", json={"schema": "triage", "records": ["x"]})
    expected = FakeLabeler(AIRLINE, LabelJob(), FakeHost())._one(Record("toy-1", text))
    assert r.status_code == 200, r.text
    assert r.json() == {"labels": {f.name: fr.value for f, fr in zip(AIRLINE.fields, expected.fields)},
                        "input_tokens": len(text.split())}
    assert r.headers["x-toy-request-id"] == r.headers["x-request-id"] == "toy-1"
    assert label.status_code == 200 and "x-toy-request-id" not in label.headers  # only on its own routes


def test_the_toy_formats_errors_go_through_the_one_table_and_carry_its_header():
    with app_client(AppConfig(api_keys=("k",))) as client:
        keyless = client.post("/v1/toy", json={"text": "x"})
        auth = {"Authorization": "Bearer k"}
        bad = client.post("/v1/toy", json={"text": 3}, headers=auth)
        failed = client.post("/v1/toy", json={"text": "FAIL here"}, headers=auth)
        missing = client.get("/nowhere", headers=auth)
    assert keyless.status_code == 401 and keyless.headers["x-toy-request-id"] == keyless.headers["x-request-id"]
    assert (bad.status_code, envelope(bad)["code"], envelope(bad)["type"]) == (422, "invalid_request",
                                                                              "invalid_request_error")
    assert envelope(bad)["message"] == "text: must be a string"
    assert bad.headers["x-toy-request-id"] == bad.headers["x-request-id"]
    assert (failed.status_code, envelope(failed)["code"]) == (422, "record_failed")
    assert "too long for the model (fake)" in envelope(failed)["message"]
    assert missing.status_code == 404 and "/v1/toy" in envelope(missing)["message"]


@pytest.mark.parametrize("formats, status", [(WITH_TOY, 200), (FORMATS, 400)])
def test_cors_allows_and_exposes_the_headers_a_format_declares(formats, status):
    with app_client(AppConfig(cors_origins=(ORIGIN,)), formats=formats) as client:
        pre = client.options("/v1/toy", headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
                                                 "Access-Control-Request-Headers": "content-type, x-toy-client"})
        r = client.get("/v1/schemas", headers={"Origin": ORIGIN})
    assert pre.status_code == status
    exposed = r.headers["access-control-expose-headers"]
    if status == 200:
        assert exposed == "x-request-id, x-typesafe-request-id, x-toy-request-id, retry-after"
    else:  # the real formats alone: what pcd exposed before formats were declarations
        assert envelope(pre)["code"] == "cors_preflight_refused" and "x-toy-client" in envelope(pre)["message"]
        assert exposed == "x-request-id, x-typesafe-request-id, retry-after"
