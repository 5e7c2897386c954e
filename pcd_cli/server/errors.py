"""The server's one error type: an HTTP status and the ``{"error": {type, code, message}}`` body;
and the two helpers that keep an error from leaking or crashing on the text it carries
(``printable``, ``log_crash``)."""

from __future__ import annotations

import logging
import traceback


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
