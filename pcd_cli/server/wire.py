"""What every wire format shares (``formats/``): the declaration of a format (``WireFormat``: its
routes and the headers its clients read and send), the typed request context ``Call`` (the service,
the app's config, the request's ids and arrival; ``submit`` and ``decide`` with the deadline
counted from the request's arrival and the client-gone check), ``route`` (a format's handler as a
Starlette route: a crash becomes 500 ``internal_error``, logged without its text), and reading a
bounded, checked JSON body (``read_json``).

A wire format is one module of ``formats/`` of one shape, declared once as its ``FORMAT``
(a ``WireFormat``): ``routes(server) -> list[Route]``, each route a ``route(path, handler, method)``
whose handler takes a ``Call``, reads the body into the format's typed request (schema and records,
or questions and a state, and options), submits it through the ``Call``, and renders the typed
results (``RecordResult``, ``questions.Answer``) as its body; plus the response header its client
reads the request id from and the request headers its clients send (``app.create_app`` and the
middleware read them from the declaration). Errors are raised, never rendered (``errors.HANDLERS``):
the service's kinds (``service_errors``) are mapped to statuses by ``errors.ANSWERS``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Awaitable, Callable, Sequence, TypeAlias

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from ..results import Record, RecordFailure, RecordResult
from ..schema.model import Schema
from . import limits
from .errors import ANSWERED, ApiError, ClientDisconnected, internal_error, log_crash, log_id, printable
from .service import LabelService, SubmitResult
from .service_errors import RecordFailed

if TYPE_CHECKING:
    from ..questions import Answer, Question, QuestionSet
    from .config import AppConfig
    from .label_studio import LabelStudioBackend

log = logging.getLogger("pcd.server")

#: A parsed JSON value (what ``read_json`` returns and a format's parser reads).
Json: TypeAlias = "None | bool | int | float | str | list[Json] | dict[str, Json]"
#: The request flag, a top-level body key in both APIs, that asks for pcd's own extras (candidate
#: mass, raw probabilities, truncation, timings). Both official clients send it with ``extra_body``.
EXTRAS_FLAG = "pcd_extras"


@dataclass(frozen=True)
class Server:
    """What a wire format's routes are built over (``app.create_app`` makes one per app): the
    running service, the app's config, and the Label Studio backend's state when
    ``--label-studio`` is on (``None`` otherwise)."""

    service: LabelService
    config: AppConfig
    label_studio: LabelStudioBackend | None = None


@dataclass(frozen=True)
class WireFormat:
    """One wire format of ``pcd serve``, declared once, as its module's ``FORMAT``, and mounted by
    ``app.create_app`` from ``app.FORMATS`` (one line there adds a format).

    Attributes:
        name: the format's name (``pcd``, ``jev``, ``decisions``, ``label_studio``).
        routes: ``routes(server) -> list[Route]``: its routes over a ``Server``, each made by
            ``route`` (an empty list: not served, as Label Studio's without ``--label-studio``).
        request_id_headers: response headers, besides ``x-request-id`` (which every response
            carries), that its clients read the request id from (``typesafe-sdk``:
            ``x-typesafe-request-id``): set on every response of its routes, errors and the
            middleware's refusals included (``middleware.RequestContext``), and exposed to a
            browser's script (CORS ``expose_headers``).
        client_headers: request headers its official clients send (lower-case names), which a
            browser's CORS preflight may ask for (``middleware.Cors``), besides pcd's own
            (``middleware.CORS_HEADERS``).
        client_header_prefixes: families of such headers (``x-stainless-``).
    """

    name: str
    routes: Callable[[Server], list[Route]]
    request_id_headers: tuple[str, ...] = ()
    client_headers: frozenset[str] = frozenset()
    client_header_prefixes: tuple[str, ...] = ()


class Call:
    """One request as every wire format sees it.

    Attributes:
        request: the Starlette request (headers, the body stream).
        service: the ``LabelService``; config: the app's ``AppConfig``.
        request_id: the id the response carries (``x-request-id``, set by ``RequestContext``).
        log_id: the id naming the request in the log (unique even when two clients send one id).
        arrived: ``time.monotonic()`` at the request's arrival (before its body was read).
        deadline: ``arrived + config.request_timeout_s`` (``None`` without a timeout): the one
            deadline of every format, counted from arrival, body reading included.
    """

    def __init__(self, request: Request, server: Server):
        self.request = request
        self.service = server.service
        self.config = server.config
        state = request.state
        self.arrived: float = getattr(state, "arrived", None) or time.monotonic()
        self.request_id: str = getattr(state, "request_id", None) or "-"
        self.log_id: str = log_id(request)
        timeout = self.config.request_timeout_s
        self.deadline: float | None = self.arrived + float(timeout) if timeout else None

    async def body(self, *, text_checked_by_caller: tuple[str, ...] = ()) -> Json:
        """The request's JSON body (``read_json`` under ``config.max_body_bytes``)."""
        return await read_json(self.request, self.config.max_body_bytes, text_checked_by_caller=text_checked_by_caller)

    async def submit(self, schema: Schema, records: Sequence[Record | RecordFailure]) -> SubmitResult:
        """``service.submit`` for this request: its log id, the deadline from arrival, the
        client-gone check.

        Raises:
            Refused: ``QueueFull``, ``Draining``, ``NotReady``, ``DeadlineExceeded`` (``service_errors``).
            BadRequest, Failure: as ``LabelService.submit``.
            ClientDisconnected: the client left while the request waited.
        """
        return await self.service.submit(schema, records, request_id=self.log_id, deadline=self.deadline,
                                         is_disconnected=self.request.is_disconnected, arrived=self.arrived)

    async def label_one(self, schema: Schema, record: Record) -> tuple[RecordResult, SubmitResult]:
        """One record through ``submit``; returns ``(RecordResult, SubmitResult)``.

        Raises:
            Refused, BadRequest, Failure, ClientDisconnected: as ``submit``.
            RecordFailed: with the decoder's message when the record fails (a text too long for
                the model with ``--truncate error``, ...).
        """
        submitted = await self.submit(schema, [record])
        result = submitted.results[0]
        if isinstance(result, RecordFailure):
            raise RecordFailed(f"state: {result.error}")
        return result, submitted

    async def decide(self, questions: list[Question], plan_input: Json, text: str, prompt: str, *,
                     max_questions: int) -> tuple[list[Answer], int, dict]:
        """Decode a decision request's questions, the one step ``/v1/systemone`` and
        ``/v1/decisions`` share: ``prompt == "isolated"`` (the default) decides each distinct
        question alone about ``plan_input`` (``questions.plan``, then one ``submit`` per unit),
        ``"shared"`` builds one schema of every question and labels ``text`` as one record.

        Returns:
            ``(answers in request order, input tokens, the extras envelope)``.

        Raises:
            QuestionError: as ``questions.build`` / ``questions.plan`` (413/422 by its code).
            Refused, BadRequest, Failure, ClientDisconnected: as ``submit``; RecordFailed: as
                ``label_one``.
        """
        from .. import questions as Q

        if prompt == "isolated":
            p = Q.plan(questions, plan_input, max_questions=max_questions)
            done = await asyncio.gather(*(self.submit(unit.schema, Q.unit_records(p, u, self.log_id))
                                          for u, unit in enumerate(p.units)), return_exceptions=True)
            failed = next((d for d in done if isinstance(d, BaseException)), None)
            if failed is not None:
                raise failed
            for d in done:
                bad = next((r for r in d.results if isinstance(r, RecordFailure)), None)
                if bad is not None:
                    raise RecordFailed(f"state: {bad.error}")
            decoded = Q.decoded(p, done)
            return decoded.answers, decoded.input_tokens, decoded.extras()
        qs = Q.build(questions, max_questions=max_questions)
        result, submitted = await self.label_one(qs.schema, Q.record(text, self.request_id))
        return Q.answers(qs, result.fields), int(submitted.input_tokens), \
            {**extras_envelope(submitted, result, qs), "prompt": "shared"}

    def max_questions(self, most: int) -> int:
        """Most questions one request may ask: ``most`` (the planner's own limit), lowered by
        ``config.max_records_per_request``."""
        return min(most, int(self.config.max_records_per_request))


Handler = Callable[[Call], Awaitable[Response]]


def route(server: Server, path: str, handler: Handler, method: str) -> Route:
    """``handler`` mounted at ``path`` for ``method``: it gets the request as a ``Call``; what it
    raises is rendered by the app's exception handlers (``errors.HANDLERS``), and a crash is
    logged under the request id (never its text) and answered 500 ``internal_error``, so that it
    never reaches the server."""

    async def endpoint(request: Request) -> Response:
        try:
            return await handler(Call(request, server))
        except ANSWERED:
            raise  # answered by errors.HANDLERS
        except Exception as exc:  # noqa: BLE001 - one request's crash never stops the server
            log_crash(log, f"{log_id(request)}: unhandled error", exc)
            raise internal_error() from None

    endpoint.__doc__ = handler.__doc__
    return Route(path, endpoint, methods=[method])


class _Duplicate(ValueError):
    pass


def _pairs(pairs: list[tuple[str, Json]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise _Duplicate(f"key {key!r} appears twice in one JSON object; a name given twice is never "
                             "resolved silently")
        out[key] = value
    return out


def _constant(name: str):
    raise ValueError(f"{name} is not JSON")


#: Deepest nesting of arrays and objects a request body may have (a state nested deeper is 422
#: naming where; Python's own parser gives up near 1,000 levels, which is 400).
MAX_JSON_DEPTH = 64
#: Integers a body may hold: pcd spells numbers as 64-bit values (orjson, Arrow int64), so a larger
#: one (a 30-digit id) is 422 naming where, not a crash when it is written back.
INT_RANGE = (-(2 ** 63), 2 ** 63 - 1)


def json_path(path: tuple) -> str:
    """``("questions", "a", "criteria", 3)`` -> ``questions.a.criteria[3]`` (keys made ``printable``)."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (("." if out else "") + printable(str(part)))
    return out or "body"


def check_json(value: Json, *, text_checked_by_caller: tuple[str, ...] = ()) -> None:
    """Refuse a parsed body holding a value pcd cannot carry to the tokenizer or write back,
    naming where it is. Every key and string must be valid Unicode text (no lone surrogate: JSON's
    ``"\\ud83d"`` escape can spell one, UTF-8 and the tokenizer cannot); every integer within
    ``INT_RANGE``; every number finite (``1e400``); nesting at most ``MAX_JSON_DEPTH`` deep.

    ``text_checked_by_caller``: top-level keys whose strings the route checks itself (``/v1/label``'s
    ``records``: a bad text there is a row error, as in ``pcd label``); their keys, numbers and
    depth are still checked here.

    Raises:
        ApiError: 422 ``invalid_text``, ``number_out_of_range`` or ``too_deep``, the message naming
            the JSON path (``state.a[2]``, ``questions.billing.instructions``).
    """
    stack: list[tuple[Json, tuple, bool]] = [(value, (), True)]
    while stack:
        item, path, check_text = stack.pop()
        if len(path) > MAX_JSON_DEPTH:
            raise ApiError(422, "invalid_request_error", "too_deep",
                           f"{json_path(path[:3])}: nested more than {MAX_JSON_DEPTH} arrays or objects deep; "
                           "flatten it")
        if isinstance(item, str):
            if check_text and not _valid_text(item):
                raise _bad_text(path, item)
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int):
            if not INT_RANGE[0] <= item <= INT_RANGE[1]:
                raise ApiError(422, "invalid_request_error", "number_out_of_range",
                               f"{json_path(path)}: the integer {str(item)[:24]}{'...' if len(str(item)) > 24 else ''} "
                               "is outside the 64-bit range pcd writes; send it as a string")
        elif isinstance(item, float):
            if item != item or item in (float("inf"), float("-inf")):
                raise ApiError(422, "invalid_request_error", "number_out_of_range",
                               f"{json_path(path)}: the number is too large for a 64-bit float; send it as a string")
        elif isinstance(item, dict):
            for key, sub in item.items():
                if not _valid_text(key):
                    raise _bad_text(path + (key,), key, is_key=True)
                here = check_text and not (not path and key in text_checked_by_caller)
                stack.append((sub, path + (key,), here))
        elif isinstance(item, list):
            stack.extend((sub, path + (i,), check_text) for i, sub in enumerate(item))


_JSON_TOKENS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}:]')


def too_deep_at(body: bytes) -> str:
    """The top-level key under which ``body`` (JSON text) first nests deeper than
    ``MAX_JSON_DEPTH`` (``"body"`` when it is not under one): found by a scan of its strings and
    brackets (a regular expression; only the key found is decoded), for the message of a body
    Python's parser gives up on. About a second for 8 MiB of tiny tokens: run it off the event loop."""
    depth, key, last = 0, None, None
    for match in _JSON_TOKENS.finditer(body):
        token = match.group()
        if token in (b"[", b"{"):
            depth += 1
            if depth > MAX_JSON_DEPTH:
                break
        elif token in (b"]", b"}"):
            depth -= 1
        elif token == b":":
            if depth == 1:
                key = last
        else:
            last = token
    try:
        return printable(json.loads(key)) if key is not None else "body"
    except ValueError:
        return "body"


def _valid_text(text: str) -> bool:
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def _bad_text(path: tuple, text: str, *, is_key: bool = False) -> ApiError:
    try:
        text.encode("utf-8")
        at = 0
    except UnicodeEncodeError as exc:
        at = exc.start
    return ApiError(422, "invalid_request_error", "invalid_text",
                    f"{json_path(path)}: the {'key' if is_key else 'text'} holds a lone surrogate "
                    f"(U+{ord(text[at]):04X} at character {at}), which is not Unicode text: a \\uD800-\\uDFFF "
                    "escape must be one half of a pair; send valid UTF-8")


async def _discard(stream, budget: int) -> None:
    """Read and drop up to ``budget`` more bytes of a refused body, so that a client that sends its
    whole body before reading the answer (``urllib``, ``requests``) reads the 413 instead of a
    connection reset; the receive deadline (``RequestContext``) still bounds the time."""
    try:
        async for chunk in stream:
            budget -= len(chunk)
            if budget < 0:
                return
    except (ApiError, ClientDisconnect):
        return


async def read_json(request: Request, max_bytes: int | None = None, *,
                    text_checked_by_caller: tuple[str, ...] = ()) -> Json:
    """The request body parsed as JSON, read at most ``max_bytes`` (plus one chunk) into memory,
    and checked by ``check_json``.

    A ``Content-Encoding: zstd`` body (what ``typesafe-sdk`` sends for bodies of 1 KiB or more when
    zstd is available) is decompressed, bounded by the same limit. Objects keep their key order.
    A body whose declared ``Content-Length`` is over ``max_bytes`` (but at most twice it) is read
    on and dropped before the 413 is sent, with ``Connection: close``, so that a client that sends
    its whole body before reading (``urllib``, ``requests``) reads the 413, not a connection reset;
    a larger one, or one of undeclared length, is not read on.

    Raises:
        ApiError: 413 when the body (declared or read, or decompressed) is over ``max_bytes``;
            415 for a multipart body (assets / images: pcd labels text) or an unknown encoding;
            400 when it is not valid UTF-8 JSON (NaN and Infinity included) or nests deeper
            than Python's parser goes; 422 when an object repeats a key or ``check_json``
            refuses a value; 408 when the body is not received within the read timeout (raised
            by ``RequestContext``'s receive).
        ClientDisconnected: the client left in the middle of its upload (answered 499).
    """
    limit = max_bytes or limits.MAX_BODY_BYTES
    too_big = ApiError(413, "invalid_request_error", "body_too_large",
                       f"the request body is over {limit} bytes (--max-body-bytes); split it: fewer or shorter "
                       "records (/v1/label), questions or states (the decision routes)", {"Connection": "close"})
    ctype = request.headers.get("content-type", "")
    if ctype.startswith("multipart/"):
        raise ApiError(415, "invalid_request_error", "unsupported_media_type",
                       "multipart bodies (assets, images) are not supported: pcd labels text; send the state as "
                       "a JSON string, object or array", {"Accept": "application/json"})
    declared = request.headers.get("content-length")
    stream = request.stream()
    if declared is not None and declared.isdigit() and int(declared) > limit:
        if int(declared) <= 2 * limit:
            await _discard(stream, limit)
        raise too_big
    chunks, size = [], 0
    try:
        async for chunk in stream:
            size += len(chunk)
            if size > limit:  # a body of undeclared length (chunked) is not read on: it may be endless
                raise too_big
            chunks.append(chunk)
    except ClientDisconnect:
        raise ClientDisconnected(getattr(request.state, "request_id", "?")) from None
    body = b"".join(chunks)
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding == "zstd":
        import zstandard

        try:
            reader = zstandard.ZstdDecompressor().stream_reader(body, read_across_frames=True)
            parts, size = [], 0
            while size <= limit:  # never more than the limit (plus one chunk) in memory
                part = reader.read(65536)
                if not part:
                    break
                parts.append(part)
                size += len(part)
            body = b"".join(parts)
        except zstandard.ZstdError as exc:
            raise ApiError(400, "invalid_request_error", "invalid_body", f"the zstd body cannot be read: {exc}") from None
        if len(body) > limit:
            raise too_big
    elif encoding not in ("", "identity"):
        raise ApiError(415, "invalid_request_error", "unsupported_encoding",
                       f"Content-Encoding {encoding!r} is not supported (identity or zstd)",
                       {"Accept-Encoding": "zstd, identity"})
    try:
        parsed = json.loads(body.decode("utf-8"), object_pairs_hook=_pairs, parse_constant=_constant)
    except _Duplicate as exc:
        raise ApiError(422, "invalid_request_error", "duplicate_key", printable(str(exc))) from None
    except RecursionError:
        where = await asyncio.to_thread(too_deep_at, body)
        raise ApiError(400, "invalid_request_error", "invalid_json",
                       f"{where}: the request body nests arrays or objects too deep to parse; at most "
                       f"{MAX_JSON_DEPTH} levels are accepted") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise ApiError(400, "invalid_request_error", "invalid_json",
                       f"the request body is not valid JSON: {exc}") from None
    check_json(parsed, text_checked_by_caller=text_checked_by_caller)
    return parsed


def extras_flag(body: dict) -> bool:
    """The ``pcd_extras`` flag of a request body (absent: false).

    Raises:
        ApiError: 422 when it is not a boolean.
    """
    value = body.get(EXTRAS_FLAG, False)
    if not isinstance(value, bool):
        raise ApiError(422, "invalid_request_error", "invalid_flag",
                       f"{EXTRAS_FLAG}: must be true or false, got {json.dumps(value)}")
    return value


def extras_envelope(submitted: SubmitResult, result: RecordResult, qs: QuestionSet) -> dict:
    """The top-level ``pcd`` object of a response that asked for extras."""
    return {"truncated": bool(result.truncated), "fields": list(qs.names), "schema_sha256": qs.schema.source_sha256,
            "queue_ms": float(submitted.queue_ms or 0.0), "decode_ms": float(submitted.decode_ms or 0.0),
            "steered": sum(bool(f.steered) for f in result.fields)}


def answer_extras(answer: Answer) -> dict:
    """The per-answer ``pcd`` object: candidate mass, the raw probabilities by pcd label, and
    ``steered: true`` when the steering check moved the answer (``pcd_cli.steering``; absent otherwise,
    so an answer without the check reads as before)."""
    return {"mass": answer.mass, "raw_probabilities": dict(zip(answer.labels, answer.raw_probs))} \
        | ({"steered": True} if answer.steered else {})
