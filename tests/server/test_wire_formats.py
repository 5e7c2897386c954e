"""The Jev / System One and OpenAI Decisions wire formats (issue #27 item 3): the translation of a
question set into a pcd schema, and both official clients (``typesafe-sdk``, ``openai``) against
the app served by uvicorn on 127.0.0.1."""

from __future__ import annotations

import json
import socket
import threading
import time

import numpy as np
import openai  # the official clients are test dependencies (pyproject's test extra): never skipped
import pytest
import typesafe_sdk
import yaml

starlette = pytest.importorskip("starlette")  # the server extra
uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

from pcd_cli.results import FieldResult  # noqa: E402
from pcd_cli.schema.load import load_schema  # noqa: E402
from pcd_cli.server.formats import decisions as D  # noqa: E402
from pcd_cli.server.formats import jev as J  # noqa: E402
from pcd_cli import questions as Q  # noqa: E402
from pcd_cli.server.errors import ApiError  # noqa: E402
from pcd_cli.server.errors import api_error  # noqa: E402

#: What a request is refused with: the wire layer's ApiError, or the decision domain's own
#: QuestionError (answered by its code: api_error gives the status the client sees).
REFUSED = (ApiError, Q.QuestionError)

from .fakes import FakeHost  # noqa: E402


# -- the translation ------------------------------------------------------------------------------

def jev_qs(questions: dict, state="text"):
    qs, text, extras = J.parse_request({"model": "jev-latest", "state": state, "questions": questions})
    return qs, text


def test_question_set_becomes_the_schema_a_file_would_hold(tmp_path):
    questions = {
        "billing": {"type": "noul", "instructions": "Is this about billing", "criteria": {"false": "Anything else"}},
        "tone": {"type": "choice", "instructions": {"task": "tone", "of": "the message"},
                 "criteria": {"calm": "A  neutral\nmessage", "angry": None, "excited": ["eager", "happy"]}},
        "urgency": {"type": "score", "criteria": ["Can wait", "This week?", {"when": "today"}]},
    }
    qs, _ = jev_qs(questions)
    # another state, the same questions: the same schema (the service shares one decoder by its sha256)
    assert jev_qs(questions, state="another ticket")[0].schema.source_sha256 == qs.schema.source_sha256
    assert qs.names == ("billing", "tone", "urgency")
    assert qs.data["fields"] == {
        "billing": {"type": "boolean", "description": "Is this about billing. false: Anything else."},
        "tone": {"type": "enum", "labels": ["calm", "angry", "excited"],
                 "description": '{"task": "tone", "of": "the message"}. "calm": A neutral message. '
                                '"excited": ["eager", "happy"].'},
        "urgency": {"type": "ordinal", "labels": ["0", "1", "2"],
                    "description": '"0": Can wait. "1": This week? "2": {"when": "today"}.'},
    }
    assert [f.type for f in qs.schema.fields] == ["boolean", "enum", "ordinal"]
    # the same dict as a YAML schema file is the same schema (same sha256, so the same decoder)
    path = tmp_path / "questions.yaml"
    path.write_text(yaml.safe_dump(qs.data, sort_keys=False, allow_unicode=True))
    assert load_schema(path).source_sha256 == qs.schema.source_sha256
    # request order is field order, whatever the keys sort to
    qs2, _ = jev_qs({"z": {"type": "noul", "instructions": "z?"}, "a": {"type": "noul", "instructions": "a?"}})
    assert [f.name for f in qs2.schema.fields] == ["z", "a"]


def test_field_names_keep_keys_and_rename_only_what_pcd_refuses():
    assert Q.field_names(["tone", "tone__prob", "", "  ", "__truncated", None, "q1"]) == \
        ("tone", "q2", "q3", "q4", "q5", "q6", "q1")
    assert Q.field_names(["", "q1"]) == ("q1_", "q1")  # a fallback never takes a key
    assert Q.field_names(["", "q1__prob"]) == ("q1_", "q1__prob")  # nor makes a key its output column
    qs, _ = jev_qs({"": {"type": "noul", "instructions": "empty key"}, "a": {"type": "noul", "instructions": "x"},
                    "a__probs": {"type": "noul", "instructions": "y"}})
    assert [f.name for f in qs.schema.fields] == ["q1", "a", "q3"]
    assert [q.key for q in qs.questions] == ["", "a", "a__probs"]  # answers map back by position


