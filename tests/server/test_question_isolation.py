"""Question isolation on the decision endpoints (issue #35 items 1 and 2): each question is its own
one-question schema asked in its own branch after the state (``isolate_fields``), so its
probabilities are those of the question asked alone about the same state, whatever else the request
asks, in whatever order, with duplicates, and whatever order a choice lists its options in (equal
within ``BOUND``, packing's float32 rounding: a question's branch shares passes with its
neighbours')."""

from __future__ import annotations

import itertools
import threading

import numpy as np
import openai
import pytest
import typesafe_sdk
import yaml

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from pcd_cli.schema.load import load_schema  # noqa: E402
from pcd_cli.server.formats import jev as J  # noqa: E402
from pcd_cli import questions as Q  # noqa: E402
from pcd_cli.server.errors import ApiError, api_error  # noqa: E402

#: What a request is refused with: the wire layer's ApiError, or the decision domain's own
#: QuestionError (answered by its code: api_error gives the status the client sees).
REFUSED = (ApiError, Q.QuestionError)

KEY = "test-key"
#: packed vs alone: the decoder's float32 packing bound (measured 5.8e-6, benchmarks/isolation.json)
BOUND = 2e-5
STATE = {"subject": "Duplicate charge", "body": "I was charged twice for my March invoice. Please refund one."}
QUESTIONS = {
    "billing": {"type": "noul", "instructions": "Is this about billing?"},
    "tone": {"type": "choice", "instructions": "What is the tone?",
             "criteria": {"calm": "A neutral or polite message", "angry": None, "excited": None}},
    "urgency": {"type": "score", "instructions": "How urgent is this message?",
                "criteria": ["Can wait", "Needs attention this week", "Needs attention today"]},
    "spam": {"type": "noul", "instructions": "Is this spam?"},
}


def parsed(questions: dict) -> list[Q.Question]:
    return J.parse_body({"state": "x", "questions": questions})[0]


# -- the plan, without a model --------------------------------------------------------------------

def test_a_question_schema_ignores_its_key_neighbours_and_option_order():
    tone = parsed({"tone": QUESTIONS["tone"]})[0]
    data, order = Q.question_data(tone)
    assert data["fields"] == {"answer": {
        "type": "enum", "labels": ["angry", "calm", "excited"],
        "description": 'What is the tone? "calm": A neutral or polite message.'}}
    assert order == (1, 0, 2)  # prompt position -> request index: angry is the request's 2nd option
    # another key, the options in another order: the same schema
    flipped = {"type": "choice", "instructions": "What is the tone?",
               "criteria": {"excited": None, "angry": None, "calm": "A neutral or polite message"}}
    other = parsed({"mood": flipped})[0]
    assert Q.question_data(other)[0] == data and Q.canonical_order(other) == (1, 2, 0)
    # a score keeps its levels' order (their meaning), read in one direction: the same scale sent
    # highest-first is the same prompt, its answer mirrored back; a yes/no question keeps true, false
    urgency = parsed({"u": QUESTIONS["urgency"]})[0]
    data = Q.question_data(urgency)[0]
    assert data["fields"]["answer"]["labels"] == ["0", "1", "2"] and Q.canonical_order(urgency) == (0, 1, 2)
    assert data["fields"]["answer"]["description"] == ('How urgent is this message? "0": Can wait. "1": Needs '
                                                      'attention this week. "2": Needs attention today.')
    mirrored = parsed({"u": {**QUESTIONS["urgency"], "criteria": QUESTIONS["urgency"]["criteria"][::-1]}})[0]
    assert Q.question_data(mirrored)[0] == data and Q.canonical_order(mirrored) == (2, 1, 0)
    assert Q.canonical_order(parsed({"b": QUESTIONS["billing"]})[0]) == (0, 1)


def test_plan_decodes_each_distinct_question_once_over_one_state():
    qs = parsed({**QUESTIONS, "billing_again": QUESTIONS["billing"],
                 "tone2": {**QUESTIONS["tone"], "criteria": dict(reversed(list(QUESTIONS["tone"]["criteria"].items())))}})
    p = Q.plan(qs, STATE)
    # one unit: the state read once, one isolated field per distinct question (billing, tone,
    # urgency, spam); the two copies are not decoded again
    assert len(p.units) == 1 and p.rows == 0 and p.units[0].texts == (Q.state_text(STATE),)
    schema = p.units[0].schema
    assert schema.isolate_fields and schema.isolated_key == "answer" and len(schema.declared) == 4
    assert (p.picks[4].unit, p.picks[4].field) == (p.picks[0].unit, p.picks[0].field)
    assert (p.picks[5].unit, p.picks[5].field) == (p.picks[1].unit, p.picks[1].field)
    assert p.picks[5].order == (1, 2, 0)  # calm, angry, excited reversed: excited, angry, calm
    alone = Q.plan(parsed({"tone": QUESTIONS["tone"]}), STATE)
    assert alone.picks[0].sha256 == p.picks[1].sha256 == p.picks[5].sha256
    # the unit's schema does not depend on the request's order: the question set is sorted
    shuffled = Q.plan(parsed(dict(reversed(list(QUESTIONS.items())))), STATE)
    assert shuffled.units[0].schema.source_sha256 == schema.source_sha256


