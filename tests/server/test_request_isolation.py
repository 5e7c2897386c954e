"""One request's bytes never fail another request (issue #36, kind 1): every text that reaches the
tokenizer is checked before it is packed, on every route; a decode call that still fails is
decoded again request by request, so only the request at fault fails; no body, whatever its
bytes, numbers, depth or unicode, gets a 500; the error envelope never crashes on what it quotes;
and a crash's log never quotes request content."""

from __future__ import annotations

import asyncio
import json
import logging
import threading

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from pcd_cli.results import Record, RecordFailure  # noqa: E402
from pcd_cli.schema.load import parse_schema  # noqa: E402
from pcd_cli.server.errors import error_response  # noqa: E402
from pcd_cli.server.errors import ApiError, api_error, log_crash, printable  # noqa: E402
from pcd_cli.server.service_errors import DecodeFailed, InvalidText  # noqa: E402
from pcd_cli.server.wire import check_json, too_deep_at  # noqa: E402
from pcd_cli.job import LabelJob  # noqa: E402
from pcd_cli.server.service import LabelService  # noqa: E402

from .harness import AIRLINE, TokenizingHost, check_nothing_left, envelope, serve  # noqa: E402

Q = {"billing": {"type": "noul", "instructions": "Is this about billing or money?"}}
DEEP = "[" * 5000 + "]" * 5000
BIG = "123456789012345678901234567890"


@pytest.fixture(scope="module")
def srv():
    before = {t.ident for t in threading.enumerate()}
    with serve() as server:
        yield server
    check_nothing_left(before)


def _post(srv, path, raw: str):
    return httpx.post(srv.url + path, content=raw.encode(), headers={"content-type": "application/json"}, timeout=30)


# (route, raw JSON body, status, code, the field the message names)
BAD_BODIES = [
    ("/v1/systemone", '{"state":"charged twice \\ud83d refund","questions":%s}' % json.dumps(Q), 422, "invalid_text",
     "state:"),
    ("/v1/systemone", '{"state":{"note":["ok","\\udc00"]},"questions":%s}' % json.dumps(Q), 422, "invalid_text",
     "state.note[1]:"),
    ("/v1/systemone", '{"state":"x","questions":{"bil\\ud83dling":{"type":"noul","instructions":"x?"}}}', 422,
     "invalid_text", "questions.bil\\ud83dling: the key"),
    ("/v1/systemone", '{"state":"x","questions":{"b":{"type":"noul","instructions":"money \\ud800?"}}}', 422,
     "invalid_text", "questions.b.instructions:"),
    ("/v1/systemone", '{"state":"x","questions":{"b":{"type":"choice","criteria":{"a\\udbff":null,"b":"x"}}}}', 422,
     "invalid_text", "questions.b.criteria.a\\udbff: the key"),
    ("/v1/systemone", '{"state":"x","questions":{"b":{"type":"score","criteria":["low","hi\\ud83d"]}}}', 422,
     "invalid_text", "questions.b.criteria[1]:"),
    ("/v1/systemone", '{"state":%s,"questions":%s}' % (DEEP, json.dumps(Q)), 400, "invalid_json",
     "state: the request body nests arrays or objects too deep"),
    ("/v1/systemone", '{"state":%s,"questions":%s}' % ("[" * 100 + "]" * 100, json.dumps(Q)), 422, "too_deep",
     "state[0][0]:"),
    ("/v1/systemone", '{"state":{"n":%s},"questions":%s}' % (BIG, json.dumps(Q)), 422, "number_out_of_range",
     "state.n:"),
    ("/v1/systemone", '{"state":{"n":1e400},"questions":%s}' % json.dumps(Q), 422, "number_out_of_range", "state.n:"),
    ("/v1/decisions", '{"input":"refund \\ud83d","questions":[]}', 422, "invalid_text", "input:"),
    ("/v1/decisions", '{"input":"x","questions":[{"type":"predicate","instructions":"\\udfff"}]}', 422, "invalid_text",
     "questions[0].instructions:"),
    ("/v1/label", '{"schema":"triage","records":[{"id":%s,"text":"late"}]}' % BIG, 422, "number_out_of_range",
     "records[0].id:"),
    ("/v1/label", '{"schema":"triage","records":[%s]}' % BIG, 422, "number_out_of_range", "records[0]:"),
    ("/v1/label", '{"schema":"tri\\ud83dage","records":["x"]}', 422, "invalid_text", "schema:"),
    ("/v1/label", '{"schema":"triage","records":[{"text":"x","no\\ud83dte":1}]}', 422, "invalid_text",
     "records[0].no\\ud83dte: the key"),
    ("/v1/label", '{"schema":"triage","records":%s}' % DEEP, 400, "invalid_json", "records: the request body"),
    ("/v1/decisions", '{"input":"x","questions":[{"type":"predicate","instructions":%s}]}' % DEEP, 400,
     "invalid_json", "questions: the request body"),
]