def test_state_text_keeps_strings_and_json_key_order():
    assert Q.state_text("  I was charged twice.\n") == "I was charged twice."
    assert Q.state_text({"subject": "Refund", "body": {"z": 1, "a": [2, "é"]}}) == \
        '{"subject": "Refund", "body": {"z": 1, "a": [2, "é"]}}'
    assert Q.state_text([{"b": 1, "a": 2}, "x"]) == '[{"b": 1, "a": 2}, "x"]'
    for bad, why in ((None, "got missing"), (7, "got a number"), ("  ", "is empty")):
        with pytest.raises(REFUSED) as info:
            Q.state_text(bad)
        assert api_error(info.value).status == 422 and why in info.value.message


def test_limits_255_options_and_2_to_10_levels():
    labels = [f"CAT_{i:03d}_&_x" for i in range(255)]
    qs, _ = jev_qs({"cat": {"type": "choice", "criteria": {k: None for k in labels}}})
    assert qs.schema.fields[0].labels == tuple(labels)
    with pytest.raises(REFUSED) as info:
        jev_qs({"cat": {"type": "choice", "criteria": {k: None for k in labels + ["one_more"]}}})
    assert (api_error(info.value).status, info.value.code) == (422, "invalid_request")
    assert "question 'cat': 256 options; a choice may have at most 255 options" in info.value.message
    with pytest.raises(REFUSED) as info:
        jev_qs({"cat": {"type": "choice", "criteria": {"only": None}}})
    assert api_error(info.value).status == 422 and "a choice needs at least 2 options, got 1" in info.value.message
    for n in (2, 10):
        qs, _ = jev_qs({"s": {"type": "score", "criteria": [f"level {i}" for i in range(n)]}})
        assert qs.schema.fields[0].labels == tuple(str(i) for i in range(n))
    with pytest.raises(REFUSED) as info:
        jev_qs({"s": {"type": "score", "criteria": ["one"]}})
    assert api_error(info.value).status == 422 and "2 to 10 levels, got 1" in info.value.message
    with pytest.raises(REFUSED) as info:
        jev_qs({"s": {"type": "score", "criteria": [str(i) for i in range(11)]}})
    assert (api_error(info.value).status, info.value.code) == (422, "invalid_request")
    assert "11 levels; a score may have at most 10 levels" in info.value.message
    for empty in ("", "  \n"):  # empty instructions: 422, as the Jev contract validates them
        with pytest.raises(REFUSED) as info:
            jev_qs({"q": {"type": "noul", "instructions": empty}})
        assert (api_error(info.value).status, info.value.code) == (422, "invalid_request")
        assert "questions.q.instructions: is empty" in info.value.message
    # a 255-option first question prepares every later question after each of its answers: 255 × 16 at most
    big = {"type": "choice", "criteria": dict.fromkeys(labels)}
    nouls = {f"n{i}": {"type": "noul", "instructions": f"{i}?"} for i in range(8)}  # 16 options
    assert len(jev_qs({"cat": big, **nouls})[0].schema.fields) == 9
    assert len(jev_qs({**nouls, "cat": big, "cat2": big})[0].schema.fields) == 10  # a yes/no first: 2 × 526
    with pytest.raises(REFUSED) as info:
        jev_qs({"cat": big, **nouls, "one_more": {"type": "noul", "instructions": "?"}})
    assert (api_error(info.value).status, info.value.code) == (413, "too_many_options")
    assert "has 255 options and the later ones 18 in all" in info.value.message
    assert "255 × 18 = 4590, at most 4096" in info.value.message
    with pytest.raises(REFUSED) as info:
        J.parse_request({"state": "x", "questions": {f"q{i}": {"type": "noul", "instructions": "?"} for i in range(5)}},
                        max_questions=4)
    assert (api_error(info.value).status, info.value.code) == (413, "too_many_questions")


