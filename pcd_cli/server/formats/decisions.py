"""The OpenAI Decisions API: ``POST /v1/decisions`` (``openai`` ``client.decisions.create``).

The spec is the official client, ``openai`` 3.57 (``openai.resources.decisions``,
``openai.types.decision``, ``openai.types.decision_create_params``); the translation into a pcd
schema is the Jev endpoint's (``questions``):

* Request: ``{"model": str, "input": str | [message, ...], "questions": [question, ...]}``
  (``prompt_cache_key``, ``prompt_cache_options``, ``safety_identifier`` are accepted and
  ignored; ``pcd_extras`` through ``extra_body``). Messages: ``{"role": "user" | "developer" |
  "system" | "assistant", "content": str | [part, ...], "type"?: "message"}`` with text parts
  (``input_text``, ``input_json``; an assistant's ``output_text`` and ``refusal``); images, function
  and tool calls are refused (pcd labels text). Questions: ``{"type": "predicate",
  "instructions", "name"?}``, ``{"type": "choice", "instructions", "choices": [{"value": str |
  bool, "description"?}], "name"?}``, ``{"type": "score", "instructions", "levels": [{"label",
  "description"?}], "name"?}``; instructions are a string or a list of ``input_text`` /
  ``input_json`` parts.
* The record text: a string input as it is (stripped); a single user message as its text; any
  other list as ``"<role>: <text>"`` per message joined by a blank line. A ``system`` or
  ``developer`` message in ``input`` is part of that record, read as data like every word of it,
  never as policy (docs/security.md): the prompt quotes the record as data, the steering check
  erases such a message's sentences and flags an answer they moved, and with ``pcd_extras`` the
  answer's ``pcd`` object says so in ``notes`` (``input_notes``). A message's text is its
  string content, or its parts' texts (``input_json`` as its JSON text) joined by a newline.
* Response: exactly ``{"answers", "model", "usage"}``; ``answers`` a list in question order:
  ``{"type": "predicate", "name", "probability"}``, ``{"type": "choice", "name", "choice",
  "confidence", "probabilities": [{"value", "probability"}]}`` (values typed as sent: a boolean
  choice comes back a boolean), ``{"type": "score", "name", "score", "confidence",
  "probabilities": [{"value": i, "label", "probability"}]}``; ``name`` is ``null`` for an unnamed
  question. ``usage``: ``input_tokens``, ``input_tokens_details`` (``cached_tokens``,
  ``cache_write_tokens``: 0), ``output_tokens`` 0, ``output_tokens_details.reasoning_tokens`` 0,
  ``total_tokens``. Header ``x-request-id`` (the client's ``_request_id``).
* Errors: ``{"error": {"type", "code", "message"}}`` (the client raises ``BadRequestError`` 400,
  ``UnprocessableEntityError`` 422, ``APIStatusError`` 413 with ``.code``/``.type`` from it).
"""

from __future__ import annotations

import json
from typing import NamedTuple

from starlette.responses import JSONResponse
from starlette.routing import Route

from ... import questions as Q
from ..wire import Call, Json, Server, WireFormat, answer_extras, extras_flag, route

ROLES = ("user", "developer", "system", "assistant")
PART_TEXT = {"input_text": "text", "output_text": "text", "refusal": "refusal"}
#: Parts each role's content may hold (``decision_create_params``).
ROLE_PARTS = {"user": ("input_text", "input_json"), "developer": ("input_text",), "system": ("input_text",),
              "assistant": ("output_text", "refusal")}


