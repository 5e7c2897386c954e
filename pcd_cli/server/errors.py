"""The server's one error type: an HTTP status and the ``{"error": {type, code, message}}`` body."""

from __future__ import annotations


class ApiError(Exception):
    """A request the server answers with an error body instead of results.

    Attributes:
        status: HTTP status (400 malformed JSON, 401 no or wrong key, 404 unknown route or schema,
            413 too large, 422 well-formed but invalid, 429 queue full, 503 draining or past deadline).
        type: the error family (``invalid_request_error``, ``authentication_error``, ``rate_limit_error``,
            ``server_error``, ...).
        code: a short machine-readable code (``invalid_json``, ``unknown_schema``, ``too_many_records``, ...).
        message: a sentence naming what is wrong (the field, question or record) and how to fix it.
        headers: extra response headers (``Retry-After`` for 429 and 503).
    """

    def __init__(self, status: int, type: str, code: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.type = type
        self.code = code
        self.message = message
        self.headers = headers or {}

    def body(self) -> dict:
        """The JSON error body: ``{"error": {"type", "code", "message"}}``."""
        return {"error": {"type": self.type, "code": self.code, "message": self.message}}