def test_isolation_lifts_the_shared_prompts_answer_context_limit():
    big = {"type": "choice", "criteria": {f"CAT_{i:03d}": None for i in range(255)}}
    nouls = {f"n{i}": {"type": "noul", "instructions": f"{i}?"} for i in range(20)}
    assert len(Q.plan(parsed({"cat": big, **nouls}), "x").units[0].schema.declared) == 21
    with pytest.raises(REFUSED) as info:
        Q.build(parsed({"cat": big, **nouls}))
    assert info.value.code == "too_many_options"


def test_pcd_prompt_flag_is_checked():
    assert Q.prompt_flag({}) == "isolated" and Q.prompt_flag({"pcd_prompt": "shared"}) == "shared"
    with pytest.raises(REFUSED) as info:
        Q.prompt_flag({"pcd_prompt": "together"})
    assert api_error(info.value).status == 422 and 'must be "isolated" or "shared", got "together"' in info.value.message


# -- on the embedded model, through both official clients ------------------------------------------

@pytest.fixture(scope="module")
def served(embedded_backend):
    from pcd_cli.server.app import AppConfig
    from pcd_cli.server.main import ServerThread
    from pcd_cli.server.service import LabelService, ModelHost

    before = set(threading.enumerate())
    service = LabelService(ModelHost(loaded=embedded_backend))
    with ServerThread(service, AppConfig(api_keys=(KEY,))) as srv:
        yield srv
    assert not [t.name for t in set(threading.enumerate()) - before if t.is_alive()]


def dists(response) -> dict[str, dict]:
    """Each answer's distribution by option, from a typesafe-sdk response's raw JSON."""
    out = {}
    for key, a in response.raw_http_response.json()["answers"].items():
        out[key] = {"true": a["noul"], "false": 1.0 - a["noul"]} if a["type"] == "noul" else a["probabilities"]
    return out


def tv(a: dict, b: dict) -> float:
    return 0.5 * sum(abs(a[k] - b[k]) for k in a)


def close(a: dict, b: dict, bound: float = BOUND) -> bool:
    """Two distributions by option (or two dicts of them by question) equal within ``bound``."""
    if set(a) != set(b):
        return False
    return all(close(a[k], b[k], bound) if isinstance(a[k], dict) else abs(a[k] - b[k]) <= bound for k in a)


def test_alone_batched_reordered_duplicated_permuted_give_the_same_answers(served):
    """The JevBench batch relations and option permutation, exactly: on an idle server every
    question is decoded in its own branch, so the probabilities are equal within ``BOUND``."""
    with typesafe_sdk.TypeSafeClient(base_url=served.url, api_key=KEY, timeout=300) as client:
        batch = dists(client.system_one(state=STATE, questions=QUESTIONS))
        reordered = dists(client.system_one(state=STATE, questions=dict(reversed(list(QUESTIONS.items())))))
        duplicated = dists(client.system_one(state=STATE, questions={**QUESTIONS, "tone__copy": QUESTIONS["tone"]}))
        alone = {k: dists(client.system_one(state=STATE, questions={k: q}))[k] for k, q in QUESTIONS.items()}
        fillers = dists(client.system_one(state=STATE, questions={
            "tone": QUESTIONS["tone"], **{f"filler_{i}": {"type": "noul", "instructions": f"Does the text mention {w}?"}
                                          for i, w in enumerate(("a colour", "an animal", "the weather"))}}))
        permuted = []
        for order in itertools.permutations(QUESTIONS["tone"]["criteria"].items()):
            q = {**QUESTIONS["tone"], "criteria": dict(order)}
            permuted.append(dists(client.system_one(state=STATE, questions={"tone": q}))["tone"])
        reversed_scale = {**QUESTIONS["urgency"], "criteria": QUESTIONS["urgency"]["criteria"][::-1]}
        mirrored = dists(client.system_one(state=STATE, questions={"urgency": reversed_scale}))["urgency"]
    assert close(batch, alone) and close(batch, {k: reordered[k] for k in QUESTIONS})
    assert close(batch, {k: duplicated[k] for k in QUESTIONS})
    assert duplicated["tone__copy"] == duplicated["tone"]  # decoded once: the very same numbers
    assert close(fillers["tone"], batch["tone"])
    assert all(close(p, batch["tone"]) for p in permuted)  # every one of the 6 option orders
    assert close({str(2 - int(k)): p for k, p in mirrored.items()}, batch["urgency"])  # the scale sent reversed
    assert abs(sum(batch["tone"].values()) - 1.0) < 1e-5 and 0.0 < batch["billing"]["true"] < 1.0


