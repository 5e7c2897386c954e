"""Deadlines that fit the client, and no head-of-line blocking (issue #45, kind 4).

* A 503 ``deadline_exceeded`` counts the records really decoded (results delivered), never the
  ones taken into a decode call still running; that call is abandoned before its next forward
  pass, so nothing is decoded (or counted in ``pcd_records_total``) after the answer.
* ``--max-records-per-request`` is one rule on every route: 413 where the client can split
  (``/v1/label``), slices of that many tasks under one deadline on Label Studio's ``/predict``.
* The default deadline fits Label Studio's 100 s wait.
* One long record never starves the others: its passes interleave with other requests' chunks.
* With ``--max-queued-requests 1`` a request whose question set compiles does not take the only
  slot of a served schema's request: compiling is not queueing.

The fake host's records cost forward passes (``FakeHost(pass_s=..., pass_chars=...)``) and call
the worker's ``between_passes`` before each, as ``Decoder`` does.
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from pcd_cli.server import limits  # noqa: E402
from pcd_cli.server.app import AppConfig  # noqa: E402
from pcd_cli.server.label_studio import LabelStudioConfig  # noqa: E402
from pcd_cli.server.service import ServiceConfig  # noqa: E402

from .harness import CASES, ROOT, TokenizingHost, envelope, no_leftovers, port_of, serve  # noqa: E402,F401

pytestmark = pytest.mark.usefixtures("no_leftovers")

BODIES = json.loads((Path(__file__).parent / "cases" / "label_studio" / "bodies.json").read_text())
TWEETS = [json.loads(line)["text"] for line in (ROOT / "sample_data" / "airline_tweets.dev.jsonl").open()][:48]


def _ls(tmp_path, **app):
    return AppConfig(label_studio=LabelStudioConfig(state_dir=str(tmp_path / "state")), **app)


def _predict_body(texts):
    body = json.loads(json.dumps(BODIES["predict"]))
    task = body["tasks"][0]
    body["tasks"] = [{**task, "id": i + 1, "data": {**task["data"], "text": t}} for i, t in enumerate(texts)]
    return body


def _records_total(srv) -> float:
    text = httpx.get(srv.url + "/metrics", timeout=5).text
    return float(re.search(r"^pcd_records_total (\S+)", text, re.M).group(1))


def test_the_503_counts_the_records_really_decoded_and_nothing_is_decoded_after_it():
    """24 records in chunks of 4 (each chunk 0.4 s of passes), deadline 1 s: two chunks are done
    when the answer comes; the third, in flight, is abandoned at its next pass."""
    host = TokenizingHost(pass_s=0.1)
    cfg = ServiceConfig(request_timeout_s=1.0, chunk_records=4)
    with serve(host, config=cfg, app_config=AppConfig(request_timeout_s=1.0)) as srv:
        before = _records_total(srv)
        t = time.monotonic()
        r = httpx.post(srv.url + "/v1/label", json={"schema": "triage", "records": TWEETS[:24]}, timeout=10)
        took = time.monotonic() - t
        at_answer, finished = _records_total(srv), len(host.finished)
        time.sleep(0.8)  # the call in flight reaches its next pass
        later, finished_later = _records_total(srv), len(host.finished)
    error = envelope(r)
    assert r.status_code == 503 and error["code"] == "deadline_exceeded"
    assert 0.9 <= took < 1.4
    decoded = at_answer - before
    assert decoded == 8 and "(8 of 24 records decoded" in error["message"], error["message"]
    assert "records fit in 1 s" in error["message"]  # sized by the measured rate
    assert later == at_answer and finished_later == finished  # nothing decoded after the answer
    assert finished == 2 and len(host.calls) == 2 + 3  # two warm-ups; the third call began and was abandoned


def test_max_records_per_request_is_413_on_v1_label_and_slices_on_label_studio_predict(tmp_path):
    host = TokenizingHost()
    with serve(host, app_config=_ls(tmp_path, max_records_per_request=4)) as srv:
        refused = httpx.post(srv.url + "/v1/label", json={"schema": "triage", "records": TWEETS[:10]}, timeout=10)
        calls_before = len(host.calls)
        r = httpx.post(srv.url + "/predict", json=_predict_body(TWEETS[:10]), timeout=10)
        calls = host.calls[calls_before:]
    assert refused.status_code == 413 and envelope(refused)["code"] == "too_many_records"
    assert "at most 4 (--max-records-per-request)" in envelope(refused)["message"]
    assert r.status_code == 200
    results = r.json()["results"]
    assert len(results) == 10 and all(x["result"] for x in results)
    assert [len(c) for c in calls] == [4, 4, 2]  # queued 4 at a time, in order
    assert [t for c in calls for _, t in c] == TWEETS[:10]


def test_label_studio_predict_past_its_deadline_counts_the_tasks_of_every_slice(tmp_path):
    """12 tasks in slices of 4 (0.4 s each), deadline 1 s: slices 1 and 2 done, the third abandoned."""
    host = TokenizingHost(pass_s=0.1)
    cfg = ServiceConfig(request_timeout_s=1.0)
    with serve(host, config=cfg, app_config=_ls(tmp_path, max_records_per_request=4, request_timeout_s=1.0)) as srv:
        before = _records_total(srv)
        r = httpx.post(srv.url + "/predict", json=_predict_body(TWEETS[:12]), timeout=10)
        at_answer = _records_total(srv)
        time.sleep(0.6)
        later = _records_total(srv)
    error = envelope(r)
    assert r.status_code == 503 and error["code"] == "deadline_exceeded"
    assert "(8 of 12 tasks decoded" in error["message"] and "tasks fit in 1 s" in error["message"], error["message"]
    assert at_answer - before == 8 and later == at_answer


def test_the_default_deadline_fits_label_studio_predict_wait():
    """Label Studio waits 100 s for /predict; pcd's default deadline answers before that (its own
    503 saying how many tasks fit), and not much earlier."""
    assert limits.LABEL_STUDIO_PREDICT_WAIT_S == 100.0
    assert 60 < limits.REQUEST_TIMEOUT_S < limits.LABEL_STUDIO_PREDICT_WAIT_S
    assert AppConfig().request_timeout_s == ServiceConfig().request_timeout_s == limits.REQUEST_TIMEOUT_S


def test_a_long_record_does_not_starve_short_requests():
    """A 6,000-character record is 60 passes of 0.05 s (3 s); short one-record requests sent while
    it runs are each answered within 1 s, between its passes (without interleaving each waited
    for the rest of the long record's 3 s);
    the long one is answered too, with what it gets alone."""
    host = TokenizingHost(pass_s=0.05, pass_chars=100)
    long_text = ("My bag was lost on the flight from Denver and nobody at the desk would help. " * 80)[:6000]
    with serve(host, config=ServiceConfig(request_timeout_s=10), app_config=AppConfig(request_timeout_s=10)) as srv:
        out = {}

        def long_request():
            t = time.monotonic()
            out["long"] = httpx.post(srv.url + "/v1/label", json={"schema": "triage", "records": [long_text]},
                                     timeout=20)
            out["long_s"] = time.monotonic() - t

        thread = threading.Thread(target=long_request)
        thread.start()
        assert host.entered.wait(5)
        time.sleep(0.3)
        short = []
        for text in TWEETS[:4]:
            t = time.monotonic()
            r = httpx.post(srv.url + "/v1/label", json={"schema": "triage", "records": [text]}, timeout=20)
            short.append((r.status_code, time.monotonic() - t))
        long_running = thread.is_alive()
        thread.join(20)
        alone = httpx.post(srv.url + "/v1/label", json={"schema": "triage", "records": [long_text]}, timeout=20)
    assert [s for s, _ in short] == [200] * 4
    assert max(s for _, s in short) < 1.0, short
    assert long_running  # the short ones were answered while the long record was still decoding
    assert out["long"].status_code == 200 and 2.9 <= out["long_s"] < 10
    assert out["long"].json()["rows"] == alone.json()["rows"]


def test_a_long_record_past_its_deadline_stops_at_its_next_pass():
    host = TokenizingHost(pass_s=0.1, pass_chars=200)
    long_text = "The flight was delayed again and again. " * 150  # 6,000 characters: 30 passes
    with serve(host, config=ServiceConfig(request_timeout_s=1.0), app_config=AppConfig(request_timeout_s=1.0)) as srv:
        t = time.monotonic()
        r = httpx.post(srv.url + "/v1/label", json={"schema": "triage", "records": [long_text]}, timeout=10)
        took = time.monotonic() - t
        time.sleep(0.3)
        finished = [c for c in host.finished if any(t == long_text for _, t in c)]
    assert r.status_code == 503 and "(0 of 1 records decoded" in envelope(r)["message"]
    assert took < 1.4 and finished == []


def test_compiling_is_not_queueing_with_one_queue_slot():
    """--max-queued-requests 1: a question set compiling for 1.5 s does not take the only slot; a
    request for a served schema sent meanwhile is answered 200, and a second new question set is
    429 (the compiling requests' own bound)."""
    from .test_deadlines import _choice

    host = TokenizingHost(compile_s=1.5)
    cfg = ServiceConfig(max_queued_requests=1)
    with serve(host, config=cfg) as srv:
        out = {}
        thread = threading.Thread(target=lambda: out.setdefault(
            "big", httpx.post(srv.url + "/v1/systemone", json=_choice("alpha", 4), timeout=10)))
        thread.start()
        assert host.compile_started.wait(5)
        served = httpx.post(srv.url + "/v1/label", json={"schema": "triage", "records": ["late again"]}, timeout=10)
        other = httpx.post(srv.url + "/v1/systemone", json=_choice("beta", 5), timeout=10)
        thread.join(10)
    assert served.status_code == 200
    assert other.status_code == 429 and "waiting for their questions to compile" in envelope(other)["message"]
    assert out["big"].status_code == 200


@pytest.mark.full  # 20 s: the case waits 15 s for pcd_records_total to settle; the fast tests above hold the kind
def test_replayed_case_ls_predict_batch_past_deadline(tmp_path):
    """The handed case, unchanged: 48 tasks, --request-timeout-s 5, --max-records-per-request 16,
    each task 0.25 s of passes: 503 counting the 16 decoded tasks, nothing decoded after it."""
    import subprocess
    import sys

    host = TokenizingHost(pass_s=0.25)
    state = tmp_path / "state"
    with serve(host, config=ServiceConfig(request_timeout_s=5),
               app_config=_ls(tmp_path, request_timeout_s=5, max_records_per_request=16)) as srv:
        done = subprocess.run([sys.executable, str(CASES / "ls-predict-batch-past-deadline.py"), str(port_of(srv)),
                               str(state)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "/predict 48 tasks: 503" in done.stdout and "16 by the answer, 16 in all" in done.stdout, done.stdout