@pytest.mark.parametrize("body, status, fragment", [
    ({"model": 3, "state": "x", "questions": {"a": {"type": "noul", "instructions": "?"}}}, 422, "model: must be a string"),
    ({"state": "x", "questions": {"a": {"type": "box", "instructions": "dog"}}}, 422, "type 'box' locates"),
    ({"state": "x", "questions": {"a": {"type": "noul"}}}, 422, "neither instructions nor criteria"),
    ({"state": "x", "questions": {"a": {"type": "noul", "instructions": "?", "criteria": {"maybe": "x"}}}}, 422,
     "unknown key 'maybe'"),
    ({"state": "x", "questions": {"a": {"type": "choice", "criteria": {"x": 5, "y": None}}}}, 422,
     "questions.a.criteria.x: must be a string, an object or an array"),
    ({"state": "x", "questions": {"a": {"type": "choice", "criteria": {"yes": None, "yes ": None}}}}, 422,
     "differ only by surrounding whitespace"),
    ({"state": "x", "questions": {}}, 422, "questions: must be a non-empty object"),
    ({"state": "x", "assets": {"<image:1>": {}}, "questions": {"a": {"type": "noul", "instructions": "?"}}}, 422,
     "assets: images are not supported"),
    ({"state": 5, "questions": {"a": {"type": "noul", "instructions": "?"}}}, 422, "state: must be a string"),
    ({"state": "x", "pcd_extras": "yes", "questions": {"a": {"type": "noul", "instructions": "?"}}}, 422,
     "pcd_extras: must be true or false"),
])
def test_jev_bad_requests_name_what_is_wrong(body, status, fragment):
    with pytest.raises(REFUSED) as info:
        J.parse_request(body)
    assert api_error(info.value).status == status and fragment in info.value.message


def test_confidence_and_score_formulas():
    assert Q.choice_confidence((0.7, 0.2, 0.1)) == pytest.approx(0.55)  # (3*0.7 - 1) / 2
    assert Q.choice_confidence((0.5, 0.5)) == 0.0 and Q.choice_confidence((1.0, 0.0, 0.0)) == 1.0
    assert Q.expected_score((0.1, 0.2, 0.7)) == pytest.approx(1.6)  # 0*0.1 + 1*0.2 + 2*0.7
    # Var = 0.1*1.6² + 0.2*0.6² + 0.7*0.4² = 0.44; Var_max = (3-1)²/4 = 1
    assert Q.score_confidence((0.1, 0.2, 0.7)) == pytest.approx(0.56)
    assert Q.score_confidence((0.5, 0.0, 0.0, 0.5)) == pytest.approx(0.0)  # split between the ends
    assert Q.score_confidence((0.0, 1.0, 0.0)) == pytest.approx(1.0)
    qs, _ = jev_qs({"tone": {"type": "choice", "criteria": {"calm": None, "angry": None, "excited": None}},
                    "u": {"type": "score", "criteria": ["a", "b", "c"]}, "b": {"type": "noul", "instructions": "?"}})
    # values exact in float32 (answers carry the float32 probabilities pcd label writes)
    fields = (FieldResult(0, "calm", 0.625, 0.875, (0.625, 0.25, 0.125)),
              FieldResult(2, "2", 0.625, 0.75, (0.125, 0.25, 0.625), raw_probs=(0.25, 0.25, 0.5)),
              FieldResult(1, False, 0.75, 0.95, (0.25, 0.75)))
    tone, u, b = Q.answers(qs, fields)
    assert J.render_answer(tone) == {"type": "choice", "choice": "calm", "confidence": 0.4375,  # (3*0.625-1)/2
                                     "probabilities": {"calm": 0.625, "angry": 0.25, "excited": 0.125}}
    # score 0*0.125 + 1*0.25 + 2*0.625 = 1.5; Var = 0.125*2.25 + 0.25*0.25 + 0.625*0.25 = 0.5; 1 - 0.5/1
    assert J.render_answer(u, ("a", "b", "c")) == {
        "type": "score", "score": 1.5, "confidence": 0.5,
        "legend": {"0": "a", "1": "b", "2": "c"}, "probabilities": {"0": 0.125, "1": 0.25, "2": 0.625}}
    assert J.render_answer(b) == {"type": "noul", "noul": 0.25}
    assert J.render_answer(u, ("a", "b", "c"), extras=True)["pcd"] == {
        "mass": 0.75, "raw_probabilities": {"0": 0.25, "1": 0.25, "2": 0.5}}
    assert Q.answers(qs, (FieldResult(0, "calm", 0.7, 0.9, (0.7, 0.2, 0.1)),) + fields[1:])[0].probs == \
        (float(np.float32(0.7)), float(np.float32(0.2)), float(np.float32(0.1)))