@pytest.mark.parametrize("path, raw, status, code, names", BAD_BODIES)
def test_a_bad_body_is_a_4xx_naming_the_field_never_a_500(srv, path, raw, status, code, names):
    r = _post(srv, path, raw)
    assert r.status_code == status, r.text
    err = envelope(r)
    assert err["code"] == code and names in err["message"], err


def test_a_bad_record_text_on_v1_label_stays_a_row_error(srv):
    r = _post(srv, "/v1/label", '{"schema":"triage","records":["late \\ud83d again","on time"]}')
    assert r.status_code == 200
    body = r.json()
    assert [row["row"] for row in body["rows"]] == [1]
    assert body["errors"] == [{"row": 0, "record": 0, "error": "row 0: the text has bytes that are not valid UTF-8"}]


def _service_with_a_busy_worker(host):
    """A started service whose worker is held in a decode call (so that what comes next queues
    and is packed), and the thread running that first call."""
    service = LabelService(host, {"triage": (AIRLINE, LabelJob())})
    service.start()
    assert service.ready.wait(10)
    return service


def test_the_service_fails_a_surrogate_record_alone_when_packed_with_a_good_one():
    """The check in ``LabelService.submit`` (whatever route built the records): the bad record
    becomes a failure of its own request; the good request packed in the same call is labelled."""
    gate = threading.Event()
    host = TokenizingHost(gate=gate)
    service = _service_with_a_busy_worker(host)

    async def scenario():
        blocker = asyncio.ensure_future(service.submit(AIRLINE, [Record("b", "x")], request_id="blocker"))
        await asyncio.sleep(0.2)
        good = asyncio.ensure_future(service.submit(AIRLINE, [Record("g", "charged twice")], request_id="good"))
        bad = asyncio.ensure_future(service.submit(AIRLINE, [Record("s", "charged \ud83d twice")], request_id="bad"))
        ids = asyncio.ensure_future(service.submit(AIRLINE, [Record("i\udc00", "fine text")], request_id="bad-id"))
        await asyncio.sleep(0.2)
        gate.set()
        return await asyncio.gather(blocker, good, bad, ids)

    try:
        _, good, bad, ids = asyncio.run(scenario())
    finally:
        service.close()
    assert good.results[0].id == "g" and hasattr(good.results[0], "fields")
    assert isinstance(bad.results[0], RecordFailure)
    assert "record 's': the text: holds a lone surrogate (U+D83D at character 8)" in bad.results[0].error
    assert isinstance(ids.results[0], RecordFailure) and "the id: holds a lone surrogate (U+DC00" in ids.results[0].error
    assert [[rid for rid, _ in call] for call in host.calls[1:]] == [["b"], ["g", "s", None]]  # packed together
    assert [text for _, text in host.calls[2]] == ["charged twice", None, None]  # failures carry no text


def test_a_failing_decode_call_is_retried_request_by_request():
    """A call holding three requests raises (one record makes the decoder crash): each request is
    decoded again alone; only the one holding that record gets 500."""
    gate = threading.Event()
    host = TokenizingHost(gate=gate)
    service = _service_with_a_busy_worker(host)

    async def scenario():
        blocker = asyncio.ensure_future(service.submit(AIRLINE, [Record("b", "x")], request_id="blocker"))
        await asyncio.sleep(0.2)
        jobs = [asyncio.ensure_future(service.submit(AIRLINE, [Record(f"r{i}", text)], request_id=f"q{i}"))
                for i, text in enumerate(["fine", "CRASH here", "fine too"])]
        await asyncio.sleep(0.2)
        gate.set()
        await blocker
        return await asyncio.gather(*jobs, return_exceptions=True)

    try:
        first, crashed, third = asyncio.run(scenario())
    finally:
        service.close()
    assert first.results[0].id == "r0" and third.results[0].id == "r2"
    assert isinstance(crashed, DecodeFailed) and api_error(crashed).status == 500 and crashed.code == "decode_failed"
    assert [[rid for rid, _ in call] for call in host.calls[1:]] == [["b"], ["r0", "r1", "r2"], ["r0"], ["r1"], ["r2"]]


@pytest.mark.parametrize("change, code, fragment", [
    ({"instructions": "Label \ud83d it."}, "invalid_text", "schema.instructions: holds a lone surrogate (U+D83D"),
    ({"name": "q\udc00"}, "invalid_text", "schema.name: holds a lone surrogate (U+DC00 at character 1)"),
])
def test_the_service_refuses_request_built_questions_that_are_not_unicode(change, code, fragment):
    """A schema built from a request (not a startup one) holding a lone surrogate is 422 naming
    where, before anything is compiled (whatever route built it)."""
    import dataclasses

    host = TokenizingHost()
    service = _service_with_a_busy_worker(host)
    good = parse_schema({"name": "q", "fields": {"pick": {"type": "enum", "labels": ["red", "green"],
                                                          "description": "Which colour?"}}})
    schema = dataclasses.replace(good, **change)
    try:
        with pytest.raises(InvalidText) as caught:
            asyncio.run(service.submit(schema, [Record("r", "text")], request_id="x"))
    finally:
        service.close()
    assert api_error(caught.value).status == 422 and caught.value.code == code
    assert fragment in caught.value.message
    assert host.compiled == ["airline_sentiment"]  # the startup schema only


