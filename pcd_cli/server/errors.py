"""The server's one error path: the error type (``ApiError``: an HTTP status and the
``{"error": {type, code, message}}`` envelope), the one table of how each of pcd's own errors is
answered (``ANSWERS``: its ``code`` -> status and error type; its ``retry_after`` -> ``Retry-After``),
the one ``error_response``, and the exception handlers every route shares (``HANDLERS``, registered
once by ``app.create_app``); plus the two helpers that keep an error from leaking or crashing on the
text it carries (``printable``, ``log_crash``).

A route never renders its own error: it raises, and the handler renders it. The service, the Label
Studio backend and the decision domain raise pcd's own errors, which carry a ``code`` and no HTTP
status (``service_errors``' kinds, ``pcd_cli.questions.QuestionError``): ``ANSWERS`` maps them here,
once (as vLLM's engine errors, ``v1/engine/exceptions.py``, are mapped by its API server). Only the
HTTP edge (middleware, body reading, a format's own parsing) raises ``ApiError`` itself. A crash is
turned into 500 ``internal_error`` by ``wire.route`` (Starlette re-raises an unhandled exception to
the server, whose log would quote its message).
"""

from __future__ import annotations

import logging
import traceback
from dataclasses import dataclass
from typing import Iterable

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from ..errors import InputError
from .service_errors import ServiceError

log = logging.getLogger("pcd.server")


