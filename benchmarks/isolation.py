"""What question isolation costs on the decision endpoints (issue #35), against the shared-catalog
prompt it replaced, and what it buys.

    python benchmarks/isolation.py [--states 8] [--json benchmarks/isolation.json]

On the embedded model (CPU, float32), through the server's own ``LabelService`` and the
translation the endpoints use (``pcd_cli.questions``: ``plan`` + ``decoded`` for the isolated
prompt, ``build`` + one ``submit`` for the shared one), two request shapes:

* ``support``: a 4-question request (yes/no, a 3-option choice, a 3-level score, yes/no) over
  ``--states`` support tickets, sent one request at a time (a client waiting for each answer)
  and then all at once (concurrent requests, packed by the service);
* ``daft``: one Daft ``jev_prob`` batch of 25 rows (``state = {"condition", "rows"}``, questions
  ``r0``..``r24``): shared = one 25-field schema over the whole state; isolated = 25 one-row
  records of one one-question schema.

Per shape and prompt: tokens fed to the model per request (records and answer forests, the
cached prompt heads excluded), prompt-head tokens prefilled once per schema, forward passes and
decode calls per request, wall-clock ms per request (warm: every schema already compiled; cold:
the first request, compiling included), and two coherence figures: the largest total-variation
distance between a question's answer alone and in its batch (``tv_alone_vs_batch``: 0 means
isolated), and for ``daft`` the largest |Δp| of a row between the 25-row batch and its one-row
request (the packed-vs-single bound).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pcd_cli.results import Record  # noqa: E402
from pcd_cli.server.formats import jev as J  # noqa: E402
from pcd_cli import questions as Q  # noqa: E402
from pcd_cli.server.service import LabelService, ModelHost  # noqa: E402

QUESTIONS = {
    "billing": {"type": "noul", "instructions": "Is this about billing?"},
    "tone": {"type": "choice", "instructions": "What is the tone?",
             "criteria": {"calm": "A neutral or polite message", "angry": None, "excited": None}},
    "urgency": {"type": "score", "instructions": "How urgent is this message?",
                "criteria": ["Can wait", "Needs attention this week", "Needs attention today"]},
    "spam": {"type": "noul", "instructions": "Is this spam?"},
}
TICKETS = [
    "I was charged twice this month!! Refund one now.", "Thanks, all sorted now.", "The app crashes on login.",
    "Where is my parcel? It is a week late.", "Cancel my subscription immediately.", "Great service, thank you!",
    "Your courier broke my vase and nobody answers.", "How do I change my password?", "Refund me now or I sue.",
    "Can I upgrade to the family plan?", "The invoice shows the wrong VAT number.", "Love the new design.",
    "I have asked three times, this is ridiculous.", "Is there a student discount?", "Login code never arrives.",
    "Please update my address.", "You charged my old card.", "Stop emailing me.", "Works fine, just curious.",
    "The product arrived damaged.", "Why was I billed for March?", "Fast delivery, happy.", "The site is down again!",
    "I want to speak to a manager.", "Nice job on the update."]


class Meter:
    """Forward passes, decode calls and tokens fed by every labeler of ``service`` (heads apart)."""

    def __init__(self, service: LabelService):
        self.service = service

    def labelers(self):
        return [e.labeler for e in list(self.service._cache.values()) if e.labeler is not None]

    def read(self) -> dict:
        ls = self.labelers()
        return {"passes": self.service.forward_passes, "calls": self.service.batches,
                "tokens": sum(lab.decoder.tokens_fed for lab in ls),
                "head_tokens": sum(lab.decoder.head_len for lab in ls), "schemas": len(ls)}


async def ask(service, questions: dict, state, prompt: str, rid: str) -> dict[str, dict]:
    """One request as the Jev endpoint decodes it -> each answer's distribution by option."""
    parsed, state, text, _, _ = J.parse_body({"state": state, "questions": questions})
    if prompt == "isolated":
        plan = Q.plan(parsed, state)
        done = await asyncio.gather(*(service.submit(unit.schema, Q.unit_records(plan, u, rid), request_id=rid)
                                      for u, unit in enumerate(plan.units)))
        found = Q.decoded(plan, done).answers
    else:
        qs = Q.build(parsed)
        submitted = await service.submit(qs.schema, [Record(rid, text)], request_id=rid)
        found = Q.answers(qs, submitted.results[0].fields)
    return {a.question.key: dict(zip(a.labels, a.probs)) for a in found}


def tv(a: dict, b: dict) -> float:
    return 0.5 * sum(abs(a[k] - b[k]) for k in a)


async def measure(service, meter, requests: list[tuple[dict, object]], prompt: str, concurrent: bool) -> dict:
    before, started = meter.read(), time.perf_counter()
    if concurrent:
        out = await asyncio.gather(*(ask(service, q, s, prompt, f"c{i}") for i, (q, s) in enumerate(requests)))
    else:
        out = [await ask(service, q, s, prompt, f"s{i}") for i, (q, s) in enumerate(requests)]
    seconds, after = time.perf_counter() - started, meter.read()
    n = len(requests)
    return {"answers": out, "ms_per_request": round(1000 * seconds / n, 1),
            "tokens_per_request": round((after["tokens"] - before["tokens"]) / n, 1),
            "passes_per_request": round((after["passes"] - before["passes"]) / n, 2),
            "decode_calls_per_request": round((after["calls"] - before["calls"]) / n, 2)}