@pytest.mark.parametrize("message", ["state \ud83d here", "key '\udc80'", "plain"])
def test_the_error_envelope_renders_whatever_text_it_quotes(message):
    response = error_response(ApiError(422, "invalid_request_error", "invalid_text", message))
    body = json.loads(response.body)
    assert body["error"]["message"] == printable(message)
    assert body["error"]["message"].encode("utf-8")


def test_check_json_accepts_the_edges_of_what_it_refuses():
    check_json({"a": [2 ** 63 - 1, -(2 ** 63), 1e308, "\U0001f600", "\ud83d\ude00"[0:0]]})
    check_json({"records": ["bad \ud83d text"]}, text_checked_by_caller=("records",))
    nested = current = []
    for _ in range(63):
        current.append([])
        current = current[0]
    check_json({"state": nested})  # 64 levels with the top object
    with pytest.raises(ApiError):
        check_json({"a": 2 ** 63})
    with pytest.raises(ApiError):
        check_json({"records": [{"te\ud83dxt": "x"}]}, text_checked_by_caller=("records",))


@pytest.mark.parametrize("body, where", [
    (b'{"questions": {"a": 1}, "state": ' + b"[" * 70 + b"]" * 70 + b"}", "state"),
    (b'{"s\\"x": "[[[[", "records": ' + b"[" * 70, "records"),  # brackets inside strings are not counted
    (b'{"a": {"b": ' + b"{" * 70, "a"),
    (b"[" * 70, "body"),
    (b'{"na\\ud83dme": ' + b"[" * 70, "na\\ud83dme"),
])
def test_too_deep_at_names_the_top_level_key(body, where):
    assert too_deep_at(body) == where


def test_a_crash_log_never_quotes_request_content(caplog):
    log = logging.getLogger("pcd.server")
    label, record = "SECRET" + "-LABEL", "SECRET" + "-RECORD"
    try:
        try:
            raise KeyError(label)
        except KeyError as inner:
            raise ValueError(f"the text {record!r} failed") from inner
    except ValueError as exc:
        with caplog.at_level(logging.ERROR, logger="pcd.server"):
            log_crash(log, "req_1: unhandled error", exc)
    text = caplog.text
    assert "req_1: unhandled error" in text and "builtins.ValueError" in text and "builtins.KeyError" in text
    assert "SECRET" not in text and "test_request_isolation.py" in text


def test_sixteen_clients_mixing_bad_and_good_requests_lose_no_good_one():
    """A load test: 16 concurrent clients, every other one sending a bad body or a bad state
    (lone surrogates, 30-digit numbers, deep nesting, a crashing record); every good request is
    answered 200."""
    host = TokenizingHost(delay=0.01)
    bad = ['{"state":"x \\ud83d","questions":%s}' % json.dumps(Q),
           '{"state":{"n":%s},"questions":%s}' % (BIG, json.dumps(Q)),
           '{"state":%s,"questions":%s}' % ("[" * 80 + "]" * 80, json.dumps(Q))]
    with serve(host) as srv:
        async def client(i: int):
            out = []
            async with httpx.AsyncClient(timeout=60) as c:
                for k in range(6):
                    if i % 2:
                        raw = bad[(i + k) % len(bad)]
                        r = await c.post(srv.url + "/v1/systemone", content=raw.encode(),
                                         headers={"content-type": "application/json"})
                        out.append(("bad", r.status_code))
                    else:
                        r = await c.post(srv.url + "/v1/systemone",
                                         json={"state": f"client {i} request {k}: refund me", "questions": Q})
                        out.append(("good", r.status_code))
                    if i % 4 == 1:
                        r = await c.post(srv.url + "/v1/label", json={"schema": "triage",
                                                                      "records": ["CRASH now", "fine"]})
                        out.append(("crash", r.status_code))
            return out

        async def run():
            return await asyncio.gather(*(client(i) for i in range(16)))

        seen = [x for per in asyncio.run(run()) for x in per]
    assert [s for kind, s in seen if kind == "good"] == [200] * 48
    assert {s for kind, s in seen if kind == "bad"} <= {400, 422} and len([1 for k, _ in seen if k == "bad"]) == 48
    assert {s for kind, s in seen if kind == "crash"} == {500}  # the crashing record's own request only