def test_decisions_input_and_questions_share_the_translation():
    assert D.input_text("  hello ") == "hello"
    assert D.input_text([{"role": "user", "content": "only the user"}]) == "only the user"
    assert D.input_text([
        {"type": "message", "role": "system", "content": "Triage tickets."},
        {"role": "user", "content": [{"type": "input_text", "text": "Charged twice"},
                                     {"type": "input_json", "data": {"z": 1, "a": 2}}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Noted."}]},
    ]) == 'system: Triage tickets.\n\nuser: Charged twice\n{"z": 1, "a": 2}\n\nassistant: Noted.'
    for bad, fragment in (([{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}],
                           '"function_call" is not supported'),
                          ([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}],
                           "images are not supported"),
                          ([{"role": "robot", "content": "x"}], "input[0].role: must be one of")):
        with pytest.raises(REFUSED) as info:
            D.input_text(bad)
        assert api_error(info.value).status == 422 and fragment in info.value.message
    body = {"model": "gpt-6-luna", "input": "I was charged twice.", "questions": [
        {"type": "predicate", "instructions": "Is this about billing?", "name": "billing"},
        {"type": "choice", "instructions": "Tone?", "name": "tone",
         "choices": [{"value": "calm", "description": "A neutral message"}, {"value": "angry"}]},
        {"type": "score", "instructions": [{"type": "input_text", "text": "How urgent?"}], "name": "urgency",
         "levels": [{"label": "Can wait"}, {"label": "This week"}, {"label": "Today"}]}]}
    qs, values, text, extras = D.parse_request(body)
    jqs, jtext = jev_qs({"billing": {"type": "noul", "instructions": "Is this about billing?"},
                         "tone": {"type": "choice", "instructions": "Tone?",
                                  "criteria": {"calm": "A neutral message", "angry": None}},
                         "urgency": {"type": "score", "instructions": "How urgent?",
                                     "criteria": ["Can wait", "This week", "Today"]}}, state="I was charged twice.")
    assert (qs.data, text) == (jqs.data, jtext)  # the same questions: the same schema and record
    assert values == [(), ("calm", "angry"), ("Can wait", "This week", "Today")]
    unnamed, values, _, _ = D.parse_request({"input": "x", "questions": [
        {"type": "choice", "instructions": "?", "choices": [{"value": True}, {"value": "maybe"}, {"value": False}]}]})
    assert unnamed.names == ("q1",) and unnamed.schema.fields[0].labels == ("true", "maybe", "false")
    assert values == [(True, "maybe", False)]
    for questions, fragment in (
            ([{"type": "choice", "instructions": "?", "choices": [{"value": True}, {"value": "true"}]}],
             "repeats (or reads the same as) choices[0]"),
            ([{"type": "predicate", "instructions": "?", "name": "a"}, {"type": "predicate", "instructions": "?",
                                                                        "name": "a"}], "the name 'a' is given"),
            ([{"type": "predicate", "name": "a"}], "questions[0] ('a').instructions: required")):
        with pytest.raises(REFUSED) as info:
            D.parse_request({"input": "x", "questions": questions})
        assert api_error(info.value).status == 422 and fragment in info.value.message


# -- both official clients against the served app --------------------------------------------------

class Served:
    """``app`` served by uvicorn in a thread on 127.0.0.1, on a port the OS picked."""

    def __init__(self, app):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, name="test-uvicorn")
        self.thread.start()
        end = time.monotonic() + 10
        while not self.server.started and time.monotonic() < end:
            time.sleep(0.01)
        assert self.server.started
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self):
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


