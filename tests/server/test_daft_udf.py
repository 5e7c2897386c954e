"""Data engines against ``pcd serve`` (issue #45 kind 5): docs/serve.md's Daft example, run as
written with the real ``daft`` package (a test dependency) against a server on 127.0.0.1 over the
fake host; and a JSON ``null`` row never gets an invented probability, on every route a data
engine sends batches to: ``/v1/systemone`` (Daft's ``jev*`` envelope, 422 ``null_row`` naming
``state.rows[k]``), ``/v1/decisions`` (the same envelope as an ``input_json`` part) and
``/v1/label`` (the row's error, no row of probabilities)."""

from __future__ import annotations

import re
import threading

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")

from pcd_cli.server.app import AppConfig  # noqa: E402

from .harness import ROOT, check_nothing_left, serve  # noqa: E402
from .test_data_engine_batches import daft_body  # noqa: E402

KEY = "KEY"


@pytest.fixture
def srv():
    before = {t.ident for t in threading.enumerate()}
    with serve(app_config=AppConfig(api_keys=(KEY,))) as server:
        yield server
    check_nothing_left(before)


def post(srv, path, body):
    return httpx.post(srv.url + path, json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=30)


def doc_udf_block() -> str:
    """The ``@daft.func.batch`` example of docs/serve.md's "Data-engine batches (Daft)"."""
    text = (ROOT / "docs" / "serve.md").read_text()
    section = text[text.index("### Data-engine batches (Daft)"):text.index("### JevBench")]
    blocks = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    (block,) = [b for b in blocks if "@daft.func.batch" in b]
    return block


def test_the_documented_daft_udf_labels_a_column_and_answers_null_rows_null():
    daft = pytest.importorskip("daft")
    block = doc_udf_block()
    assert 'PCD = "http://127.0.0.1:8000"' in block
    before = {t.ident for t in threading.enumerate()}
    namespace: dict = {}
    with serve(app_config=AppConfig(api_keys=(KEY,))) as srv:
        exec(compile(block.replace("http://127.0.0.1:8000", srv.url), "docs/serve.md", "exec"), namespace)
        out = namespace["df"].to_pydict()
    # Daft keeps one event-loop thread for the process (its own, started on first use); the
    # server's threads and anything else started here must be gone
    check_nothing_left(before | {t.ident for t in threading.enumerate() if t.name == "DaftBackgroundEventLoop"})
    assert out["ticket"] == ["I was charged twice!!", None, "Thanks, all sorted."]
    p = out["p_negative"]
    assert p[1] is None and all(isinstance(x, float) and 0 < x < 1 for x in (p[0], p[2]))
    decoded = [text for call in srv.service.host.calls for _, text in call if text is not None]
    assert "I was charged twice!!" in decoded and "Thanks, all sorted." in decoded
    # and the functions the docs name are not in this Daft (the page says which Daft has them)
    with pytest.raises(ImportError):
        exec("from daft.functions import jev_prob", {})
    assert daft.__version__


@pytest.mark.parametrize("kind", ["noul", "choice", "score"])
def test_a_null_row_of_a_daft_batch_is_refused_naming_it(srv, kind):
    calls = len(srv.service.host.calls)
    r = post(srv, "/v1/systemone", {"model": "m", **daft_body(["angry!!", None, "fine"], kind)})
    assert r.status_code == 422
    error = r.json()["error"]
    assert error["code"] == "null_row" and error["message"].startswith("state.rows[1]: is null (question 'r1'")
    assert len(srv.service.host.calls) == calls  # nothing decoded


def test_a_one_row_envelope_with_a_null_or_missing_row_is_refused(srv):
    body = daft_body(["x"])
    body["state"]["rows"] = [None]
    r = post(srv, "/v1/systemone", {"model": "m", **body})
    assert r.status_code == 422 and "state.rows[0]: is null" in r.json()["error"]["message"]
    body = daft_body(["a", "b"])
    body["state"]["rows"] = ["a"]  # r1 asks about rows[1], which is not there
    r = post(srv, "/v1/systemone", {"model": "m", **body})
    assert r.status_code == 422 and "state.rows[1]: no such row" in r.json()["error"]["message"]


def test_rows_that_are_values_are_answered(srv):
    r = post(srv, "/v1/systemone", {"model": "m", **daft_body(["angry!!", 0, {"name": "Hans"}, False])})
    assert r.status_code == 200 and sorted(r.json()["answers"]) == ["r0", "r1", "r2", "r3"]


def test_a_null_row_sent_to_decisions_as_input_json_is_refused(srv):
    body = daft_body(["angry!!", None])
    questions = [{"type": "predicate", "name": k, "instructions": q["instructions"]} for k, q in body["questions"].items()]
    r = post(srv, "/v1/decisions", {"model": "m", "questions": questions, "input": [
        {"role": "user", "content": [{"type": "input_json", "data": body["state"]}]}]})
    assert r.status_code == 422
    assert r.json()["error"]["message"].startswith("input[0].content[0].data.rows[1]: is null")


def test_a_null_record_of_a_label_batch_is_its_rows_error(srv):
    r = post(srv, "/v1/label", {"schema": "triage", "records": [None, "fine", {"text": None}]})
    assert r.status_code == 200
    body = r.json()
    assert [row["row"] for row in body["rows"]] == [1]
    assert body["errors"] == [{"row": 0, "record": 0, "error": "row 0: the record is null; give a text or an object"},
                              {"row": 2, "record": 2, "error": "row 2: text field 'text' is missing or null"}]


@pytest.mark.full  # 30-100 s on a shared CPU: pcd serve loads and compiles the embedded model
def test_the_documented_daft_udf_against_pcd_serve_on_the_embedded_model(tmp_path):
    """The same block against the real ``pcd serve`` command on 127.0.0.1 (a free port), stopped
    by its pid with SIGTERM."""
    import signal
    import socket
    import subprocess
    import sys
    import time
    from pathlib import Path

    daft = pytest.importorskip("daft")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen([str(Path(sys.executable).with_name("pcd")), "serve", "--schema",
                             f"triage={ROOT / 'schemas' / 'airline_sentiment.yaml'}", "--port", str(port),
                             "--api-key", KEY], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            time.sleep(0.5)
        namespace: dict = {}
        exec(compile(doc_udf_block().replace("http://127.0.0.1:8000", url), "docs/serve.md", "exec"), namespace)
        p = namespace["df"].to_pydict()["p_negative"]
        assert p[1] is None and all(isinstance(x, float) and 0 < x < 1 for x in (p[0], p[2]))
        for text, got in ((namespace["df"].to_pydict()["ticket"][i], p[i]) for i in (0, 2)):  # as one record alone
            alone = httpx.post(url + "/v1/label", json={"schema": "triage", "records": [text], "all_probs": True},
                               headers={"Authorization": f"Bearer {KEY}"}, timeout=100).json()["rows"][0]
            assert got == pytest.approx(alone["sentiment__probs"]["NEGATIVE"], abs=1e-5)
        assert daft.__version__
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        log.close()
