"""Data-engine batches are records (issue #35 item 4): Daft's ``jev`` / ``jev_prob`` /
``jev_choice`` / ``jev_score`` send up to 25 rows in one System One request as ``state = {...,
"rows": [...]}`` with one question per row (``r0``..``r24``, "Does the record rows[k] ...");
pcd answers each row as the one-row request that client would send for it, packed in shared
passes."""

from __future__ import annotations

import asyncio
import random
import threading

import pytest
import typesafe_sdk

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from pcd_cli.server.formats import jev as J  # noqa: E402
from pcd_cli import questions as Q  # noqa: E402

KEY = "test-key"
#: What ``daft/functions/jev.py`` writes (``_Jev.noul`` / ``choice`` / ``score``), for row ``k``.
NOUL = "Does the record rows[{k}] satisfy the condition stated in condition?"
CHOICE = "For the record rows[{k}]: {question}"
SCORE = "Rate the record rows[{k}]: {question}"


def daft_body(rows: list, kind: str = "noul", *, condition: str = "the customer is angry",
              question: str = "which team should handle this?", options=("billing", "technical", "sales"),
              levels=("budget", "mid-range", "premium")) -> dict:
    """The System One body Daft's ``_Jev._ask`` builds for ``rows`` (every row present)."""
    if kind == "noul":
        state, q, text = {"condition": condition}, {"type": "noul"}, lambda k: NOUL.format(k=k)
    elif kind == "choice":
        state, q = {}, {"type": "choice", "criteria": dict.fromkeys(options)}
        text = lambda k: CHOICE.format(k=k, question=question)  # noqa: E731
    else:
        state, q, text = {}, {"type": "score", "criteria": list(levels)}, lambda k: SCORE.format(k=k, question=question)
    return {"state": {**state, "rows": rows},
            "questions": {f"r{k}": {**q, "instructions": text(k)} for k in range(len(rows))}}


def split(body: dict):
    questions = J.parse_body({"model": "m", **body})[0]
    return Q.split_rows(body["state"], questions)


def test_the_three_daft_envelopes_are_cut_into_one_row_requests():
    rows = ["I was charged twice!!", {"name": "Hans", "age": 40}, 1.0]
    for kind in ("noul", "choice", "score"):
        out = split(daft_body(rows, kind))
        one_row = [J.parse_body({"model": "m", **daft_body([row], kind)})[0][0] for row in rows]
        assert [state for state, _ in out] == [daft_body([row], kind)["state"] for row in rows]
        assert [(q.kind, q.instructions, q.options) for _, q in out] == \
            [(q.kind, q.instructions, q.options) for q in one_row]
    state, q = split(daft_body(rows))[1]
    assert state == {"condition": "the customer is angry", "rows": [{"name": "Hans", "age": 40}]}
    assert q.instructions == "Does the record rows[0] satisfy the condition stated in condition?"
    assert split(daft_body(rows, "choice"))[2][1].instructions == "For the record rows[0]: which team should handle this?"
    # the one-row and plan views agree: one schema, one record per row
    p = Q.plan(J.parse_body({"model": "m", **daft_body(rows)})[0], daft_body(rows)["state"])
    assert len(p.units) == 1 and len(p.units[0].texts) == 3 and p.rows == 3
    assert p.units[0].texts[0] == '{"condition": "the customer is angry", "rows": ["I was charged twice!!"]}'


@pytest.mark.parametrize("change", ["key", "index", "question", "count", "kind", "options", "state", "one_row",
                                    "text"])
def test_anything_else_is_decoded_as_written(change):
    body = daft_body(["a", "b", "c"], "choice")
    qs = body["questions"]
    if change == "key":
        qs["x2"] = qs.pop("r2")
    elif change == "index":
        qs["r2"]["instructions"] = CHOICE.format(k=1, question="which team should handle this?")
    elif change == "question":
        qs["r2"]["instructions"] = CHOICE.format(k=2, question="which team?")
    elif change == "count":
        body["state"]["rows"].append("d")
    elif change == "kind":
        qs["r2"] = {"type": "noul", "instructions": NOUL.format(k=2)}
    elif change == "options":
        qs["r2"]["criteria"] = {"billing": None, "technical": None}
    elif change == "state":
        body["state"] = ["a", "b", "c"]
    elif change == "one_row":
        body = daft_body(["a"], "choice")
    else:
        qs["r1"]["instructions"] = "For the record rows[01]: which team should handle this?"
    assert split(body) is None