def test_shared_prompt_is_still_there_and_differs(served):
    """``pcd_prompt: "shared"`` is today's one-schema prompt: an answer there depends on its
    neighbours (what isolation removes)."""
    with typesafe_sdk.TypeSafeClient(base_url=served.url, api_key=KEY, timeout=300) as client:
        shared = dists(client.system_one(state=STATE, questions=QUESTIONS, extra_body={"pcd_prompt": "shared"}))
        shared_alone = dists(client.system_one(state=STATE, questions={"tone": QUESTIONS["tone"]},
                                               extra_body={"pcd_prompt": "shared"}))
        isolated = dists(client.system_one(state=STATE, questions=QUESTIONS))
    assert tv(shared["tone"], shared_alone["tone"]) > 1e-3  # the neighbours move the shared answer
    assert tv(shared["tone"], isolated["tone"]) > 1e-3  # and the isolated prompt is another prompt


def test_isolated_answer_equals_v1_label_with_the_one_question_schema(embedded_backend, tmp_path):
    """The schema an isolated question is decoded with (its one-question dict with
    ``isolate_fields: true``), written to a file and served by ``/v1/label``: the same
    probabilities ``pcd label`` writes, to the bit (alone, nothing else shares its passes)."""
    import httpx

    from pcd_cli.server.app import AppConfig
    from pcd_cli.server.main import ServerThread
    from pcd_cli.job import LabelJob
    from pcd_cli.server.service import LabelService, ModelHost

    tone = parsed({"tone": QUESTIONS["tone"]})[0]
    data, order = Q.question_data(tone)
    path = tmp_path / "tone.yaml"
    path.write_text(yaml.safe_dump({**data, "isolate_fields": True}, sort_keys=False, allow_unicode=True))
    service = LabelService(ModelHost(loaded=embedded_backend), {"tone": (load_schema(path), LabelJob())})
    with ServerThread(service, AppConfig(api_keys=(KEY,))) as srv:
        with typesafe_sdk.TypeSafeClient(base_url=srv.url, api_key=KEY, timeout=300) as client:
            j = client.system_one(state=STATE, questions={"tone": QUESTIONS["tone"]})
        rows = httpx.post(srv.url + "/v1/label", headers={"Authorization": f"Bearer {KEY}"}, timeout=60, json={
            "schema": "tone", "records": [{"id": "r", "text": Q.state_text(STATE)}], "all_probs": True}).json()["rows"]
    assert j.choices["tone"].probabilities == rows[0]["answer__probs"]
    assert j.choices["tone"].choice == rows[0]["answer"]


def test_openai_decisions_are_isolated_too(served):
    """The same questions through ``/v1/decisions``: the same numbers as the Jev endpoint, a
    question's answer the same alone and with a shuffled, duplicated batch around it."""
    client = openai.OpenAI(base_url=served.url + "/v1", api_key=KEY, max_retries=0, timeout=300)
    text = "I was charged twice for my March invoice. Please refund one."
    questions = [
        {"type": "predicate", "name": "billing", "instructions": "Is this about billing?"},
        {"type": "choice", "name": "tone", "instructions": "What is the tone?",
         "choices": [{"value": "calm", "description": "A neutral or polite message"}, {"value": "angry"},
                     {"value": "excited"}]},
        {"type": "choice", "instructions": "Refund asked?", "choices": [{"value": True}, {"value": False}]},
    ]
    batch = client.decisions.create(model="m", input=text, questions=questions)
    alone = client.decisions.create(model="m", input=text, questions=questions[1:2])
    flipped = dict(questions[2], choices=[{"value": False}, {"value": True}])
    shuffled = client.decisions.create(model="m", input=text, questions=[flipped, questions[1], dict(questions[1], name="t2"),
                                                                         questions[0]])
    tone = {p.value: p.probability for p in batch.answers[1].probabilities}
    assert close(tone, {p.value: p.probability for p in alone.answers[0].probabilities})
    assert close(tone, {p.value: p.probability for p in shuffled.answers[1].probabilities})
    assert {p.value: p.probability for p in shuffled.answers[1].probabilities} == \
        {p.value: p.probability for p in shuffled.answers[2].probabilities}  # the copy: decoded once
    refund = {str(p.value): p.probability for p in batch.answers[2].probabilities}
    assert close(refund, {str(p.value): p.probability for p in shuffled.answers[0].probabilities})
    assert [p.value for p in shuffled.answers[0].probabilities] == [False, True]  # request order kept
    assert abs(batch.answers[0].probability - shuffled.answers[3].probability) <= BOUND
    with typesafe_sdk.TypeSafeClient(base_url=served.url, api_key=KEY, timeout=300) as jc:
        j = jc.system_one(state=text, questions={"tone": QUESTIONS["tone"]})
    assert close(tone, j.choices["tone"].probabilities)
    # the usage counts the state once: it is read once for every question
    single = client.decisions.create(model="m", input=text, questions=questions[:1]).usage.input_tokens
    assert shuffled.usage.input_tokens == single
    assert np.isclose(sum(tone.values()), 1.0, atol=1e-5)