KEY = "test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


def _serve(backend, schemas=None):
    """The real app (``create_app``, API key required) over a started ``LabelService``."""
    from pcd_cli.server.app import AppConfig, create_app
    from pcd_cli.server.service import LabelService, ModelHost

    service = LabelService(ModelHost(loaded=backend), schemas)
    service.start()
    assert service.ready.wait(60), service.startup_error
    return service, Served(create_app(service, AppConfig(api_keys=(KEY,))))


@pytest.fixture(scope="module")
def server(tiny_chat_backend):
    before = set(threading.enumerate())
    service, served = _serve(tiny_chat_backend)
    yield served
    served.stop()
    service.close()
    left = [t.name for t in set(threading.enumerate()) - before if t.is_alive()]
    assert not left, f"threads left running: {left}"


QUESTIONS = {
    "billing": typesafe_sdk.Noul(instructions="Is this about billing?"),
    "tone": typesafe_sdk.Choice(instructions="What is the tone?",
                                criteria={"calm": "A neutral message", "angry": None, "excited": None}),
    "urgency": typesafe_sdk.Score(instructions="How urgent is it?", criteria=["Can wait", "This week", "Today"]),
}


def test_typesafe_client_round_trip(server):
    state = {"subject": "Duplicate charge", "body": "I was charged twice. Please fix this ASAP."}
    with typesafe_sdk.TypeSafeClient(base_url=server.url, api_key=KEY) as client:
        r = client.system_one(state=state, questions=QUESTIONS, model="jev-latest")
        models = client.models.list()
    assert r.model == "tiny-random-llama"  # the loaded model, whatever the request named
    raw = r.raw_http_response.json()
    assert list(raw) == ["model", "answers", "usage"]
    assert list(raw["answers"]) == ["billing", "tone", "urgency"]
    assert raw["usage"]["output_tokens"] == 0 and r.usage.input_tokens > 10
    assert r.request_id.startswith("req_")
    billing, tone, urgency = r.nouls["billing"], r.choices["tone"], r.scores["urgency"]
    assert list(raw["answers"]["billing"]) == ["type", "noul"] and 0.0 < billing.noul < 1.0
    assert list(tone.probabilities) == ["calm", "angry", "excited"]
    assert sum(tone.probabilities.values()) == pytest.approx(1.0, abs=1e-5)
    assert tone.choice == max(tone.probabilities, key=tone.probabilities.get)
    assert tone.confidence == pytest.approx((3 * max(tone.probabilities.values()) - 1) / 2)
    assert urgency.legend == {0: "Can wait", 1: "This week", 2: "Today"}
    assert urgency.score == pytest.approx(sum(i * p for i, p in urgency.probabilities.items()))
    assert 0.0 <= urgency.confidence <= 1.0
    # every answer number is a JSON float, even a round one
    text = r.raw_http_response.text
    for value in (raw["answers"]["billing"]["noul"], raw["answers"]["tone"]["confidence"]):
        assert isinstance(value, float)
    assert '"output_tokens":0' in text.replace(" ", "")
    assert [(m.name, len(m.release_date)) for m in models.models] == [("tiny-random-llama", 10)]
    assert models.request_id.startswith("req_")


def test_typesafe_client_errors(server):
    from typesafe_sdk import RetryPolicy, SystemOneResponse, TypeSafeAPIError, TypeSafeBadRequestError, \
        TypeSafeUnprocessableEntityError

    with typesafe_sdk.TypeSafeClient(base_url=server.url, api_key=KEY, retry=RetryPolicy(max_retries=0)) as client:
        with pytest.raises(TypeSafeUnprocessableEntityError) as info:
            client.system_one(state="x", questions=QUESTIONS, model=7)
        assert "model: must be a string" in str(info.value) and info.value.request_id.startswith("req_")
        assert info.value.body["error"]["code"] == "invalid_model"
        with pytest.raises(TypeSafeAPIError) as info:
            client.system_one(state="x", questions={"cat": typesafe_sdk.Choice(
                criteria={f"c{i}": None for i in range(256)})})
        assert info.value.status == 422 and "at most 255 options" in str(info.value)  # the contract: 422, not 413
        # a malformed body, parsed by the client's own response handling
        raw = client._http_client.post(server.url + "/v1/systemone", content=b'{"state": "x",',
                                       headers={"Content-Type": "application/json", **AUTH})
        with pytest.raises(TypeSafeBadRequestError) as info:
            SystemOneResponse.from_http_response(raw)
        assert info.value.body["error"]["code"] == "invalid_json"


