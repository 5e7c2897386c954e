"""The Jev / System One wire contract: ``POST /v1/systemone`` and ``GET /v1/models``.

The spec is the official client, ``typesafe-sdk`` 0.7.x (``typesafe_sdk._core``: ``endpoints``,
``questions``, ``question_types``, ``response_types``, ``errors``, ``transport``):

* Request: ``{"model": str, "state": str | object | array, "questions": {name: question}}``, sent
  with ``Authorization: Bearer <key>``; extra top-level keys come from ``extra_body`` (pcd reads
  ``pcd_extras``; others are ignored); ``assets`` (images) are refused, pcd labels text.
  Questions: ``{"type": "noul", "instructions"?, "criteria"?: {"true"?, "false"?}}``,
  ``{"type": "choice", "instructions"?, "criteria": {label: description | null}}``,
  ``{"type": "score", "instructions"?, "criteria": [description, ...]}``; instructions and
  descriptions are a string, an object or an array; ``box`` (image regions) is refused.
* Response: exactly ``{"model", "answers", "usage"}``; ``answers`` keyed by the request's names,
  in its order; ``{"type": "noul", "noul": P(true)}``, ``{"type": "choice", "choice",
  "probabilities": {label: p}, "confidence"}``, ``{"type": "score", "score", "legend": {"0":
  criterion, ...}, "probabilities": {"0": p, ...}, "confidence"}``; ``usage`` ``{"input_tokens":
  int, "output_tokens": 0}`` (the client validates both as strict ints); every answer number a
  JSON float. Header ``x-typesafe-request-id`` on every response, errors included (the client's
  ``request_id``).
* Errors: ``{"error": {"type", "code", "message"}}`` (the client reads ``error.message``); 400
  malformed JSON, 413 too large, 415 multipart or unknown encoding, 422 a well-formed bad request;
  the client retries 408, 429 and 5xx, honouring ``Retry-After`` / ``retry-after-ms``.
* ``GET /v1/models``: ``{"models": [{"name", "description", "release_date": "YYYY-MM-DD"}]}``.
* pcd's extensions, which the official client passes through (``extra_body``, dict questions) and
  skips in its typed views: ``pcd_extras``, ``pcd_prompt`` (``questions.prompt_flag``) and the
  multi-select question ``{"type": "pcd_multi", "instructions"?, "criteria": {option: description
  | null}}``, answered ``{"type": "pcd_multi", "chosen": [options with P(yes) >= 0.5, request
  order], "probabilities": {option: P(yes)}}`` (each option its own yes/no decision, as pcd's
  ``multi`` fields).
"""

from __future__ import annotations

import datetime as _dt
import json
from typing import NamedTuple

from starlette.responses import JSONResponse
from starlette.routing import Route

from ... import questions as Q
from ..wire import Call, Json, Server, WireFormat, answer_extras, extras_flag, route

#: The response header that carries the request id (``typesafe_sdk._core.constants.REQUEST_ID_HEADER``).
REQUEST_ID_HEADER = "x-typesafe-request-id"
QUESTION_KEYS = {"noul": ("type", "instructions", "criteria"), "choice": ("type", "instructions", "criteria"),
                 "score": ("type", "instructions", "criteria"), Q.MULTI: ("type", "instructions", "criteria")}
#: A ``pcd_multi`` option is in ``chosen`` when its P(yes) is at least this (pcd's multi default).
MULTI_THRESHOLD = 0.5


def _content(value: Json, where: str, *, nullable: bool = True) -> str | None:
    """Text of a Jev content value (string, object or array; ``null`` when ``nullable``)."""
    if value is None and nullable:
        return None
    if isinstance(value, (str, dict, list)):
        return Q.content_text(value)
    raise Q.invalid(f"{where}: must be a string, an object or an array{' or null' if nullable else ''}, "
                    f"got {json.dumps(value)}", "invalid_question")