def _parts_text(content: Json, allowed: tuple[str, ...], where: str) -> str:
    """Text of a string or a list of text parts (joined by a newline)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        raise Q.invalid(f"{where}: must be a string or a non-empty list of parts", "invalid_input")
    texts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "input_image":
            raise Q.invalid(f"{where}[{i}]: images are not supported; pcd labels text", "unsupported_content")
        if kind not in allowed:
            raise Q.invalid(f"{where}[{i}].type: must be one of {', '.join(allowed)}, got {json.dumps(kind)}",
                            "invalid_input")
        if kind == "input_json":
            data = part.get("data")
            if not isinstance(data, (dict, list)):
                raise Q.invalid(f"{where}[{i}].data: must be an object or an array of objects", "invalid_input")
            texts.append(Q.content_text(data))
            continue
        text = part.get(PART_TEXT[kind])
        if not isinstance(text, str):
            raise Q.invalid(f"{where}[{i}].{PART_TEXT[kind]}: must be a string", "invalid_input")
        texts.append(text)
    return "\n".join(texts)


def _json_parts(value: Json) -> list[tuple[str, Json]]:
    """``(where, data)`` of every ``input_json`` part of a (valid) Decisions ``input``."""
    out = []
    for i, item in enumerate(value if isinstance(value, list) else []):
        content = item.get("content") if isinstance(item, dict) else None
        for j, part in enumerate(content if isinstance(content, list) else []):
            if isinstance(part, dict) and part.get("type") == "input_json":
                out.append((f"input[{i}].content[{j}].data", part.get("data")))
    return out


def input_text(value: Json) -> str:
    """The record text of a Decisions ``input`` (module docstring).

    Raises:
        QuestionError: 422 naming the item: not a string or list, an unknown role, a function or tool
            call, an image, an empty result.
    """
    if isinstance(value, str):
        return Q.state_text(value, "input")
    if not isinstance(value, list) or not value:
        raise Q.invalid("input: must be a string or a non-empty list of messages", "invalid_input")
    messages = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise Q.invalid(f"{where}: must be a message object", "invalid_input")
        kind = item.get("type", "message")
        if kind != "message":
            raise Q.invalid(f"{where}.type: {json.dumps(kind)} is not supported; pcd labels text messages "
                            "(role and content)", "unsupported_input")
        role = item.get("role")
        if role not in ROLES:
            raise Q.invalid(f"{where}.role: must be one of {', '.join(ROLES)}, got {json.dumps(role)}", "invalid_input")
        messages.append((role, _parts_text(item.get("content"), ROLE_PARTS[role], f"{where}.content")))
    if len(messages) == 1 and messages[0][0] == "user":
        return Q.state_text(messages[0][1], "input[0].content")
    return Q.state_text("\n\n".join(f"{role}: {text}" for role, text in messages), "input")


#: The roles whose message in ``input`` could pass for policy; pcd reads them as data (``input_notes``).
POLICY_ROLES = ("system", "developer")


def input_notes(value: Json) -> list[str]:
    """What pcd's extras say about a (valid) Decisions ``input``: one note per ``system`` or
    ``developer`` message, naming it, that it was read as part of the record (data), not as
    instructions."""
    return [f"input[{i}] has role {item['role']!r}: pcd read it as part of the record to judge (quoted data), "
            "never as instructions; a decision's policy is its question's instructions"
            for i, item in enumerate(value if isinstance(value, list) else [])
            if isinstance(item, dict) and item.get("role") in POLICY_ROLES]


def _described(text: Json, where: str) -> str | None:
    if text is None:
        return None
    if not isinstance(text, str):
        raise Q.invalid(f"{where}: must be a string", "invalid_question")
    return text


def parse_question(i: int, raw: Json) -> tuple[Q.Question, tuple]:
    """One Decisions question -> ``(Question, typed values)``: the choice values as sent (str or
    bool) or the score level labels, to answer with; ``()`` for a predicate.

    Raises:
        QuestionError: 422 naming ``questions[i]``: not an object, unknown type, missing or bad
            instructions, choices or levels; a string and a boolean choice that read the same.
    """
    where = f"questions[{i}]"
    if not isinstance(raw, dict):
        raise Q.invalid(f"{where}: must be an object with a 'type'", "invalid_question")
    kind = raw.get("type")
    keys = {"predicate": ("type", "instructions", "name"), "choice": ("type", "instructions", "choices", "name"),
            "score": ("type", "instructions", "levels", "name")}
    if kind not in keys:
        raise Q.invalid(f"{where}.type: must be 'predicate', 'choice' or 'score', got {json.dumps(kind)}",
                        "invalid_question")
    unknown = [k for k in raw if k not in keys[kind]]
    if unknown:
        raise Q.invalid(f"{where}: unknown key {unknown[0]!r} (a {kind} question has {', '.join(keys[kind])})",
                        "invalid_question")
    name = raw.get("name")
    if name is not None and not isinstance(name, str):
        raise Q.invalid(f"{where}.name: must be a string", "invalid_question")
    if name is not None:
        where = f"{where} ({name!r})"
    if "instructions" not in raw:
        raise Q.invalid(f"{where}.instructions: required", "invalid_question")
    instructions = _parts_text(raw["instructions"], ("input_text", "input_json"), f"{where}.instructions")
    if kind == "predicate":
        return Q.Question(name, "noul", instructions, (("true", None), ("false", None)), where), ()
    if kind == "choice":
        choices = raw.get("choices")
        if not isinstance(choices, list):
            raise Q.invalid(f"{where}.choices: must be a list of {{value, description}}", "invalid_question")
        options, values, seen = [], [], {}
        for j, c in enumerate(choices):
            value = c.get("value") if isinstance(c, dict) else None
            if not isinstance(value, (str, bool)):
                raise Q.invalid(f"{where}.choices[{j}].value: must be a string or a boolean", "invalid_question")
            label = ("true" if value else "false") if isinstance(value, bool) else value
            if label in seen:
                raise Q.invalid(f"{where}.choices[{j}]: value {json.dumps(value)} repeats (or reads the same as) "
                                f"choices[{seen[label]}]; each choice must be unique", "invalid_question")
            seen[label] = j
            options.append((label, _described(c.get("description"), f"{where}.choices[{j}].description")))
            values.append(value)
        return Q.Question(name, "choice", instructions, tuple(options), where), tuple(values)
    levels = raw.get("levels")
    if not isinstance(levels, list):
        raise Q.invalid(f"{where}.levels: must be a list of {{label, description}}, lowest first", "invalid_question")
    options, labels = [], []
    for j, level in enumerate(levels):
        label = level.get("label") if isinstance(level, dict) else None
        if not isinstance(label, str):
            raise Q.invalid(f"{where}.levels[{j}].label: must be a string", "invalid_question")
        text = _described(level.get("description"), f"{where}.levels[{j}].description")
        options.append((str(j), label if not text else f"{label}: {text}"))
        labels.append(label)
    return Q.Question(name, "score", instructions, tuple(options), where), tuple(labels)


class DecisionsRequest(NamedTuple):
    """A ``/v1/decisions`` body, read (``parse_body``): the questions in request order, each
    question's typed values to answer with (``parse_question``), the record text (``input_text``),
    the ``pcd_extras`` flag, the ``pcd_prompt`` (``questions.prompt_flag``) and the notes on the
    input's system or developer messages (``input_notes``)."""

    questions: list[Q.Question]
    values: list[tuple]
    text: str
    extras: bool
    prompt: str
    notes: tuple[str, ...] = ()