@pytest.fixture(scope="module")
def served(embedded_backend):
    from pcd_cli.server.app import AppConfig
    from pcd_cli.server.main import ServerThread
    from pcd_cli.server.service import LabelService, ModelHost

    before = set(threading.enumerate())
    from pcd_cli.job import LabelJob

    # the steering check off: its second decodes of tickets that use the question's words are passes
    # of their own, and this file counts the passes packing saves (the check: tests/test_steering.py)
    service = LabelService(ModelHost(loaded=embedded_backend), default_options=LabelJob(steering_check=False))
    with ServerThread(service, AppConfig(api_keys=(KEY,))) as srv:
        yield srv
    assert not [t.name for t in set(threading.enumerate()) - before if t.is_alive()]


TICKETS = [f"Ticket {i}: " + text for i, text in enumerate([
    "I was charged twice this month!!", "Thanks, all sorted now.", "The app crashes on login.",
    "Where is my parcel? It is a week late.", "Cancel my subscription immediately.", "Great service, thank you!",
    "Your courier broke my vase and nobody answers.", "How do I change my password?", "Refund me now or I sue.",
    "Can I upgrade to the family plan?", "The invoice shows the wrong VAT number.", "Love the new design.",
    "I have asked three times, this is ridiculous.", "Is there a student discount?", "Login code never arrives.",
    "Please update my address.", "You charged my old card.", "Stop emailing me.", "Works fine, just curious.",
    "The product arrived damaged.", "Why was I billed for March?", "Fast delivery, happy.", "The site is down again!",
    "I want to speak to a manager.", "Nice job on the update."])]


@pytest.mark.full  # 13 s of Daft; the batch route's one-row answers are tested with httpx in this module
def test_a_daft_batch_answers_each_row_as_its_own_one_row_request(served):
    """The envelope sent through ``typesafe-sdk``'s async client exactly as Daft's ``_Jev._ask``
    sends it: each row's probability equals the one-row request's within the packed-vs-single
    bound, in another batch at another position too, in fewer forward passes than 25 one-row
    requests."""
    service = served.service

    async def ask(rows: list, kind: str = "noul") -> list[float]:
        body = daft_body(rows, kind)
        async with typesafe_sdk.AsyncTypeSafeClient(base_url=served.url, api_key=KEY, timeout=600) as client:
            r = await client.system_one(state=body["state"], questions=body["questions"])
        answers = [r.answers[f"r{k}"] for k in range(len(rows))]
        if kind == "noul":
            return [a.noul for a in answers]
        return [a.probabilities for a in answers]

    before = service.forward_passes
    batch = asyncio.run(ask(TICKETS))
    batch_passes = service.forward_passes - before
    before = service.forward_passes
    alone = [asyncio.run(ask([t]))[0] for t in TICKETS]
    alone_passes = service.forward_passes - before
    shuffled_order = list(range(len(TICKETS)))
    random.Random(7).shuffle(shuffled_order)
    shuffled = asyncio.run(ask([TICKETS[i] for i in shuffled_order[:10]]))
    bound = max(abs(a - b) for a, b in zip(batch, alone))
    assert bound <= 1e-5, bound  # the decoder's packed-vs-single bound (docs/serve.md)
    assert max(abs(shuffled[j] - alone[i]) for j, i in enumerate(shuffled_order[:10])) <= 1e-5
    assert len(set(round(p, 3) for p in batch)) > 5  # the rows get their own answers
    assert batch_passes < alone_passes == 25, (batch_passes, alone_passes)
    # a choice batch: the same rows, each row's distribution that of its own one-row request
    choices = asyncio.run(ask(TICKETS[:4], "choice"))
    for ticket, probs in zip(TICKETS[:4], choices):
        one = asyncio.run(ask([ticket], "choice"))[0]
        assert max(abs(probs[k] - one[k]) for k in one) <= 1e-5