def parse_question(name: str, raw: Json) -> Q.Question:
    """One Jev question -> ``Question`` (the checks ``typesafe_sdk._core.questions`` makes, and pcd's).

    Raises:
        QuestionError: 422 naming the question: not an object, unknown or missing type, ``box``,
            unknown keys, contents of the wrong type, a noul with neither instructions nor a
            described outcome, criteria of the wrong shape.
    """
    where = f"questions.{name}"
    if not isinstance(raw, dict):
        raise Q.invalid(f"{where}: must be an object with a 'type', got {json.dumps(raw)[:60]}", "invalid_question")
    kind = raw.get("type")
    if kind == "box":
        raise Q.invalid(f"{where}: type 'box' locates a region of an image; pcd labels text "
                        "(noul, choice and score questions)", "unsupported_question_type")
    if kind not in QUESTION_KEYS:
        raise Q.invalid(f"{where}.type: must be 'noul', 'choice' or 'score' (or pcd's '{Q.MULTI}'), got "
                        f"{json.dumps(kind)}", "invalid_question")
    unknown = [k for k in raw if k not in QUESTION_KEYS[kind]]
    if unknown:
        raise Q.invalid(f"{where}: unknown key {unknown[0]!r} (a {kind} question has "
                        f"{', '.join(QUESTION_KEYS[kind])})", "invalid_question")
    instructions = _content(raw.get("instructions"), f"{where}.instructions")
    if instructions is not None and not instructions.strip():
        raise Q.invalid(f"{where}.instructions: is empty; give the question's text, or leave the key out when the "
                        "criteria say it all")
    criteria = raw.get("criteria")
    if kind == "noul":
        if criteria is None:
            criteria = {}
        if not isinstance(criteria, dict):
            raise Q.invalid(f"{where}.criteria: a noul's criteria must be an object with 'true' and/or 'false'",
                            "invalid_question")
        extra = [k for k in criteria if k not in ("true", "false")]
        if extra:
            raise Q.invalid(f"{where}.criteria: unknown key {extra[0]!r} (a noul's criteria are 'true' and 'false')",
                            "invalid_question")
        options = tuple((label, _content(criteria.get(label), f"{where}.criteria.{label}")) for label in ("true", "false"))
        if instructions is None and all(text is None for _, text in options):
            raise Q.invalid(f"{where}: has neither instructions nor criteria; at least one is required",
                            "invalid_question")
    elif kind in ("choice", Q.MULTI):
        if not isinstance(criteria, dict) or not criteria:
            raise Q.invalid(f"{where}.criteria: a {kind} needs an object of options (name -> description or null)",
                            "invalid_question")
        options = tuple((label, _content(text, f"{where}.criteria.{label}")) for label, text in criteria.items())
    else:
        if not isinstance(criteria, list) or not criteria:
            raise Q.invalid(f"{where}.criteria: a score needs a list of level descriptions, lowest first",
                            "invalid_question")
        options = tuple((str(i), _content(text, f"{where}.criteria[{i}]", nullable=False))
                        for i, text in enumerate(criteria))
    return Q.Question(name, kind, instructions, options, f"question {name!r}")


class SystemOneRequest(NamedTuple):
    """A ``/v1/systemone`` body, read (``parse_body``): the questions in request order, the state
    as sent (what a data-engine batch is recognised in), the record text, the ``pcd_extras``
    flag and the ``pcd_prompt`` (``questions.prompt_flag``)."""

    questions: list[Q.Question]
    state: Json
    text: str
    extras: bool
    prompt: str


def parse_body(body: Json, *, max_questions: int = Q.MAX_QUESTIONS) -> SystemOneRequest:
    """A System One request body -> ``SystemOneRequest``.

    Raises:
        QuestionError: 422 naming what is wrong (not an object, a non-string ``model``, ``assets``, a
            bad ``state``, question or ``pcd_prompt``), 413 for too many questions.
    """
    if not isinstance(body, dict):
        raise Q.invalid("the body must be a JSON object {model, state, questions}", "invalid_body")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise Q.invalid(f"model: must be a string, got {json.dumps(model)}", "invalid_model")
    if body.get("assets") is not None:
        raise Q.invalid("assets: images are not supported; pcd labels text (send the state as a string, "
                        "object or array)", "unsupported_assets")
    extras = extras_flag(body)
    prompt = Q.prompt_flag(body)
    raw_questions = body.get("questions")
    if not isinstance(raw_questions, dict) or not raw_questions:
        raise Q.invalid("questions: must be a non-empty object of named questions", "invalid_questions")
    if len(raw_questions) > max_questions:  # before parsing them all
        raise Q.too_large(f"questions: {len(raw_questions)} questions; this server answers at most {max_questions} "
                          "per request", "too_many_questions")
    text = Q.state_text(body.get("state"))
    parsed = [parse_question(name, raw) for name, raw in raw_questions.items()]
    Q.check_rows(body.get("state"), parsed)  # a null data-engine row: 422, never an invented answer
    return SystemOneRequest(parsed, body.get("state"), text, extras, prompt)


