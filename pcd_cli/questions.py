"""Decision questions -> pcd schemas, and decoded fields -> answers: the decision domain, the one
translation shared by the server's Jev / System One format (``server/formats/jev.py``) and its
OpenAI Decisions format (``server/formats/decisions.py``). It knows nothing of HTTP: a bad question
raises ``QuestionError`` with a ``code``, which the server maps to a status; ``plan`` cuts a
request into units the server submits, and ``decoded`` turns their results into answers.

Each wire format parses its own request into ``Question`` values (in request order); this module
turns them into pcd-format schema dicts a YAML schema file would hold, validates them with
``pcd_cli.schema.load.parse_schema`` (so ``/v1/label`` with such a dict written to a file decodes the
same prompt and gives the same probabilities), and turns each ``FieldResult`` back into the numbers
both APIs answer with (``Answer``). Two prompts (``PROMPTS``, chosen per request by ``pcd_prompt``):

* **isolated** (the default; issue #35, docs/architecture.md: a decision is a function of its record and its
  question): each distinct question is its own one-field schema (``question_data``: field
  ``answer``, the request's key left out, a choice's options in ``canonical_order``), asked in its
  own branch after the state (``isolate_fields``: the state is fed once, each question's catalog
  line and answer attend to it and to nothing else; ``plan``, ``decide``); duplicates are decoded
  once; a data-engine batch (``split_rows``) is cut into one record per row. A question's
  probabilities are then those of the question asked alone, whatever else the request holds
  (equal within packing's float rounding).
* **shared**: the whole request one schema (``build``: ``QuestionSet``), every question a field,
  all in one catalog: cheaper, but each answer then depends on the other questions.

Rules (docs/serve.md, "Jev and OpenAI clients"):

* **Fields** (shared prompt), one per question, in request order: a yes/no question (Jev ``noul``, OpenAI
  ``predicate``) is a ``boolean``; a choice is an ``enum`` whose labels are the options in request
  order (2 to ``MAX_CHOICE_OPTIONS``); a score is an ``ordinal`` with the labels ``"0".."N-1"``
  (``MIN_SCORE_LEVELS`` to ``MAX_SCORE_LEVELS`` levels).
* **Field names** (``field_names``): the request's key as it is, unless it has no visible
  character, starts with ``__`` (pcd's own output columns), or is another key plus one of pcd's
  output suffixes (``a`` and ``a__prob``); such a key becomes ``q<position>`` (1-based), with
  ``_`` appended until it is free. Answers are mapped back by position.
* **Descriptions** (``description``): the instructions, then one part per described option:
  ``true: <text>`` / ``false: <text>`` for a yes/no question, ``"<label>": <text>`` for a choice
  option and for every score level (the label as the prompt's catalog spells it). Each part is
  content text (``content_text``) with every run of whitespace made one space and a ``.`` added
  unless it already ends in ``. ? ! : ;``; parts are joined with one space.
* **The record** (``state_text``): a string as it is (surrounding whitespace stripped, as
  ``pcd label`` strips every text); an object or array as ``json.dumps(state, ensure_ascii=False)``
  (key order kept, ``", "`` and ``": "`` separators).
* **Numbers** (``Answer``): probabilities are the float32 values ``pcd label`` writes in
  ``<f>__probs`` (so ``/v1/label`` with the same schema gives the same numbers), as JSON floats; a choice's ``confidence`` is ``(N·p_max − 1)/(N − 1)`` (0 for a uniform
  distribution, 1 for a certain one); a score is ``Σ i·p_i`` and its confidence
  ``1 − Var/Var_max`` with ``Var = Σ p_i (i − score)²`` and ``Var_max = (N − 1)²/4`` (the variance of
  half the mass on each end of the scale): 1 when one level has all the mass, 0 when it is split
  between the two ends. Both are clipped to [0, 1] against rounding.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .errors import InputError, SchemaError
from .results import FieldResult, Record
from .schema.load import parse_schema
from .schema.model import MAX_MULTI_OPTIONS, OUTPUT_SUFFIXES, Schema, json_string

#: Most options a choice question may have (the OpenAI Decisions API's own limit; one byte per label).
MAX_CHOICE_OPTIONS = 255
#: Fewest and most levels a score question may have (issue #27).
MIN_SCORE_LEVELS, MAX_SCORE_LEVELS = 2, 10
#: Most questions one request may ask (the OpenAI Decisions API's limit); the server's
#: ``--max-records-per-request`` lowers it.
MAX_QUESTIONS = 400
#: Most ``first question's options × later questions' options`` in one request: pcd compiles every
#: later question after each answer the first can write (``CompiledSchema.seam_moves``, for both
#: layouts), so the compile cost grows with this product (255 × 16 is a few seconds of the worker's
#: time on a 2-core CPU; 255 × 256 was a minute, during which no other request is decoded).
MAX_ANSWER_CONTEXTS = 4096
#: Question sets whose schema is kept built (``build``); the core's compile cache is separate.
CACHE_SIZE = 64
#: The kinds of question, as pcd fields.
KINDS = {"noul": "boolean", "choice": "enum", "score": "ordinal", "pcd_multi": "multi"}
#: pcd's multi-select question (``{"type": "pcd_multi", "instructions"?, "criteria": {option:
#: description | null}}``, an opt-in extension of ``/v1/systemone`` that the official client skips
#: in its typed views): 2 to ``MAX_MULTI_OPTIONS`` options, each its own yes/no decision.
MULTI = "pcd_multi"
_END = (".", "?", "!", ":", ";")


class QuestionError(InputError):
    """A decision request pcd cannot answer: a malformed question, state or flag, or more
    questions, options or levels than allowed. The message names the question (``q.where``) and
    the problem; ``code`` says which (``invalid_state``, ``too_few_options``,
    ``too_many_questions``, ...). The server answers it by its code (``server.errors.ANSWERS``:
    413 for a limit, 422 otherwise); this module knows nothing of HTTP."""

    def __init__(self, message: str, code: str = "invalid_request"):
        super().__init__(message)
        self.code = code
        self.message = message


def invalid(message: str, code: str = "invalid_request") -> QuestionError:
    """A request that is well-formed but invalid (``code`` names what)."""
    return QuestionError(message, code)


def too_large(message: str, code: str = "too_large") -> QuestionError:
    """More questions, options or levels than allowed (``code`` names which limit)."""
    return QuestionError(message, code)


@dataclass(frozen=True)
class Question:
    """One question, parsed from either wire format.

    Attributes:
        key: the request's name for it (Jev: its key; OpenAI: its ``name``, else ``None``).
        kind: ``noul`` (yes/no), ``choice`` or ``score``.
        instructions: the question's text (``content_text`` of what was sent), or ``None``.
        options: ``(label, description text or None)`` per option, in request order; a yes/no
            question's are ``("true", ...)`` and ``("false", ...)``; a score's labels are
            ``"0".."N-1"``.
        where: how messages name it (``question 'tone'``, ``questions[2]``).
    """

    key: str | None
    kind: str
    instructions: str | None
    options: tuple[tuple[str, str | None], ...]
    where: str


def content_text(value: Any) -> str:
    """Text of a content value: a string as it is; an object or array as its JSON text
    (``json.dumps(value, ensure_ascii=False)``: key order kept, ``", "``/``": "`` separators)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def state_text(state: Any, where: str = "state") -> str:
    """The record text of a request's state: a string stripped of surrounding whitespace (as
    ``pcd label`` strips every text), an object or array as ``content_text``.

    Raises:
        QuestionError: when the state is missing, not a string, object or array, or empty.
    """
    if not isinstance(state, (str, dict, list)):
        got = "missing" if state is None else f"a {_json_type(state)}"
        raise invalid(f"{where}: must be a string, an object or an array, got {got}", "invalid_state")
    text = content_text(state).strip()
    if not text:
        raise invalid(f"{where}: is empty; give the text to label", "invalid_state")
    return text


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if value is None:
        return "null"
    return {dict: "object", list: "array", str: "string"}.get(type(value), type(value).__name__)


