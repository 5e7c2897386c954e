"""HTTP plumbing shared by the Jev (``jev``) and OpenAI Decisions (``decisions``) routes: reading a
bounded JSON body, the request id, running one record through the service, rendering errors.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from .errors import ApiError

log = logging.getLogger("pcd.server")

#: Default body limit when the server config gives none (issue #27: ``--max-body-bytes`` 8 MiB).
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
#: The request flag, a top-level body key in both APIs, that asks for pcd's own extras (candidate
#: mass, raw probabilities, truncation, timings). Both official clients send it with ``extra_body``.
EXTRAS_FLAG = "pcd_extras"


def request_id(request: Request, header: str) -> tuple[str, dict[str, str]]:
    """The request's id and the headers that carry it: the id the app's middleware gave it
    (``request.state.request_id``; the middleware writes ``x-request-id`` itself), else a new
    ``req_<32 hex>``; ``header`` (the protocol's own request-id header) always carries it."""
    rid = getattr(request.state, "request_id", None)
    if rid:
        return rid, ({header: rid} if header != "x-request-id" else {})
    rid = "req_" + uuid.uuid4().hex
    request.state.request_id = rid
    return rid, {header: rid}


async def guarded(handler, request: Request, headers: dict[str, str]):
    """``await handler()``, with an ``ApiError`` or a crash rendered as the error body carrying
    ``headers`` (a crash is logged under the request id and never reaches the server); a client
    that went away gets 499, which nobody reads."""
    from starlette.responses import Response

    from .service import ClientDisconnected

    try:
        return await handler()
    except ApiError as exc:
        return error_response(exc, headers)
    except ClientDisconnected:
        return Response(status_code=499)
    except Exception:  # noqa: BLE001 - one request's crash never stops the server
        log.exception("%s: unhandled error", request.state.request_id)
        return error_response(ApiError(500, "server_error", "internal_error", "the server failed on this request; "
                                       "the log has the details under its request id"), headers)


def error_response(exc: ApiError, headers: dict[str, str]) -> JSONResponse:
    """``{"error": {type, code, message}}`` with the error's status and headers plus ``headers``."""
    return JSONResponse(exc.body(), status_code=exc.status, headers={**exc.headers, **headers})


class _Duplicate(ValueError):
    pass


def _pairs(pairs: list[tuple[str, Any]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise _Duplicate(f"key {key!r} appears twice in one JSON object; a name given twice is never "
                             "resolved silently")
        out[key] = value
    return out


def _constant(name: str):
    raise ValueError(f"{name} is not JSON")


async def read_json(request: Request, max_bytes: int | None = None) -> Any:
    """The request body parsed as JSON, read at most ``max_bytes`` (plus one chunk) into memory.

    A ``Content-Encoding: zstd`` body (what ``typesafe-sdk`` sends for bodies of 1 KiB or more when
    zstd is available) is decompressed, bounded by the same limit. Objects keep their key order.

    Raises:
        ApiError: 413 when the body (declared or read, or decompressed) is over ``max_bytes``;
            415 for a multipart body (assets / images: pcd labels text) or an unknown encoding;
            400 when it is not valid UTF-8 JSON (NaN and Infinity included); 422 when an
            object repeats a key.
    """
    limit = max_bytes or DEFAULT_MAX_BODY_BYTES
    too_big = ApiError(413, "invalid_request_error", "body_too_large",
                       f"the request body is over {limit} bytes (--max-body-bytes); send fewer or shorter questions "
                       "or a shorter state")
    ctype = request.headers.get("content-type", "")
    if ctype.startswith("multipart/"):
        raise ApiError(415, "invalid_request_error", "unsupported_media_type",
                       "multipart bodies (assets, images) are not supported: pcd labels text; send the state as "
                       "a JSON string, object or array")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_big
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_big
        chunks.append(chunk)
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
                       f"Content-Encoding {encoding!r} is not supported (identity or zstd)")
    try:
        return json.loads(body.decode("utf-8"), object_pairs_hook=_pairs, parse_constant=_constant)
    except _Duplicate as exc:
        raise ApiError(422, "invalid_request_error", "duplicate_key", str(exc)) from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise ApiError(400, "invalid_request_error", "invalid_json",
                       f"the request body is not valid JSON: {exc}") from None


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


def config_value(config: Any, name: str, default: Any) -> Any:
    """``config.<name>`` (or ``config[name]`` for a dict), else ``default`` when absent or None."""
    value = config.get(name) if isinstance(config, dict) else getattr(config, name, None)
    return default if value is None else value


async def label_one(service: Any, config: Any, schema: Any, record: Any, *, request: Request, rid: str):
    """Run one record through ``service.submit`` (deadline: ``config.request_timeout_s`` from
    now, else the service's own); return ``(RecordResult, SubmitResult)``.

    Raises:
        ApiError: what the service raises (429 queue full, 503 draining or past the deadline),
            or 422 ``record_failed`` with the decoder's message when the record fails (a text too
            long for the model with ``--truncate error``, ...).
    """
    timeout = config_value(config, "request_timeout_s", None)
    submitted = await service.submit(schema, [record], request_id=rid,
                                     deadline=time.monotonic() + float(timeout) if timeout else None,
                                     is_disconnected=request.is_disconnected)
    result = submitted.results[0]
    if not hasattr(result, "fields"):  # a RecordFailure
        raise ApiError(422, "invalid_request_error", "record_failed", f"state: {result.error}")
    return result, submitted


def extras_envelope(submitted: Any, result: Any, qs: Any) -> dict:
    """The top-level ``pcd`` object of a response that asked for extras."""
    return {"truncated": bool(getattr(result, "truncated", False)),
            "fields": list(qs.names),
            "schema_sha256": qs.schema.source_sha256,
            "queue_ms": float(getattr(submitted, "queue_ms", 0.0) or 0.0),
            "decode_ms": float(getattr(submitted, "decode_ms", 0.0) or 0.0)}


def answer_extras(answer: Any) -> dict:
    """The per-answer ``pcd`` object: candidate mass and the raw probabilities by pcd label."""
    return {"mass": answer.mass, "raw_probabilities": dict(zip(answer.labels, answer.raw_probs))}