def test_typesafe_255_options_and_extras(server):
    labels = [f"CAT_{i:03d}" for i in range(255)]
    with typesafe_sdk.TypeSafeClient(base_url=server.url, api_key=KEY) as client:
        r = client.system_one(state="Frozen fish fillets, 20 kg", questions={
            "cat": typesafe_sdk.Choice(criteria=dict.fromkeys(labels))}, extra_body={"pcd_extras": True})
    cat = r.choices["cat"]
    assert list(cat.probabilities) == labels
    assert sum(cat.probabilities.values()) == pytest.approx(1.0, abs=1e-4)
    raw = r.raw_http_response.json()
    extras = raw["answers"]["cat"]["pcd"]
    assert 0.0 < extras["mass"] <= 1.0 and list(extras["raw_probabilities"]) == labels
    assert raw["pcd"]["prompt"] == "isolated" and raw["pcd"]["truncated"] is False
    assert raw["pcd"]["decoded_questions"] == 1 and len(raw["pcd"]["schema_sha256"]) == 1


def test_zstd_body_is_read(server):
    import httpx
    import zstandard

    body = json.dumps({"model": "m", "state": "hello " * 300, "questions": {"a": {"type": "noul",
                                                                                 "instructions": "Greeting?"}}})
    plain = httpx.post(server.url + "/v1/systemone", content=body.encode(), headers=AUTH, timeout=30)
    packed = httpx.post(server.url + "/v1/systemone", content=zstandard.ZstdCompressor().compress(body.encode()),
                        headers={"Content-Encoding": "zstd", "Content-Type": "application/json", **AUTH}, timeout=30)
    assert plain.status_code == packed.status_code == 200
    assert packed.json()["answers"] == plain.json()["answers"]
    # 9 MiB of spaces packs into a few hundred bytes: refused once the unpacked size passes 8 MiB
    bomb = zstandard.ZstdCompressor().compress(b'{"state": "' + b" " * (9 << 20) + b'"}')
    assert len(bomb) < 4096
    refused = httpx.post(server.url + "/v1/systemone", content=bomb, timeout=30,
                         headers={"Content-Encoding": "zstd", "Content-Type": "application/json", **AUTH})
    assert refused.status_code == 413 and refused.json()["error"]["code"] == "body_too_large"