def _sentence(text: str) -> str:
    """``text`` with every run of whitespace one space, ending in ``. ? ! : ;`` (``.`` added)."""
    text = " ".join(text.split())
    return text if not text or text.endswith(_END) else text + "."


def description(question: Question) -> str:
    """The pcd field description of ``question`` (module docstring, "Descriptions")."""
    parts = [question.instructions or ""]
    for label, text in question.options:
        if text is None or not text.strip():
            continue
        spelled = label if question.kind == "noul" else json_string(label)
        parts.append(f"{spelled}: {text}")
    return " ".join(s for s in map(_sentence, parts) if s)


def field_names(keys: list[str | None]) -> tuple[str, ...]:
    """A valid, distinct pcd field name per question key (module docstring, "Field names").

    ``None`` (an unnamed OpenAI question) always takes the ``q<position>`` form.
    """
    given = [k for k in keys if isinstance(k, str)]
    taken = set(given)

    def extends(name: str, others) -> bool:  # name is another name plus an output suffix
        return any(name == o + s for o in others if o != name for s in OUTPUT_SUFFIXES)

    names: list[str] = []
    for i, key in enumerate(keys):
        if isinstance(key, str) and key.strip() and not key.startswith("__") and not extends(key, given):
            names.append(key)
            continue
        name = f"q{i + 1}"
        while name in taken or extends(name, taken) or any(extends(o, {name}) for o in taken):
            name += "_"
        taken.add(name)
        names.append(name)
    return tuple(names)