class ApiError(Exception):
    """A request the server answers with an error body instead of results.

    Attributes:
        status: HTTP status (400 malformed JSON, 401 no or wrong key, 404 unknown route or schema,
            405 method not allowed (with ``Allow``), 408 request not received in time, 413 too
            large, 415 not JSON, 421 a Host the server does not answer for, 422 well-formed but
            invalid, 429 queue full, 431 header block too large, 499 the client left, 503
            draining or past deadline).
        type: the error family (``invalid_request_error``, ``authentication_error``, ``rate_limit_error``,
            ``server_error``, ...).
        code: a short machine-readable code (``invalid_json``, ``unknown_schema``, ``too_many_records``, ...).
        message: a sentence naming what is wrong (the field, question or record) and how to fix it.
        headers: extra response headers (``Retry-After`` for 429 and 503, ``Allow`` for 405).
    """

    def __init__(self, status: int, type: str, code: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.type = type
        self.code = code
        self.message = message
        self.headers = headers or {}

    def body(self) -> dict:
        """The JSON error body: ``{"error": {"type", "code", "message"}}``; every string is
        ``printable`` (a message quoting a client's lone surrogate still encodes as UTF-8)."""
        return {"error": {"type": printable(self.type), "code": printable(self.code), "message": printable(self.message)}}


class ClientDisconnected(Exception):
    """The client closed its connection before its request was answered (answered 499, which
    nobody reads)."""


INVALID, SERVER = "invalid_request_error", "server_error"


@dataclass(frozen=True)
class Answer:
    """How one kind of pcd's own errors is answered.

    Attributes:
        status: the HTTP status.
        type: the envelope's ``error.type`` (``invalid_request_error``, ``rate_limit_error``,
            ``server_error``).
        expected: a 5xx that is the server working as meant (draining, loading, past a deadline):
            logged by the access line only; any other 5xx is also logged at ERROR.
    """

    status: int
    type: str = INVALID
    expected: bool = False


#: The one table: the ``code`` of one of pcd's own errors -> how it is answered. The error carries
#: no status; its ``retry_after`` (seconds), where it has one, is sent as ``Retry-After``. A code
#: not listed is 422 ``invalid_request_error`` for an input error (``InputError``: a bad question,
#: field or record), 500 ``server_error`` for any other.
ANSWERS: dict[str, Answer] = {
    # more than a limit allows: 413
    "too_large": Answer(413), "too_many_questions": Answer(413), "too_many_options": Answer(413),
    "too_costly": Answer(413),
    # well-formed but invalid: 422 (the default of an input error; the service's kinds listed)
    "invalid_text": Answer(422), "invalid_option": Answer(422), "schema_not_compilable": Answer(422),
    "record_failed": Answer(422), "unknown_project": Answer(422), "label_config_not_mapped": Answer(422),
    # load, state and time: retry later
    "queue_full": Answer(429, "rate_limit_error"),
    "draining": Answer(503, SERVER, expected=True), "not_ready": Answer(503, SERVER, expected=True),
    "shutting_down": Answer(503, SERVER, expected=True), "deadline_exceeded": Answer(503, SERVER, expected=True),
    "startup_failed": Answer(503, SERVER), "journal_unwritable": Answer(503, SERVER),
    # the server's own failures (the log has the details under the request id)
    "compile_failed": Answer(500, SERVER), "decode_failed": Answer(500, SERVER),
}
_INPUT_ERROR = Answer(422)
_OTHER_ERROR = Answer(500, SERVER)
#: ``code`` of the routing errors (``HTTPException`` raised by Starlette's router).
ROUTING_CODES = {404: "not_found", 405: "method_not_allowed"}
#: Codes of 5xx answers that are the server working as meant (logged by the access line only).
_EXPECTED_5XX = frozenset(code for code, answer in ANSWERS.items() if answer.expected)
#: Response headers of error answers that a browser's script may read (CORS ``expose_headers``).
EXPOSED_HEADERS = ("retry-after",)


def answer_of(exc: BaseException) -> Answer:
    """How one of pcd's own errors is answered: ``ANSWERS`` by its ``code``; 422 for an input
    error whose code is not listed (or that has none), 500 ``server_error`` for any other."""
    answer = ANSWERS.get(getattr(exc, "code", None) or "")
    if answer is not None:
        return answer
    return _INPUT_ERROR if isinstance(exc, InputError) else _OTHER_ERROR


def api_error(exc: BaseException) -> ApiError:
    """``exc`` as the ``ApiError`` the client is answered with: itself when it is one; one of
    pcd's own errors (``InputError``, ``SchemaError``, ``service_errors.ServiceError``, ...) as
    ``answer_of`` it says, with its ``code`` (``invalid_request`` when it has none), its message
    and ``Retry-After`` from its ``retry_after``."""
    if isinstance(exc, ApiError):
        return exc
    answer = answer_of(exc)
    retry_after = getattr(exc, "retry_after", None)
    return ApiError(answer.status, answer.type, getattr(exc, "code", None) or "invalid_request", str(exc),
                    {"Retry-After": str(retry_after)} if retry_after is not None else None)


def internal_error() -> ApiError:
    """The 500 a crash is answered with (its details are in the log, under the request id)."""
    return ApiError(500, "server_error", "internal_error",
                    "the server failed on this request; the log has the details under its request id")


def json_response(body: object, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """``body`` as JSON (orjson: floats in their shortest round-trip form)."""
    return Response(orjson.dumps(body), status_code=status, headers=headers, media_type="application/json")


def error_response(exc: ApiError, headers: dict[str, str] | None = None) -> Response:
    """The ``{"error": {type, code, message}}`` body with the error's status and headers (plus
    ``headers``): the one renderer of every error the server sends."""
    return json_response(exc.body(), exc.status, {**exc.headers, **(headers or {})})


def log_id(request: Request) -> str:
    """The id that names this request in the log (``middleware.RequestContext`` sets it: unique
    per request even when two clients send the same ``x-request-id``); ``"-"`` when unset."""
    state = request.state
    return getattr(state, "log_id", None) or getattr(state, "request_id", None) or "-"


async def _on_error(request: Request, exc: Exception) -> Response:
    err = api_error(exc)
    if err.status >= 500 and err.code not in _EXPECTED_5XX:
        log.error("%s: %s (%s)", log_id(request), err.code, err.status)
    return error_response(err)


async def _on_disconnect(request: Request, exc: Exception) -> Response:
    """499 for a client that left (while its upload streamed in, or while its request waited);
    nobody reads it, and the access log line (INFO) is the only line about it."""
    return Response(status_code=499)


async def _on_routing(request: Request, exc: HTTPException) -> Response:
    """A routing error (404 no such route, 405 a method the route does not take, with ``Allow``
    as RFC 9110 §15.5.6 asks) in the error envelope, so that the official clients read its
    ``code``; the 404 names the mounted routes (``app.state.paths``)."""
    method, path = request.method, printable(request.url.path)[:200]
    headers = dict(exc.headers or {})
    if "Allow" in headers:  # Starlette builds it from a set: sorted, so that it reads the same each time
        headers["Allow"] = ", ".join(sorted(m.strip() for m in headers["Allow"].split(",")))
    if exc.status_code == 404:
        message = f"no route {path!r}; pcd serves {_listed(getattr(request.app.state, 'paths', ()))}"
    elif exc.status_code == 405:
        message = f"{method} is not allowed on {path!r}; allowed: {headers.get('Allow', '')}"
    else:
        message = printable(str(exc.detail))
    return error_response(ApiError(exc.status_code, "invalid_request_error",
                                   ROUTING_CODES.get(exc.status_code, "http_error"), message, headers))


def _listed(paths: Iterable[str]) -> str:
    names = list(paths)
    return ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else "".join(names)


#: The exception handlers of every route (``Starlette(exception_handlers=HANDLERS)``): the error
#: kinds and how each is answered, in one table.
HANDLERS = {ApiError: _on_error, InputError: _on_error, ServiceError: _on_error, ClientDisconnected: _on_disconnect,
            ClientDisconnect: _on_disconnect, HTTPException: _on_routing}
#: What a route may raise for ``HANDLERS`` to answer (``wire.route`` lets these through; anything
#: else is a crash, answered 500 ``internal_error``).
ANSWERED = (ApiError, InputError, ServiceError, ClientDisconnected, ClientDisconnect)


def printable(text: str) -> str:
    """``text`` made encodable as UTF-8: a lone surrogate (``"\\ud83d"``, which JSON may carry but
    UTF-8 cannot) becomes the six characters ``\\ud83d``; any other text is returned as it is."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def log_crash(logger: logging.Logger, message: str, exc: BaseException) -> None:
    """Log ``message`` at ERROR with ``exc``'s type and stack, never its text: an exception's message
    may quote request content (``UnicodeEncodeError`` quotes the string, ``KeyError`` the key),
    and record text is never logged (docs/serve.md, Security). Chained causes are logged the same
    way."""
    parts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        frames = "".join(traceback.format_tb(current.__traceback__))
        parts.append(f"{type(current).__module__}.{type(current).__qualname__} (message withheld: it may quote "
                     f"request content)\n{frames}")
        current = current.__cause__ or current.__context__
    logger.error("%s\n%s", message, "\nwhile handling:\n".join(parts).rstrip())
