"""The service speaks pcd's errors: each error kind the service, the Label Studio backend and the
wire raise (``server/service_errors.py``) carries a code and a ``retry_after``, never a status, and
the one table (``server/errors.py`` ``ANSWERS``) maps it to the status, type, code and
``Retry-After`` a client reads. Each kind is raised through its real path where that is cheap."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

pytest.importorskip("starlette")

from pcd_cli import questions as Q  # noqa: E402
from pcd_cli.job import LabelJob  # noqa: E402
from pcd_cli.results import Record  # noqa: E402
from pcd_cli.schema.load import parse_schema  # noqa: E402
from pcd_cli.server import service as service_module  # noqa: E402
from pcd_cli.server.errors import _EXPECTED_5XX, ANSWERS, api_error, error_response  # noqa: E402
from pcd_cli.server.label_studio import MappingError, map_config, state_unwritable  # noqa: E402
from pcd_cli.server.service import LabelService, ServiceConfig  # noqa: E402
from pcd_cli.server.service_errors import (CompileFailed, DeadlineExceeded, NotCompilable, RecordFailed,  # noqa: E402
                                           ServiceError, ShuttingDown, StartupFailed, UnknownProject)

from .fakes import FakeHost  # noqa: E402
from .harness import AIRLINE  # noqa: E402


def _schema(labels=("red", "green"), **change):
    good = parse_schema({"name": "q", "fields": {"pick": {"type": "enum", "labels": list(labels),
                                                          "description": "Which colour?"}}})
    return dataclasses.replace(good, **change)


def _raised(call) -> BaseException:
    try:
        call()
    except BaseException as exc:  # noqa: BLE001 - the error under test
        return exc
    raise AssertionError("nothing raised")


def _queue_full():
    service = LabelService(FakeHost(), config=ServiceConfig(max_queued_records=10))
    service._queued_records = 8
    service._rate.extend([(20, 1.0), (20, 1.0)])  # 20 records/s: 43 over the limit -> 3 s
    return _raised(lambda: service._check_room(45))


def _submitted(draining: bool):
    service = LabelService(FakeHost(), {"triage": (AIRLINE, LabelJob())})  # never started: not ready
    service.draining = draining
    return _raised(lambda: asyncio.run(service.submit(AIRLINE, [Record("r", "x")], request_id="r")))


def _checked(schema, **config):
    return _raised(lambda: LabelService(FakeHost(), config=ServiceConfig(**config))._check_schema(schema))


CASES = {  # kind: (how it is raised, status, type, code, Retry-After)
    "queue_full": (_queue_full, 429, "rate_limit_error", "queue_full", "3"),
    "draining": (lambda: _submitted(True), 503, "server_error", "draining", "1"),
    "not_ready": (lambda: _submitted(False), 503, "server_error", "not_ready", "1"),
    "shutting_down": (lambda: ShuttingDown("shut down"), 503, "server_error", "shutting_down", "1"),
    "deadline_exceeded": (lambda: DeadlineExceeded(3, 10, 2.0, 5, 7), 503, "server_error", "deadline_exceeded", "7"),
    "startup_failed": (lambda: StartupFailed("no model"), 503, "server_error", "startup_failed", None),
    "too_costly": (lambda: _checked(_schema(), max_compile_cost=1), 413, "invalid_request_error", "too_costly", None),
    "invalid_option": (lambda: _checked(_schema(("yes", "ye\u200bs"))), 422, "invalid_request_error",
                       "invalid_option", None),
    "invalid_text": (lambda: _checked(_schema(name="q\udc00")), 422, "invalid_request_error", "invalid_text", None),
    "schema_not_compilable": (lambda: NotCompilable("needs a token"), 422, "invalid_request_error",
                              "schema_not_compilable", None),
    "record_failed": (lambda: RecordFailed("state: too long"), 422, "invalid_request_error", "record_failed", None),
    "unknown_project": (lambda: UnknownProject("project '7'"), 422, "invalid_request_error", "unknown_project", None),
    "label_config_not_mapped": (lambda: _raised(lambda: map_config("<View><Text name='t' value='$t'/></View>", {})),
                                422, "invalid_request_error", "label_config_not_mapped", None),
    "journal_unwritable": (lambda: state_unwritable("cannot write gold.jsonl: read-only", kept=2), 503,
                           "server_error", "journal_unwritable", "60"),
    "compile_failed": (lambda: CompileFailed("crashed"), 500, "server_error", "compile_failed", None),
    "decode_failed": (lambda: service_module._internal(RuntimeError("boom")), 500, "server_error", "decode_failed",
                      None),
    "too_many_questions": (lambda: Q.too_large("13 questions", "too_many_questions"), 413, "invalid_request_error",
                           "too_many_questions", None),
    "a question's own code": (lambda: Q.invalid("state: empty", "invalid_state"), 422, "invalid_request_error",
                              "invalid_state", None),
}


@pytest.mark.parametrize("kind", list(CASES))
def test_each_error_kind_maps_to_its_status_code_and_retry_after(kind):
    raise_it, status, type_, code, retry_after = CASES[kind]
    exc = raise_it()
    assert not isinstance(exc, AssertionError), exc
    assert not hasattr(exc, "status") and not hasattr(exc, "headers")  # the kind knows nothing of HTTP
    response = error_response(api_error(exc))
    body = json.loads(response.body)
    assert response.status_code == status
    assert body == {"error": {"type": type_, "code": code, "message": str(exc)}}
    assert response.headers.get("retry-after") == retry_after


def _kinds(cls=ServiceError):
    for sub in cls.__subclasses__():
        yield sub
        yield from _kinds(sub)


def test_every_kind_has_a_row_in_the_one_table():
    kinds = {k.__name__: k.code for k in _kinds() if "code" in vars(k)}
    assert kinds == {
        "QueueFull": "queue_full", "Draining": "draining", "NotReady": "not_ready", "ShuttingDown": "shutting_down",
        "DeadlineExceeded": "deadline_exceeded", "StartupFailed": "startup_failed", "InvalidText": "invalid_text",
        "InvalidOption": "invalid_option", "TooCostly": "too_costly", "NotCompilable": "schema_not_compilable",
        "RecordFailed": "record_failed", "UnknownProject": "unknown_project", "CompileFailed": "compile_failed",
        "DecodeFailed": "decode_failed", "JournalUnwritable": "journal_unwritable",
        "MappingError": "label_config_not_mapped"}
    assert set(kinds.values()) <= set(ANSWERS)
    assert {k for k in kinds.values() if k in CASES} == set(kinds.values())  # each is tested above
    assert issubclass(MappingError, ServiceError)
    # the 5xx logged by the access line only (the server working as meant); any other 5xx also at ERROR
    assert _EXPECTED_5XX == {"draining", "not_ready", "deadline_exceeded", "shutting_down"}


def test_a_deadline_counted_over_slices_keeps_its_retry_after():
    exc = DeadlineExceeded(3, 16, 2.0, None, 7).counted(32, 40, "tasks")
    assert (exc.done, exc.total, exc.retry_after) == (35, 40, 7)
    assert "(35 of 40 tasks decoded; --request-timeout-s)" in str(exc)
    assert api_error(exc).headers == {"Retry-After": "7"}


def test_the_service_counts_its_refusals_by_code_and_not_its_bad_requests():
    service = LabelService(FakeHost(), {"triage": (AIRLINE, LabelJob())})
    for draining in (True, False, False):
        service.draining = draining
        _raised(lambda: asyncio.run(service.submit(AIRLINE, [Record("r", "x")], request_id="r")))
    service.ready.set()
    _raised(lambda: asyncio.run(service.submit(_schema(name="q\udc00"), [Record("r", "x")], request_id="r")))
    assert dict(service.refused) == {"draining": 1, "not_ready": 2}