def test_openai_client_round_trip_matches_jev(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
    questions = [
        {"type": "predicate", "instructions": "Is this about billing?", "name": "billing"},
        {"type": "choice", "instructions": "What is the tone?", "name": "tone",
         "choices": [{"value": "calm", "description": "A neutral message"}, {"value": "angry"},
                     {"value": "excited"}]},
        {"type": "score", "instructions": "How urgent is it?", "name": "urgency",
         "levels": [{"label": "Can wait"}, {"label": "This week"}, {"label": "Today"}]},
        {"type": "choice", "instructions": "Refund asked?", "choices": [{"value": True}, {"value": False}]},
    ]
    text = "I was charged twice. Please fix this ASAP."
    d = client.decisions.create(model="gpt-6-luna", input=text, questions=questions)
    assert d.model == "tiny-random-llama"
    assert [a.type for a in d.answers] == ["predicate", "choice", "score", "choice"]
    assert [a.name for a in d.answers] == ["billing", "tone", "urgency", None]
    billing, tone, urgency, refund = d.answers
    assert [p.value for p in tone.probabilities] == ["calm", "angry", "excited"]
    assert [p.value for p in refund.probabilities] == [True, False] and isinstance(refund.choice, bool)
    assert [(p.value, p.label) for p in urgency.probabilities] == [(0, "Can wait"), (1, "This week"), (2, "Today")]
    assert urgency.score == pytest.approx(sum(p.value * p.probability for p in urgency.probabilities))
    assert d.usage.output_tokens == 0 and d.usage.total_tokens == d.usage.input_tokens > 5
    extra = client.decisions.create(model="m", input=text, questions=questions[3:], extra_body={"pcd_extras": True})
    alone = extra.answers[0]  # no calibration or prior correction: the raw probabilities are the answer's
    assert extra.answers[0].model_extra["pcd"]["raw_probabilities"] == {
        "true": alone.probabilities[0].probability, "false": alone.probabilities[1].probability}
    assert 0.0 < alone.model_extra["pcd"]["mass"] <= 1.0 and extra.model_extra["pcd"]["prompt"] == "isolated"
    raw = client.decisions.with_raw_response.create(model="m", input=[{"role": "user", "content": text}],
                                                    questions=questions[:3])
    assert raw.request_id.startswith("req_") and list(raw.http_response.json()) == ["answers", "model", "usage"]
    # the same three questions through the Jev endpoint: the same schema, the same probabilities
    billing, tone, urgency = raw.parse().answers
    with typesafe_sdk.TypeSafeClient(base_url=server.url, api_key=KEY) as jc:
        j = jc.system_one(state=text, questions=QUESTIONS)
    assert billing.probability == j.nouls["billing"].noul
    assert [p.probability for p in tone.probabilities] == list(j.choices["tone"].probabilities.values())
    assert urgency.score == j.scores["urgency"].score and tone.confidence == j.choices["tone"].confidence


def test_openai_client_errors(server):
    from openai.types.decision import Decision

    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.UnprocessableEntityError) as info:
        client.decisions.create(model="m", input="x", questions=[{"type": "score", "instructions": "?",
                                                                  "levels": [{"label": "only"}]}])
    assert info.value.code == "too_few_levels" and "2 to 10 levels, got 1" in info.value.message
    with pytest.raises(openai.APIStatusError) as info:
        client.decisions.create(model="m", input="x", questions=[{"type": "choice", "instructions": "?",
                                                                  "choices": [{"value": f"v{i}"} for i in range(300)]}])
    assert info.value.status_code == 422 and info.value.code == "invalid_request"
    assert "300 options; a choice may have at most 255 options" in info.value.message
    with pytest.raises(openai.BadRequestError) as info:
        client.post("/decisions", cast_to=Decision, content=b"{nope", options={"headers": {
            "Content-Type": "application/json"}})
    assert info.value.code == "invalid_json" and info.value.type == "invalid_request_error"


def test_both_clients_need_the_key(server):
    from typesafe_sdk import RetryPolicy, TypeSafeAuthenticationError

    with typesafe_sdk.TypeSafeClient(base_url=server.url, api_key="wrong", retry=RetryPolicy(max_retries=0)) as c:
        with pytest.raises(TypeSafeAuthenticationError):
            c.system_one(state="x", questions=QUESTIONS)
    import httpx

    for path in ("/v1/systemone", "/v1/models"):  # the Jev header on the middleware's 401 too
        refused = httpx.request("POST" if path.endswith("one") else "GET", server.url + path, json={})
        assert refused.status_code == 401
        assert refused.headers["x-typesafe-request-id"] == refused.headers["x-request-id"]
    assert "x-typesafe-request-id" not in httpx.post(server.url + "/v1/decisions", json={}).headers
    with pytest.raises(openai.AuthenticationError) as info:
        openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).decisions.create(
            model="m", input="x", questions=[{"type": "predicate", "instructions": "?"}])
    assert info.value.code == "invalid_api_key"