def test_pcd_multi_is_a_multi_select_question_the_client_passes_through(served):
    """pcd's opt-in multi-select on /v1/systemone: each option its own yes/no decision (pcd's
    ``multi``), options in canonical order; the official client sends it as a dict question and
    leaves the unknown answer type out of its typed views."""
    topics = {"type": "pcd_multi", "instructions": "Which topics does the message raise?",
              "criteria": {"billing": "Charges, refunds, invoices", "outage": None, "security": None}}
    flipped = {**topics, "criteria": dict(reversed(list(topics["criteria"].items())))}
    with typesafe_sdk.TypeSafeClient(base_url=served.url, api_key=KEY, timeout=300) as client:
        r = client.system_one(state=STATE, questions={"topics": topics, "billing": QUESTIONS["billing"]})
        other = client.system_one(state=STATE, questions={"t": flipped})
        with pytest.raises(typesafe_sdk.TypeSafeUnprocessableEntityError) as info:
            client.system_one(state=STATE, questions={"topics": topics}, extra_body={"pcd_prompt": "shared"})
    raw = r.raw_http_response.json()["answers"]
    assert set(r.nouls) == {"billing"} and "topics" not in r.choices  # the typed views skip it
    multi = raw["topics"]
    assert multi["type"] == "pcd_multi" and list(multi["probabilities"]) == ["billing", "outage", "security"]
    assert all(0.0 < p < 1.0 for p in multi["probabilities"].values())
    assert multi["chosen"] == [k for k, p in multi["probabilities"].items() if p >= 0.5]
    assert close(other.raw_http_response.json()["answers"]["t"]["probabilities"], multi["probabilities"])
    assert "decoded on its own" in str(info.value)
    data, order = Q.question_data(parsed({"topics": topics})[0])
    assert data["fields"]["answer"]["type"] == "multi" and data["fields"]["answer"]["labels"] == \
        ["billing", "outage", "security"] and order == (0, 1, 2)


def test_serve_permutations_apply_to_shared_prompts_and_leave_isolated_answers_alone(served, embedded_backend):
    """``pcd serve --permutations 6``: a request's isolated schema is decoded once, its options in the
    canonical order (``LabelJob.for_question_schema``), so its answers are the default server's; a
    ``"pcd_prompt": "shared"`` request averages the six orders (another answer than without; 6: the
    balanced count for a yes/no question beside a three-way one, issue #45)."""
    from pcd_cli.job import LabelJob
    from pcd_cli.server.app import AppConfig
    from pcd_cli.server.main import ServerThread
    from pcd_cli.server.service import LabelService, ModelHost

    questions = {"tone": QUESTIONS["tone"], "billing": QUESTIONS["billing"]}
    shared = {"pcd_prompt": "shared"}
    with typesafe_sdk.TypeSafeClient(base_url=served.url, api_key=KEY, timeout=300) as client:
        plain = dists(client.system_one(state=STATE, questions=questions))
        plain_shared = dists(client.system_one(state=STATE, questions=questions, extra_body=shared))
    service = LabelService(ModelHost(loaded=embedded_backend), default_options=LabelJob(permutations=6))
    with ServerThread(service, AppConfig(api_keys=(KEY,))) as srv:
        with typesafe_sdk.TypeSafeClient(base_url=srv.url, api_key=KEY, timeout=300) as client:
            permuted = dists(client.system_one(state=STATE, questions=questions))
            permuted_shared = dists(client.system_one(state=STATE, questions=questions, extra_body=shared))
    assert close(permuted, plain)
    assert tv(permuted_shared["tone"], plain_shared["tone"]) > 1e-4