def schema_data(questions: list[Question], names: tuple[str, ...]) -> dict:
    """The pcd-format schema dict for ``questions`` (as a YAML schema file would hold it)."""
    fields: dict[str, dict] = {}
    for q, name in zip(questions, names):
        spec: dict[str, Any] = {"type": KINDS[q.kind], "description": description(q)}
        if q.kind != "noul":
            spec["labels"] = [label for label, _ in q.options]
        fields[name] = spec
    canonical = json.dumps(fields, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return {"name": "questions_" + hashlib.sha256(canonical.encode()).hexdigest()[:12], "fields": fields}


def check_limits(questions: list[Question], max_questions: int = MAX_QUESTIONS, *, shared: bool = True) -> None:
    """Refuse a question set pcd does not take, naming the question.

    Raises:
        QuestionError: ``too_many_questions`` for more than ``max_questions`` questions, or a first question's
            options times the later questions' over ``MAX_ANSWER_CONTEXTS`` (only for a ``shared``
            prompt: an isolated question is its own schema, with no later questions); 422
            ``invalid_request`` naming the limit for a choice over ``MAX_CHOICE_OPTIONS`` options or a
            score over ``MAX_SCORE_LEVELS`` levels (the Jev contract's validation: a question's
            shape, not a body size or count); 422 for no questions,
            a choice with fewer than two options or a score with fewer than ``MIN_SCORE_LEVELS``,
            and option labels pcd cannot tell apart (empty, only whitespace, or equal once their
            surrounding whitespace is stripped).
    """
    if not questions:
        raise invalid("questions: give at least one question", "no_questions")
    if len(questions) > max_questions:
        raise too_large(f"questions: {len(questions)} questions; this server answers at most {max_questions} "
                        "per request", "too_many_questions")
    for q in questions:
        n = len(q.options)
        if q.kind == MULTI and shared:
            raise invalid(f"{q.where}: a {MULTI} question is decoded on its own; drop \"pcd_prompt\": \"shared\"",
                          "invalid_question")
        if q.kind in ("choice", MULTI):
            most, what = (MAX_CHOICE_OPTIONS, "a choice") if q.kind == "choice" else (MAX_MULTI_OPTIONS, f"a {MULTI}")
            if n > most:  # the contract's limit on a question, not a size: 422 (413 is for bodies and counts)
                raise invalid(f"{q.where}: {n} options; {what} may have at most {most} options")
            if n < 2:
                raise invalid(f"{q.where}: {what} needs at least 2 options, got {n}", "too_few_options")
            seen: dict[str, str] = {}
            for label, _ in q.options:
                if not label.strip():
                    raise invalid(f"{q.where}: option {label!r} is empty or only whitespace; give it a name",
                                  "invalid_option")
                if label.strip() in seen:
                    raise invalid(f"{q.where}: options {seen[label.strip()]!r} and {label!r} differ only by "
                                  "surrounding whitespace; the model reads them as the same word", "invalid_option")
                seen[label.strip()] = label
        elif q.kind == "score":
            if n > MAX_SCORE_LEVELS:
                raise invalid(f"{q.where}: {n} levels; a score may have at most {MAX_SCORE_LEVELS} levels")
            if n < MIN_SCORE_LEVELS:
                raise invalid(f"{q.where}: a score needs {MIN_SCORE_LEVELS} to {MAX_SCORE_LEVELS} levels, got {n}",
                              "too_few_levels")
    first, later = len(questions[0].options), sum(len(q.options) for q in questions[1:])
    if shared and first * later > MAX_ANSWER_CONTEXTS:
        raise too_large(f"questions: the first question ({questions[0].where}) has {first} options and the later ones "
                        f"{later} in all; pcd prepares every later question after each answer to the first "
                        f"({first} × {later} = {first * later}, at most {MAX_ANSWER_CONTEXTS} per request): ask a "
                        "question with few options first, or split the request", "too_many_options")


@dataclass(frozen=True)
class QuestionSet:
    """A request's questions as one pcd schema.

    Attributes:
        questions: the parsed questions, in request order (one pcd field each, same order).
        names: the pcd field name of each question (``field_names``).
        data: the pcd-format schema dict (``schema_data``): ``parse_schema(data)`` is ``schema``.
        schema: the validated schema; its ``source_sha256`` is the same for every request that
            asks the same questions, so they share a compiled decoder.
    """

    questions: tuple[Question, ...]
    names: tuple[str, ...]
    data: dict
    schema: Schema


_cache: OrderedDict[str, QuestionSet] = OrderedDict()
_cache_lock = threading.Lock()


def build(questions: list[Question], *, max_questions: int = MAX_QUESTIONS) -> QuestionSet:
    """Check ``questions`` (``check_limits``) and build their schema; the last ``CACHE_SIZE``
    distinct question sets are kept built.

    Raises:
        QuestionError: ``too_*`` / invalid from ``check_limits``; 422 when pcd's schema rules refuse the set
            (the message is pcd's, naming the field).
    """
    check_limits(questions, max_questions)
    names = field_names([q.key for q in questions])
    data = schema_data(questions, names)
    key = json.dumps(data, ensure_ascii=False)
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return QuestionSet(tuple(questions), names, hit.data, hit.schema)
    try:
        schema = parse_schema(data, default_name=data["name"], source="questions")
    except SchemaError as exc:
        raise invalid(f"questions: {exc}", "invalid_questions") from None
    built = QuestionSet(tuple(questions), names, data, schema)
    with _cache_lock:
        _cache[key] = built
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return built


def record(text: str, request_id: str) -> Record:
    """The one record of a request (its id is the request id)."""
    return Record(request_id, text)


@dataclass(frozen=True)
class Answer:
    """The numbers both APIs answer one question with.

    Attributes:
        question: the question.
        probs: probability of each option, in request order (yes/no: ``(P(true), P(false))``),
            rounded to float32 as ``pcd label`` writes them.
        chosen: index of the most probable option (``FieldResult.label``).
        confidence: choice and score (module docstring, "Numbers"); ``None`` for yes/no.
        score: ``Σ i·p_i`` for a score, else ``None``.
        mass: pcd's candidate mass (unrenormalised probability of every allowed path).
        raw_probs: the decoder's probabilities before calibration or prior correction (the same
            as ``probs`` when neither is applied).
        steered: the steering check moved the answer (``pcd_cli.steering``): it is the answer to
            the state without the sentences that address the labeller.
    """

    question: Question
    probs: tuple[float, ...]
    chosen: int
    confidence: float | None
    score: float | None
    mass: float
    raw_probs: tuple[float, ...]
    steered: bool = False

    @property
    def labels(self) -> tuple[str, ...]:
        """The pcd labels of the question's options, in request order."""
        return tuple(label for label, _ in self.question.options)


def choice_confidence(probs: tuple[float, ...]) -> float:
    """``(N·p_max − 1)/(N − 1)`` clipped to [0, 1]; ``N`` options, ``N >= 2``."""
    n = len(probs)
    return _clip((n * max(probs) - 1.0) / (n - 1))


def expected_score(probs: tuple[float, ...]) -> float:
    """``Σ i·p_i`` over levels ``0..N-1``."""
    return float(sum(i * p for i, p in enumerate(probs)))


def score_confidence(probs: tuple[float, ...]) -> float:
    """``1 − Var/Var_max``, ``Var = Σ p_i (i − score)²``, ``Var_max = (N − 1)²/4``; clipped to [0, 1]."""
    mean = expected_score(probs)
    var = sum(p * (i - mean) ** 2 for i, p in enumerate(probs))
    return _clip(1.0 - var / ((len(probs) - 1) ** 2 / 4.0))


def _clip(x: float) -> float:
    return float(min(1.0, max(0.0, x))) if math.isfinite(x) else 0.0


def answers(qs: QuestionSet, fields: tuple[FieldResult, ...]) -> list[Answer]:
    """One ``Answer`` per question from a record's decoded fields (schema order = question order):
    the shared prompt."""
    return [answer(q, f) for q, f in zip(qs.questions, fields)]


# -- isolation: each question its own one-field schema (the default on the decision endpoints) --------

#: How a request's questions are put to the model: ``isolated`` (the default: each distinct question
#: is its own one-question schema, so its answer is that of the question asked alone) or ``shared``
#: (the whole request one schema, every question in one catalog: cheaper, but an answer then depends
#: on the other questions). A request chooses with the top-level body key ``PROMPT_FLAG``.
PROMPTS = ("isolated", "shared")
DEFAULT_PROMPT = "isolated"
#: The request key (an opt-in extension both official clients send with ``extra_body``).
PROMPT_FLAG = "pcd_prompt"
#: The field name every isolated question is asked under: the request's key never enters the
#: prompt, so the same question under two keys is the same prompt (and is decoded once).
ISOLATED_FIELD = "answer"


def prompt_flag(body: dict) -> str:
    """The ``pcd_prompt`` of a request body (absent: ``DEFAULT_PROMPT``).

    Raises:
        QuestionError: when it is not one of ``PROMPTS``.
    """
    value = body.get(PROMPT_FLAG, DEFAULT_PROMPT)
    if value not in PROMPTS:
        raise invalid(f"{PROMPT_FLAG}: must be {' or '.join(map(json.dumps, PROMPTS))}, got {json.dumps(value)}",
                      "invalid_flag")
    return value


def canonical_order(question: Question) -> tuple[int, ...]:
    """The prompt's option order for ``question``: ``order[i]`` is the request index of the option the
    prompt lists ``i``-th. A choice's (and a ``pcd_multi``'s) options sorted by label (Unicode code
    points), so a permutation of the request's options is the same prompt. A score keeps its levels
    in scale order (the order is their meaning) but reads the scale in one canonical direction: as
    sent, or reversed when the reversed level texts sort first, so a scale sent lowest-first and the
    same scale sent highest-first are one prompt (the answer is mirrored back: JevBench's
    ``option_permutation`` reverses scores). A yes/no question is ``true, false``."""
    n = len(question.options)
    if question.kind == "score":  # one scale, read in the direction whose level texts sort first
        texts = tuple(text or "" for _, text in question.options)
        return tuple(range(n - 1, -1, -1)) if texts[::-1] < texts else tuple(range(n))
    if question.kind not in ("choice", MULTI):
        return tuple(range(n))
    return tuple(sorted(range(n), key=lambda i: question.options[i][0]))


def question_data(question: Question) -> tuple[dict, tuple[int, ...]]:
    """The one-question pcd schema dict that ``question`` is decoded with when isolated, and its
    ``canonical_order``. The dict depends only on the question's kind, instructions and options as a
    set (a choice) or a scale read either way (a score): never on its key, its place in the request or its
    neighbours. Field ``ISOLATED_FIELD``; description and labels as ``schema_data`` writes them, in
    canonical order (a score's levels renumbered ``"0".."N-1"`` in the direction read)."""
    order = canonical_order(question)
    options = tuple(question.options[i] for i in order)
    if question.kind == "score":  # levels are numbered by their place on the scale as read
        options = tuple((str(place), text) for place, (_, text) in enumerate(options))
    canonical = Question(None, question.kind, question.instructions, options, question.where)
    return schema_data([canonical], (ISOLATED_FIELD,)), order


def _schema(data: dict, isolated_key: str | None = None) -> Schema:
    """``parse_schema(data)`` (with ``Schema.isolated_key`` set), the last ``CACHE_SIZE`` kept
    (keyed by the dict's JSON text).

    Raises:
        QuestionError: when pcd's schema rules refuse it.
    """
    key = json.dumps([data, isolated_key], ensure_ascii=False)
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit.schema
    try:
        schema = parse_schema(data, default_name=data["name"], source="questions")
    except SchemaError as exc:
        raise invalid(f"questions: {exc}", "invalid_questions") from None
    if isolated_key is not None:
        schema = replace(schema, isolated_key=isolated_key)
    with _cache_lock:
        _cache[key] = QuestionSet((), (), data, schema)
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return schema


# -- data-engine envelopes: a state's ``rows`` array with one question per row -----------------------

#: The instructions Daft's ``jev_prob``/``jev`` (``noul``), ``jev_choice`` (``choice``) and
#: ``jev_score`` (``score``) write for row ``k`` (``daft/functions/jev.py``, batches of 25 rows keyed
#: ``r0``..``r24``, the state ``{**state, "rows": rows}``): ``(kind, regex)``; group 1 is ``k``,
#: group 2 (when present) the user's question, which must be the same for every row.
ROW_INSTRUCTIONS = (
    ("noul", re.compile(r"Does the record rows\[(0|[1-9][0-9]*)\] satisfy the condition stated in condition\?",
                        re.DOTALL)),
    ("choice", re.compile(r"For the record rows\[(0|[1-9][0-9]*)\]: (.*)", re.DOTALL)),
    ("score", re.compile(r"Rate the record rows\[(0|[1-9][0-9]*)\]: (.*)", re.DOTALL)),
)


def check_rows(state: Any, questions: list[Question], where: str = "state") -> None:
    """Refuse a question about a data-engine row that holds no value: a question whose
    instructions name ``rows[k]`` (``ROW_INSTRUCTIONS``, what Daft's ``jev*`` functions write)
    while ``state["rows"][k]`` is JSON ``null`` or missing. Such a row has no answer, and decoding
    the envelope around it would invent a probability; Daft leaves null rows out of its request
    and answers them null itself (``daft/functions/jev.py`` ``_Jev._ask``). Rows of any other
    type (a number, an object from ``to_struct``) are values and are answered.

    Raises:
        QuestionError: 422 ``null_row`` naming ``<where>.rows[k]`` and the question.
    """
    rows = state.get("rows") if isinstance(state, dict) else None
    if not isinstance(rows, list):
        return
    for q in questions:
        for _, template in ROW_INSTRUCTIONS:
            match = template.fullmatch(q.instructions or "")
            if match is None:
                continue
            k = int(match.group(1))
            if k >= len(rows):
                raise invalid(f"{where}.rows[{k}]: no such row ({q.where} asks about it; rows has {len(rows)})",
                              "null_row")
            if rows[k] is None:
                raise invalid(f"{where}.rows[{k}]: is null ({q.where} asks about it); a null row has no answer: "
                              "leave it out of the request and answer it null yourself, as Daft's jev functions "
                              "do", "null_row")
            break


def split_rows(state: Any, questions: list[Question]) -> list[tuple[Any, Question]] | None:
    """A data-engine batch cut into one-row requests, or ``None`` when ``state`` and ``questions``
    are not exactly such a batch.

    Recognised (only what is certain, the envelope Daft's ``jev*`` functions send): ``state`` is an
    object with a ``rows`` array of ``n >= 2`` items; there are ``n`` questions keyed ``r0``..``r<n-1>``
    in that order, all of one kind with the same options, whose instructions are one template of
    ``ROW_INSTRUCTIONS`` naming ``rows[k]`` for the question keyed ``r<k>``, with the same question
    text in every row. Row ``k`` then becomes the request that client sends for that row alone: the
    state with ``rows`` holding only that row (other keys and their order kept) and the question
    naming ``rows[0]``, so its answer is the same whatever batch or position the row came in.

    Returns:
        ``(state, question)`` per row, in row order; ``None`` when anything differs (the request is
        then decoded as written).
    """
    if not isinstance(state, dict) or not isinstance(state.get("rows"), list):
        return None
    rows = state["rows"]
    n = len(rows)
    if n < 2 or len(questions) != n or [q.key for q in questions] != [f"r{k}" for k in range(n)]:
        return None
    first = questions[0]
    template = next((rx for kind, rx in ROW_INSTRUCTIONS if kind == first.kind), None)
    if template is None:
        return None
    rest = None
    for k, q in enumerate(questions):
        match = template.fullmatch(q.instructions or "")
        if (match is None or int(match.group(1)) != k or q.kind != first.kind or q.options != first.options):
            return None
        text = match.group(2) if match.lastindex and match.lastindex >= 2 else ""
        if rest is None:
            rest = text
        elif text != rest:
            return None
    out = []
    span = template.fullmatch(first.instructions).span(1)
    for k, row in enumerate(rows):
        one = {key: ([row] if key == "rows" else value) for key, value in state.items()}
        text = first.instructions[:span[0]] + "0" + first.instructions[span[1]:]
        out.append((one, Question("r0", first.kind, text, first.options, f"question 'r{k}'")))
    return out


# -- the plan: which one-question schemas are decoded over which records --------------------------

@dataclass(frozen=True)
class Unit:
    """One ``LabelService.submit`` of an isolated request: the schema of a set of distinct questions
    (``isolated_schema``: one isolated field each, sorted by question) and the distinct record texts
    they are asked about (one state for an ordinary request; one per row of a data-engine batch).
    Units of concurrent requests with the same question set share a compiled decoder and pass."""

    schema: Schema
    texts: tuple[str, ...]


@dataclass(frozen=True)
class Pick:
    """Where a question's answer comes from: ``unit``'s record ``record``, declared field ``field``,
    with ``order`` mapping the prompt's option positions to the request's (``canonical_order``);
    ``sha256``: the question's own one-question schema's hash (``question_data``)."""

    unit: int
    record: int
    order: tuple[int, ...]
    field: int = 0
    sha256: str = ""


@dataclass(frozen=True)
class Plan:
    """An isolated request: its questions (request order), the units to decode and, per question,
    its ``Pick``. Duplicate questions (the same schema over the same record) share a pick's unit and
    record: they are decoded once and answered alike.

    Attributes:
        rows: how many rows a data-engine batch was cut into (``split_rows``); 0 when none.
    """

    questions: tuple[Question, ...]
    units: tuple[Unit, ...]
    picks: tuple[Pick, ...]
    rows: int = 0


def plan(questions: list[Question], state: Any, *, max_questions: int = MAX_QUESTIONS) -> Plan:
    """The isolated plan of a request: per distinct record text (``state_text`` of the state, or of
    its row's one-row state for a data-engine batch, ``split_rows``), the distinct questions asked
    about it (``question_data``); texts asked the same question set share a unit, whose schema
    has one isolated field per question (``isolated_schema``). The state is fed once for all its
    questions; each question's branch sees the state and itself only.

    Raises:
        QuestionError: ``too_*`` / invalid from ``check_limits`` (without the answer-context limit, which only a
            shared prompt has), ``state_text`` or pcd's schema rules.
    """
    check_limits(questions, max_questions, shared=False)
    split = split_rows(state, questions)
    asked = split if split is not None else [(state, q) for q in questions]
    by_text: dict[str, dict[str, dict]] = {}  # record text -> {question key: its schema dict}
    raw = []
    for one_state, q in asked:
        text = state_text(one_state)
        data, order = question_data(q)
        by_text.setdefault(text, {})[data["name"]] = data
        raw.append((text, data["name"], order))
    sets: dict[tuple[str, ...], list[str]] = {}  # sorted question keys -> the texts asked exactly those
    for text, datas in by_text.items():
        sets.setdefault(tuple(sorted(datas)), []).append(text)
    units, where = [], {}
    for u, (keys, texts) in enumerate(sets.items()):
        units.append(Unit(isolated_schema([by_text[texts[0]][k] for k in keys]), tuple(texts)))
        for r, text in enumerate(texts):
            for f, key in enumerate(keys):
                where[(text, key)] = (u, r, f)
    digests: dict[str, str] = {}  # question key -> its one-question schema dict's sha256, hashed once
    picks = []
    for text, key, order in raw:
        if key not in digests:
            digests[key] = hashlib.sha256(json.dumps(by_text[text][key], ensure_ascii=False,
                                                     sort_keys=True).encode()).hexdigest()
        u, r, f = where[(text, key)]
        picks.append(Pick(u, r, order, f, digests[key]))
    return Plan(tuple(questions), tuple(units), tuple(picks), len(asked) if split is not None else 0)


def isolated_schema(datas: list[dict]) -> Schema:
    """The schema of a unit: one field per question schema dict (``question_data``) in the order
    given, named by the dict's ``name``, with ``isolate_fields`` and every branch asked under the
    key ``ISOLATED_FIELD`` (``Schema.isolated_key``): each field's branch is the prompt of its
    question asked alone.

    Raises:
        QuestionError: when pcd's schema rules refuse it.
    """
    fields = {d["name"]: d["fields"][ISOLATED_FIELD] for d in datas}
    canonical = json.dumps(fields, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return _schema({"name": "isolated_" + hashlib.sha256(canonical.encode()).hexdigest()[:12], "fields": fields,
                    "isolate_fields": True}, isolated_key=ISOLATED_FIELD)


def answer(question: Question, f: FieldResult, order: tuple[int, ...] | None = None) -> Answer:
    """The ``Answer`` to ``question`` from its decoded field ``f``; ``order`` maps the prompt's option
    positions to the request's (``None``: the same order)."""
    probs = [float(np.float32(p)) for p in f.probs]
    raw = [float(np.float32(p)) for p in f.raw_probs] if f.raw_probs is not None else list(probs)
    label = int(f.label)
    if order is not None:
        back = [0.0] * len(order)
        raw_back = [0.0] * len(order)
        for i, j in enumerate(order):
            back[j], raw_back[j] = probs[i], raw[i]
        probs, raw, label = back, raw_back, order[label]
    probs_t = tuple(probs)
    conf = score = None
    if question.kind == "choice":
        conf = choice_confidence(probs_t)
    elif question.kind == "score":
        score, conf = expected_score(probs_t), score_confidence(probs_t)
    return Answer(question, probs_t, label, conf, score, float(np.float32(f.mass)), tuple(raw), bool(f.steered))


def multi_answer(question: Question, fields, order: tuple[int, ...]) -> Answer:
    """The ``Answer`` to a ``pcd_multi`` question from its option decisions (``fields``, one
    boolean ``FieldResult`` per option in prompt order): ``probs`` holds each option's P(yes) in
    request order, ``chosen`` the most probable option, ``mass`` the options' mean candidate mass."""
    yes, raw = [0.0] * len(order), [0.0] * len(order)
    for f, j in zip(fields, order):  # an option decision's labels are ("true", "false")
        yes[j] = float(np.float32(f.probs[0]))
        raw[j] = float(np.float32(f.raw_probs[0])) if f.raw_probs is not None else yes[j]
    mass = float(np.float32(np.mean([f.mass for f in fields])))
    return Answer(question, tuple(yes), int(np.argmax(yes)), None, None, mass, tuple(raw),
                  any(bool(f.steered) for f in fields))


def plan_answers(p: Plan, results: list[list]) -> list[Answer]:
    """One ``Answer`` per question of ``p`` from ``results[u][r]``, the ``RecordResult`` of unit
    ``u``'s record ``r``."""
    out = []
    for q, pick in zip(p.questions, p.picks):
        decided = results[pick.unit][pick.record].fields
        fields = [decided[i] for i in p.units[pick.unit].schema.parts[pick.field]]
        out.append(multi_answer(q, fields, pick.order) if q.kind == MULTI else answer(q, fields[0], pick.order))
    return out


@dataclass
class Decoded:
    """What ``decide`` returns: the answers and what they cost.

    Attributes:
        answers: one per question, request order.
        input_tokens: record tokens decoded, summed over the units (a state asked ``Q`` distinct
            questions counts ``Q`` times: it is read once per question).
        truncated: any record was truncated to fit the model.
        queue_ms: the longest queue wait of the units; decode_ms: their decode calls' time, summed.
        schema_sha256: per question, the sha256 of its one-question schema dict (``question_data``).
        units: distinct questions decoded (summed over the units).
    """

    answers: list[Answer]
    input_tokens: int
    truncated: bool
    queue_ms: float
    decode_ms: float
    schema_sha256: list[str]
    rows: int = 0
    units: int = 0

    def extras(self, prompt: str = "isolated") -> dict:
        """The top-level ``pcd`` object of a response that asked for extras."""
        return {"truncated": self.truncated, "prompt": prompt, "schema_sha256": self.schema_sha256,
                "decoded_questions": self.units, "rows": self.rows, "queue_ms": self.queue_ms,
                "decode_ms": self.decode_ms, "steered": sum(a.steered for a in self.answers)}


def unit_records(p: Plan, u: int, request_id: str) -> list[Record]:
    """The records of unit ``u`` of ``p``, named after ``request_id`` (the id itself when the
    plan is one record, else ``<id>/<unit>.<row>``)."""
    unit = p.units[u]
    one = len(p.units) == 1 and len(unit.texts) == 1
    return [Record(request_id if one else f"{request_id}/{u}.{r}", t) for r, t in enumerate(unit.texts)]


def decoded(p: Plan, done: list) -> Decoded:
    """The answers of ``p`` from its units' decode results (``done[u]``: the
    ``server.service.SubmitResult`` of unit ``u``, every record decoded), and what they cost."""
    results = [list(d.results) for d in done]
    return Decoded(plan_answers(p, results), sum(int(d.input_tokens) for d in done),
                   any(bool(r.truncated) for per_unit in results for r in per_unit),
                   max(float(d.queue_ms or 0.0) for d in done),
                   sum(float(d.decode_ms or 0.0) for d in done),
                   [pick.sha256 for pick in p.picks], p.rows, sum(len(u.schema.declared) for u in p.units))