def parse_body(body: Json, *, max_questions: int = Q.MAX_QUESTIONS) -> DecisionsRequest:
    """A Decisions request body -> ``DecisionsRequest``.

    Raises:
        QuestionError: 422 naming what is wrong; 413 for too many questions.
    """
    if not isinstance(body, dict):
        raise Q.invalid("the body must be a JSON object {model, input, questions}", "invalid_body")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise Q.invalid(f"model: must be a string, got {json.dumps(model)}", "invalid_model")
    extras = extras_flag(body)
    prompt = Q.prompt_flag(body)
    raw_questions = body.get("questions")
    if not isinstance(raw_questions, list) or not raw_questions:
        raise Q.invalid("questions: must be a non-empty list", "invalid_questions")
    if len(raw_questions) > max_questions:
        raise Q.too_large(f"questions: {len(raw_questions)} questions; this server answers at most {max_questions} "
                          "per request", "too_many_questions")
    text = input_text(body.get("input"))
    parsed = [parse_question(i, raw) for i, raw in enumerate(raw_questions)]
    names = [q.key for q, _ in parsed if q.key is not None]
    repeated = next((n for n in names if names.count(n) > 1), None)
    if repeated is not None:
        raise Q.invalid(f"questions: the name {repeated!r} is given to more than one question", "invalid_questions")
    for where, data in _json_parts(body.get("input")):  # a data-engine envelope sent as input_json
        Q.check_rows(data, [q for q, _ in parsed], where)
    return DecisionsRequest([q for q, _ in parsed], [values for _, values in parsed], text, extras, prompt,
                            tuple(input_notes(body.get("input"))))