def parse_request(body: Json, *, max_questions: int = Q.MAX_QUESTIONS) -> tuple[Q.QuestionSet, str, bool]:
    """A System One request body -> ``(QuestionSet, record text, extras flag)``: the whole request as
    one shared-catalog schema (``pcd_prompt: "shared"``; what ``/v1/label`` with ``QuestionSet.data``
    as a schema file decodes).

    Raises:
        QuestionError: as ``parse_body``; 413/422 from ``questions.build``.
    """
    parsed, _, text, extras, _ = parse_body(body, max_questions=max_questions)
    return Q.build(parsed, max_questions=max_questions), text, extras


def render_answer(answer: Q.Answer, legend: tuple | None = None, *, extras: bool = False) -> dict:
    """One Jev answer (module docstring); ``legend``: the score's criteria as sent."""
    q = answer.question
    if q.kind == "noul":
        out: dict[str, object] = {"type": "noul", "noul": answer.probs[0]}
    elif q.kind == Q.MULTI:
        out = {"type": Q.MULTI, "chosen": [label for label, p in zip(answer.labels, answer.probs) if p >= MULTI_THRESHOLD],
               "probabilities": dict(zip(answer.labels, answer.probs))}
    elif q.kind == "choice":
        out = {"type": "choice", "choice": answer.labels[answer.chosen],
               "probabilities": dict(zip(answer.labels, answer.probs)), "confidence": answer.confidence}
    else:
        out = {"type": "score", "score": answer.score, "legend": dict(zip(answer.labels, legend or ())),
               "probabilities": dict(zip(answer.labels, answer.probs)), "confidence": answer.confidence}
    if extras:
        out["pcd"] = answer_extras(answer)
    return out


def routes(server: Server) -> list[Route]:
    """``POST /v1/systemone`` and ``GET /v1/models`` over ``server.service``; at most
    ``config.max_records_per_request`` questions per request (and ``questions.MAX_QUESTIONS``)."""
    loaded = _dt.datetime.now(_dt.timezone.utc).date().isoformat()

    async def systemone(call: Call) -> JSONResponse:
        """Answer a System One request (module docstring)."""
        body = await call.body()
        max_questions = call.max_questions(Q.MAX_QUESTIONS)
        req = parse_body(body, max_questions=max_questions)
        legends = {q.key: body["questions"][q.key].get("criteria") for q in req.questions if q.kind == "score"}
        found, tokens, envelope = await call.decide(req.questions, req.state, req.text, req.prompt,
                                                    max_questions=max_questions)
        answers = {a.question.key: render_answer(a, legends.get(a.question.key), extras=req.extras) for a in found}
        out: dict[str, object] = {"model": call.service.model_id, "answers": answers,
                                  "usage": {"input_tokens": tokens, "output_tokens": 0}}
        if req.extras:
            out["pcd"] = envelope
        return JSONResponse(out)

    async def models(call: Call) -> JSONResponse:
        """The one model served (module docstring)."""
        model = call.service.model_id
        return JSONResponse({"models": [{
            "name": model,
            "description": f"{model} served by pcd: exact constrained decoding of closed questions "
                           "(noul, choice, score); any model name in a request is answered by this model",
            "release_date": loaded}]})

    return [route(server, "/v1/systemone", systemone, "POST"), route(server, "/v1/models", models, "GET")]


#: The Jev format: its routes, the request id also under ``x-typesafe-request-id`` (what
#: ``typesafe-sdk`` reads), and the ``x-typesafe-*`` headers the client sends (``X-TypeSafe-SDK``, ...).
FORMAT = WireFormat("jev", routes, request_id_headers=(REQUEST_ID_HEADER,),
                    client_headers=frozenset({REQUEST_ID_HEADER}), client_header_prefixes=("x-typesafe-",))