def daft_body(rows: list) -> tuple[dict, dict]:
    state = {"condition": "the customer is angry", "rows": rows}
    return ({f"r{k}": {"type": "noul", "instructions": f"Does the record rows[{k}] satisfy the condition stated "
                                                      "in condition?"} for k in range(len(rows))}, state)


async def run(states: int) -> dict:
    from pcd_cli.backends import load_backend

    backend = load_backend(None, device="cpu", dtype="float32")
    results: dict = {}
    for prompt in ("shared", "isolated"):
        service = LabelService(ModelHost(loaded=backend))
        service.start()
        assert service.ready.wait(300), service.startup_error
        meter = Meter(service)
        try:
            support = [(QUESTIONS, {"ticket": t}) for t in TICKETS[:states]]
            head0, t0 = meter.read(), time.perf_counter()
            cold = await ask(service, QUESTIONS, {"ticket": TICKETS[states]}, prompt, "cold")
            cold_ms = 1000 * (time.perf_counter() - t0)
            head = meter.read()["head_tokens"] - head0["head_tokens"]
            seq = await measure(service, meter, support, prompt, concurrent=False)
            conc = await measure(service, meter, support, prompt, concurrent=True)
            alone = {k: await ask(service, {k: q}, {"ticket": TICKETS[0]}, prompt, f"a{k}") for k, q in QUESTIONS.items()}
            batch0 = seq["answers"][0]
            tv_alone = max(tv(alone[k][k], batch0[k]) for k in QUESTIONS)
            rev = await ask(service, dict(reversed(list(QUESTIONS.items()))), {"ticket": TICKETS[0]}, prompt, "rev")
            flipped = {**QUESTIONS, "tone": {**QUESTIONS["tone"], "criteria": dict(reversed(list(
                QUESTIONS["tone"]["criteria"].items())))}}
            perm = await ask(service, flipped, {"ticket": TICKETS[0]}, prompt, "perm")
            support_out = {
                "cold_first_request_ms": round(cold_ms, 1), "prompt_head_tokens_compiled": head,
                "one_at_a_time": {k: v for k, v in seq.items() if k != "answers"},
                "concurrent": {k: v for k, v in conc.items() if k != "answers"},
                "tv_alone_vs_batch": tv_alone,
                "tv_reordered_batch": max(tv(rev[k], batch0[k]) for k in QUESTIONS),
                "tv_options_reversed": tv(perm["tone"], batch0["tone"]),
                "max_dp_concurrent_vs_one_at_a_time": max(abs(a[k][o] - b[k][o]) for a, b in zip(
                    seq["answers"], conc["answers"]) for k in a for o in a[k])}
            questions, state = daft_body(TICKETS)
            d_cold = time.perf_counter()
            await ask(service, questions, state, prompt, "daft-cold")
            d_cold_ms = 1000 * (time.perf_counter() - d_cold)
            batch = await measure(service, meter, [(questions, state)], prompt, concurrent=False)
            one_row = [await ask(service, *daft_body([t]), prompt, f"row{i}") for i, t in enumerate(TICKETS[:8])]
            rows = batch["answers"][0]
            daft_out = {"cold_first_request_ms": round(d_cold_ms, 1),
                        **{k: v for k, v in batch.items() if k != "answers"},
                        "max_dp_row_in_batch_vs_alone": max(abs(rows[f"r{i}"]["true"] - one_row[i]["r0"]["true"])
                                                           for i in range(len(one_row)))}
            results[prompt] = {"support": support_out, "daft_25_rows": daft_out}
        finally:
            service.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--states", type=int, default=8, help="support tickets asked (one request each)")
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "isolation.json")
    args = parser.parse_args()
    started = time.perf_counter()
    results = asyncio.run(run(args.states))
    s, i = results["shared"], results["isolated"]
    ratios = {
        "support_tokens_isolated_over_shared": round(i["support"]["one_at_a_time"]["tokens_per_request"]
                                                     / s["support"]["one_at_a_time"]["tokens_per_request"], 2),
        "support_ms_isolated_over_shared": round(i["support"]["one_at_a_time"]["ms_per_request"]
                                                 / s["support"]["one_at_a_time"]["ms_per_request"], 2),
        "support_concurrent_ms_isolated_over_shared": round(i["support"]["concurrent"]["ms_per_request"]
                                                            / s["support"]["concurrent"]["ms_per_request"], 2),
        "daft_tokens_isolated_over_shared": round(i["daft_25_rows"]["tokens_per_request"]
                                                  / s["daft_25_rows"]["tokens_per_request"], 2),
        "daft_ms_isolated_over_shared": round(i["daft_25_rows"]["ms_per_request"]
                                              / s["daft_25_rows"]["ms_per_request"], 2)}
    out = {"model": "smollm2-135m-instruct (embedded), CPU float32", "machine": platform.machine(),
           "states": args.states, "results": results, "ratios": ratios,
           "seconds": round(time.perf_counter() - started, 1)}
    args.json.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(ratios, indent=2))


if __name__ == "__main__":
    main()