def parse_request(body: Json, *, max_questions: int = Q.MAX_QUESTIONS) -> tuple[Q.QuestionSet, list[tuple], str, bool]:
    """A Decisions request body -> ``(QuestionSet, typed values per question, record text, extras)``:
    the whole request as one shared-catalog schema (``pcd_prompt: "shared"``).

    Raises:
        QuestionError: as ``parse_body``; 413/422 from ``questions.build``.
    """
    questions, values, text, extras, _, _ = parse_body(body, max_questions=max_questions)
    return Q.build(questions, max_questions=max_questions), values, text, extras


def render_answer(answer: Q.Answer, values: tuple, *, extras: bool = False) -> dict:
    """One Decisions answer (module docstring); ``values``: ``parse_question``'s typed values."""
    q = answer.question
    if q.kind == "noul":
        out: dict[str, object] = {"type": "predicate", "name": q.key, "probability": answer.probs[0]}
    elif q.kind == "choice":
        out = {"type": "choice", "name": q.key, "choice": values[answer.chosen], "confidence": answer.confidence,
               "probabilities": [{"value": v, "probability": p} for v, p in zip(values, answer.probs)]}
    else:
        out = {"type": "score", "name": q.key, "score": answer.score, "confidence": answer.confidence,
               "probabilities": [{"value": i, "label": label, "probability": p}
                                 for i, (label, p) in enumerate(zip(values, answer.probs))]}
    if extras:
        out["pcd"] = answer_extras(answer)
    return out


def routes(server: Server) -> list[Route]:
    """``POST /v1/decisions`` over ``server.service``; questions bounded as ``jev.routes``."""

    async def decisions(call: Call) -> JSONResponse:
        """Answer an OpenAI Decisions request (module docstring)."""
        body = await call.body()
        max_questions = call.max_questions(Q.MAX_QUESTIONS)
        req = parse_body(body, max_questions=max_questions)
        found, tokens, envelope = await call.decide(req.questions, req.text, req.text, req.prompt,
                                                    max_questions=max_questions)
        out: dict[str, object] = {
            "answers": [render_answer(a, v, extras=req.extras) for a, v in zip(found, req.values)],
            "model": call.service.model_id,
            "usage": {"input_tokens": tokens, "input_tokens_details": {"cache_write_tokens": 0, "cached_tokens": 0},
                      "output_tokens": 0, "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": tokens}}
        if req.extras:
            out["pcd"] = {**envelope, "notes": list(req.notes)}
        return JSONResponse(out)

    return [route(server, "/v1/decisions", decisions, "POST")]


#: The OpenAI Decisions format: its route (the ``openai`` client reads the request id under
#: ``x-request-id``, which every response carries) and the headers the ``openai`` SDK sends.
FORMAT = WireFormat("decisions", routes,
                    client_headers=frozenset({"idempotency-key", "openai-organization", "openai-project", "openai-beta"}),
                    client_header_prefixes=("x-stainless-",))