def test_systemone_equals_v1_label_on_the_embedded_model(embedded_backend, tmp_path):
    """The same state and questions through /v1/systemone with the shared prompt and through
    /v1/label with the equivalent schema file: the same probabilities, to the last bit pcd label
    writes (the isolated prompt's equivalent, one schema per question, is
    tests/server/test_question_isolation.py's)."""
    import httpx

    questions = {
        "billing": {"type": "noul", "instructions": "Is this about billing?",
                    "criteria": {"true": "Charges, refunds, invoices"}},
        "tone": {"type": "choice", "instructions": "What is the tone?",
                 "criteria": {"calm": "A neutral message", "angry": None, "excited": None}},
        "urgency": {"type": "score", "instructions": "How urgent is it?",
                    "criteria": ["Can wait", "Needs attention this week", "Needs attention today"]},
    }
    state = {"subject": "Duplicate charge", "body": "I was charged twice. Please fix this ASAP."}
    qs, text = jev_qs(questions, state=state)
    path = tmp_path / "equivalent.yaml"
    path.write_text(yaml.safe_dump(qs.data, sort_keys=False, allow_unicode=True))
    from pcd_cli.job import LabelJob

    before = set(threading.enumerate())
    service, served = _serve(embedded_backend, {"equivalent": (load_schema(path), LabelJob())})
    try:
        with typesafe_sdk.TypeSafeClient(base_url=served.url, api_key=KEY) as client:
            j = client.system_one(state=state, questions=questions, extra_body={"pcd_prompt": "shared"})
        rows = httpx.post(served.url + "/v1/label", headers=AUTH, timeout=60, json={
            "schema": "equivalent", "records": [{"id": "r1", "text": text}], "all_probs": True}).json()["rows"]
    finally:
        served.stop()
        service.close()
    assert not [t for t in set(threading.enumerate()) - before if t.is_alive()]
    row = rows[0]
    assert j.nouls["billing"].noul == row["billing__probs"]["true"]
    assert j.choices["tone"].probabilities == row["tone__probs"]
    assert j.choices["tone"].choice == row["tone"]
    assert {str(k): v for k, v in j.scores["urgency"].probabilities.items()} == row["urgency__probs"]
    assert j.scores["urgency"].score == pytest.approx(row["urgency__expected"], abs=1e-6)


def test_same_questions_over_other_states_share_one_decode_call():
    """Concurrent System One requests with the same questions share their isolated schema (one
    branch per question), so the worker packs their states into one decode call; a request with
    other questions is decoded apart."""
    import asyncio

    from pcd_cli.server.app import AppConfig
    from pcd_cli.server.main import ServerThread
    from pcd_cli.server.service import LabelService

    host = FakeHost(gate=threading.Event())  # holds every decode call but the warm-up until set
    questions = {"billing": {"type": "noul", "instructions": "Is this about billing?"},
                 "tone": {"type": "choice", "criteria": {"calm": None, "angry": None}}}
    other = {"spam": {"type": "noul", "instructions": "Is this spam?"}}
    before = set(threading.enumerate())
    service = LabelService(host)

    async def run(url):
        async with typesafe_sdk.AsyncTypeSafeClient(base_url=url, api_key=KEY) as client:
            blocker = asyncio.ensure_future(client.system_one(state="blocker", questions=questions))
            while not host.entered.is_set():
                await asyncio.sleep(0.005)
            futures, jobs = [], 0
            for state, asked in (("s0", questions), ("o", other), ("s1", questions), ("s2", questions)):
                futures.append(asyncio.ensure_future(client.system_one(state=state, questions=asked)))
                jobs += 1  # one queued job per request: its questions are branches of one schema
                while service.queue_depth[0] < jobs:
                    await asyncio.sleep(0.005)
            host.gate.set()
            return await blocker, await asyncio.gather(*futures)

    with ServerThread(service, AppConfig(api_keys=(KEY,))) as srv:
        blocker, (s0, o, s1, s2) = asyncio.run(run(srv.url))
    assert not [t for t in set(threading.enumerate()) - before if t.is_alive()]
    assert [sorted(text for _, text in call) for call in host.calls[1:]] == [  # after the warm-up
        ["blocker"], ["s0", "s1", "s2"], ["o"]]
    assert len(host.compiled) == 3  # the warm-up's, billing and tone's, spam's
    fake = {float(np.float32(0.7)), float(np.float32(0.3))}  # the fake labeler's two probabilities
    assert {r.nouls["billing"].noul for r in (blocker, s0, s1, s2)} <= fake and o.nouls["spam"].noul in fake
    assert all(r.model == "fake-model" for r in (blocker, s0, o, s1, s2))
