"""The HTTP app of ``pcd serve``: a Starlette app built by ``create_app(service, config)``.

No globals: everything a route needs hangs on ``app.state`` (``service``, ``config``,
``metrics``), so a Ray Serve deployment can build one app per replica.

Routes: ``POST /v1/label`` (rows with the columns and values of ``pcd label``'s Parquet output),
``GET /v1/schemas``, ``GET /health``, ``GET /ready``, ``GET /metrics``, and the routes of
``pcd_cli.server.jev`` and ``pcd_cli.server.decisions`` (each module's ``routes(service, config)``),
plus any ``extra_routes``.

Every response carries ``x-request-id`` (the client's own, if it sent a usable one, else a new
``req_<32 hex>``); every log line about a request names it; record text is never logged.
Every route but ``/health`` and ``/ready`` needs an API key when ``config.api_keys`` is set.
"""

from __future__ import annotations

import hmac
import importlib
import logging
import re
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable

import orjson
import pyarrow as pa
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ..errors import PcdError
from ..io.output import check_columns, results_table
from ..io.readers import DEFAULT_ID_COLUMN, InputSpec, row_to_record
from ..results import RecordResult
from .errors import ApiError
from .protocols import read_json
from .service import ClientDisconnected, LabelService

log = logging.getLogger("pcd.server")

#: Routes answered without an API key (probes).
OPEN_PATHS = frozenset({"/health", "/ready"})
#: Modules whose ``routes(service, config)`` are added when they exist (the Jev and OpenAI routes).
PROTOCOL_MODULES = ("pcd_cli.server.jev", "pcd_cli.server.decisions")
REQUEST_ID_HEADER = "x-request-id"
_GOOD_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")


@dataclass(frozen=True)
class AppConfig:
    """HTTP-side settings of ``pcd serve``.

    Attributes:
        api_keys: keys accepted (``Authorization: Bearer KEY`` or ``x-api-key: KEY``); empty: no
            key needed.
        max_body_bytes: largest request body (after decompression); larger is 413, refused
            while streaming (never read whole).
        max_records_per_request: most records in one ``/v1/label`` request (most questions in
            a Jev or OpenAI one); more is 413.
        request_timeout_s: a request not answered this long after it arrived gets 503.
        cors_origins: origins allowed by CORS; empty: no CORS headers at all.
    """

    api_keys: tuple[str, ...] = ()
    max_body_bytes: int = 8 * 1024 * 1024
    max_records_per_request: int = 1024
    request_timeout_s: float | None = 60.0
    cors_origins: tuple[str, ...] = ()


class Metrics:
    """The app's Prometheus metrics, in a registry of its own (one per app).

    ``pcd_requests_total{route,status}``, ``pcd_request_seconds{route}`` (histogram),
    ``pcd_requests_refused_total{reason}`` (401 unauthorized, 413 too_large, and the service's
    own refusals: queue_full, draining, not_ready, deadline_exceeded), ``pcd_queue_wait_seconds``
    (histogram), and read from the service at each scrape: ``pcd_records_total`` (records
    decoded), ``pcd_forward_passes_total``, ``pcd_decode_calls_total``, ``pcd_queue_depth``
    (requests waiting) and ``pcd_queued_records``.
    """

    def __init__(self, service: LabelService):
        from prometheus_client import CollectorRegistry, Counter as PCounter, Histogram

        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = PCounter("pcd_requests", "HTTP requests answered, by route and status",
                                 ["route", "status"], registry=self.registry)
        self.seconds = Histogram("pcd_request_seconds", "Seconds from a request's arrival to its response",
                                 ["route"], registry=self.registry,
                                 buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, float("inf")))
        self.queue_wait = Histogram("pcd_queue_wait_seconds", "Seconds a request waited before its first decode call",
                                    registry=self.registry,
                                    buckets=(.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, float("inf")))
        self.refused: Counter[str] = Counter()  # HTTP-side refusals (the service counts its own)
        self.registry.register(_ServiceCollector(service, self.refused))
        service.on_queue_wait = self.queue_wait.observe

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


class _ServiceCollector:
    """Reads the service's counters at scrape time (the worker thread never touches metrics)."""

    def __init__(self, service: LabelService, refused: Counter):
        self.service = service
        self.refused = refused

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        s = self.service
        requests, records = s.queue_depth
        yield CounterMetricFamily("pcd_records", "Records decoded", value=s.records_decoded)
        yield CounterMetricFamily("pcd_forward_passes", "Forward passes spent on records", value=s.forward_passes)
        yield CounterMetricFamily("pcd_decode_calls", "Decode calls (batches of packed chunks)", value=s.batches)
        yield GaugeMetricFamily("pcd_queue_depth", "Requests waiting to be decoded", value=requests)
        yield GaugeMetricFamily("pcd_queued_records", "Records waiting to be decoded", value=records)
        refused = CounterMetricFamily("pcd_requests_refused", "Requests refused, by reason", labels=["reason"])
        for reason, n in sorted((self.refused + s.refused).items()):
            refused.add_metric([reason], n)
        yield refused


def request_id(request: Request) -> str:
    """The request's id (set by the app's middleware)."""
    return request.state.request_id


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """``body`` as JSON (orjson: floats in their shortest round-trip form)."""
    return Response(orjson.dumps(body), status_code=status, headers=headers, media_type="application/json")


def error_response(exc: ApiError) -> Response:
    """The ``{"error": {type, code, message}}`` body with the error's status and headers."""
    return json_response(exc.body(), exc.status, exc.headers)


class RequestContext:
    """ASGI middleware: request id, API key check, the access log line and request metrics.

    Every response carries ``x-request-id``; a protocol route whose module names another
    request-id header (``id_headers``: path -> header, e.g. the Jev routes' ``x-typesafe-request-id``)
    carries that one too, the middleware's own answers (401) included."""

    def __init__(self, app, *, api_keys: tuple[str, ...], metrics: Metrics, known_paths: Iterable[str],
                 id_headers: dict[str, str] | None = None):
        self.app = app
        self.id_headers = {path: h.encode() for path, h in (id_headers or {}).items()}
        self.keys = tuple(k.encode() for k in api_keys)
        self.metrics = metrics
        self.known = frozenset(known_paths)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        given = _header(scope, b"x-request-id")
        rid = given if given and _GOOD_ID.fullmatch(given) else "req_" + uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid
        path = scope.get("path", "")
        route = path if path in self.known else "other"
        status = {"code": 500}

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                headers = [*message.get("headers", []), (b"x-request-id", rid.encode())]
                own = self.id_headers.get(path)  # e.g. x-typesafe-request-id on a 401 from /v1/systemone
                if own is not None and all(k.lower() != own for k, _ in headers):
                    headers.append((own, rid.encode()))
                message["headers"] = headers
            await send(message)

        try:
            if self.keys and path not in OPEN_PATHS and scope.get("method") != "OPTIONS" and not self._authorized(scope):
                self.metrics.refused["unauthorized"] += 1
                err = ApiError(401, "authentication_error", "invalid_api_key",
                               "a valid API key is needed: send 'Authorization: Bearer <key>'",
                               {"WWW-Authenticate": "Bearer"})
                return await error_response(err)(scope, receive, send_with_id)
            await self.app(scope, receive, send_with_id)
        finally:
            seconds = time.perf_counter() - started
            if status["code"] == 413:
                self.metrics.refused["too_large"] += 1
            self.metrics.requests.labels(route, str(status["code"])).inc()
            self.metrics.seconds.labels(route).observe(seconds)
            log.info("%s %s %s %d %.1f ms", rid, scope.get("method"), route, status["code"], seconds * 1e3)

    def _authorized(self, scope) -> bool:
        """Whether the request carries one of the keys (every key compared in constant time)."""
        auth = _header(scope, b"authorization") or ""
        given = auth[7:].strip() if auth[:7].lower() == "bearer " else (_header(scope, b"x-api-key") or "")
        given_b = given.encode()
        ok = False
        for key in self.keys:
            ok |= hmac.compare_digest(given_b, key)
        return ok


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


# -- routes ------------------------------------------------------------------------------------
async def label(request: Request) -> Response:
    """``POST /v1/label``: ``{"schema": NAME, "records": [text | {"id", "text", ...}], "all_probs": bool}``.

    Records become ``pcd_cli.results.Record`` values by ``pcd label``'s rules (the schema's
    ``text_field`` or ``template``; an ``id`` key on any record object makes ``id`` the id column,
    else ids are positions in a ``row`` column). Returns ``rows`` (exactly ``pcd label``'s Parquet
    columns and values; ``<f>__probs`` as an object), ``errors`` (``{row, record, error}`` with
    the CLI's messages), ``metadata`` (the Parquet ``pcd.*`` keys) and ``usage``.
    """
    service: LabelService = request.app.state.service
    config: AppConfig = request.app.state.config
    body = await read_json(request, config.max_body_bytes)
    if not isinstance(body, dict):
        raise _invalid("body", "the body must be a JSON object {\"schema\": NAME, \"records\": [...]}")
    unknown = [k for k in body if k not in ("schema", "records", "all_probs")]
    if unknown:
        raise _invalid(unknown[0], f"unknown key {unknown[0]!r}; the keys are schema, records, all_probs")
    name, records, all_probs = body.get("schema"), body.get("records"), body.get("all_probs", False)
    if not isinstance(name, str):
        raise _invalid("schema", "'schema' must be the name of a served schema (GET /v1/schemas)")
    entry = service.named.get(name)
    if entry is None:
        raise ApiError(422, "invalid_request_error", "unknown_schema",
                       f"schema {name!r} is not served; served: {', '.join(sorted(service.named)) or 'none'}")
    if not isinstance(records, list):
        raise _invalid("records", "'records' must be a list of texts or {\"id\", \"text\", ...} objects")
    if len(records) > config.max_records_per_request:
        raise ApiError(413, "invalid_request_error", "too_many_records",
                       f"{len(records)} records in one request; at most {config.max_records_per_request} "
                       "(--max-records-per-request): split it")
    if not isinstance(all_probs, bool):
        raise _invalid("all_probs", "'all_probs' must be true or false")
    options = entry.options
    has_id = any(isinstance(r, dict) and DEFAULT_ID_COLUMN in r for r in records)
    try:
        spec = InputSpec(text_field=options.text_field, template=options.template,
                         id_field=DEFAULT_ID_COLUMN if has_id else None)
        column = DEFAULT_ID_COLUMN if has_id else "row"
        check_columns(entry.schema, column, all_probs=all_probs)
    except PcdError as exc:
        raise ApiError(422, "invalid_request_error", "invalid_request", str(exc)) from None
    items = [row_to_record(r if isinstance(r, dict) else _text_row(r, spec, has_id), i, None, spec)
             for i, r in enumerate(records)]
    submitted = await submit(request, entry.schema, items)
    return json_response(render_label(submitted, entry.schema, items, column=column, all_probs=all_probs,
                                      id_is_text=has_id))


def _text_row(value, spec, has_id: bool) -> dict:
    """A record given as a bare value: the text itself (through the template's only column, or
    the text field)."""
    if spec.template is not None:
        cols = [c for c in spec.columns_needed() if c != spec.id_field]
        return {c: value for c in cols[:1]}
    return {spec.text_field: value}


def render_label(submitted, schema, items, *, column: str, all_probs: bool, id_is_text: bool) -> dict:
    """The ``/v1/label`` response body: rows built with the CLI's own ``output_schema`` and
    ``results_table`` (so the columns, types and values are the Parquet file's), errors, metadata, usage."""
    labelled = [r for r in submitted.results if isinstance(r, RecordResult)]
    rows: list[dict] = []
    if labelled:
        arrow_schema = submitted.labeler.output_schema(column, pa.string() if id_is_text else pa.int64(),
                                                       all_probs=all_probs)
        rows = results_table(labelled, schema, arrow_schema).to_pylist()
        maps = [f.name for f in arrow_schema if pa.types.is_map(f.type)]
        for row in rows:
            for name in maps:
                if row[name] is not None:
                    row[name] = dict(row[name])
    errors = [{"row": i, "record": r.id, "error": r.error} for i, r in enumerate(submitted.results)
              if not isinstance(r, RecordResult)]
    truncated = sum(bool(r.truncated) for r in labelled)
    metadata = dict(submitted.labeler_metadata) | {
        "pcd.records_read": str(len(items)), "pcd.records_labelled": str(len(labelled)),
        "pcd.records_failed": str(len(errors)), "pcd.records_truncated": str(truncated)}
    return {"rows": rows, "errors": errors, "metadata": metadata,
            "usage": {"records": len(items), "input_tokens": int(submitted.input_tokens),
                      "queue_ms": round(float(submitted.queue_ms), 3), "decode_ms": round(float(submitted.decode_ms), 3)}}


async def submit(request: Request, schema, records):
    """``service.submit`` for this request: its id, the configured deadline, its connection."""
    service: LabelService = request.app.state.service
    timeout = request.app.state.config.request_timeout_s
    return await service.submit(schema, records, request_id=request_id(request),
                                deadline=time.monotonic() + timeout if timeout else None,
                                is_disconnected=request.is_disconnected)


def _invalid(where: str, message: str) -> ApiError:
    return ApiError(422, "invalid_request_error", "invalid_request", message)


async def schemas(request: Request) -> Response:
    """``GET /v1/schemas``: the served schemas (names, fields, labels, schema and prompt-head sha256)."""
    service: LabelService = request.app.state.service
    return json_response({"model": service.model_id, "schemas": service.schema_info()})


async def health(request: Request) -> Response:
    """``GET /health``: 200 while the event loop answers (decoding runs on another thread)."""
    return json_response({"status": "ok"})


async def ready(request: Request) -> Response:
    """``GET /ready``: 200 once the model, every startup schema and a warm-up decode are ready;
    503 before, after a failed start, and while draining."""
    service: LabelService = request.app.state.service
    if service.draining:
        raise ApiError(503, "server_error", "draining", "the server is draining (SIGTERM); it takes no new work",
                       {"Retry-After": "1"})
    if service.startup_error is not None:
        raise ApiError(503, "server_error", "startup_failed", f"the server could not start: {service.startup_error}")
    if not service.ready.is_set():
        raise ApiError(503, "server_error", "not_ready", "the model and schemas are still loading",
                       {"Retry-After": "1"})
    return json_response({"status": "ready", "model": service.model_id})


async def metrics(request: Request) -> Response:
    """``GET /metrics``: Prometheus text."""
    from prometheus_client import CONTENT_TYPE_LATEST

    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE_LATEST)


async def _api_error(request: Request, exc: ApiError) -> Response:
    if exc.status >= 500 and exc.code not in ("draining", "not_ready", "deadline_exceeded", "shutting_down"):
        log.error("%s: %s", request_id(request), exc.message)
    return error_response(exc)


async def _disconnected(request: Request, exc: ClientDisconnected) -> Response:
    return Response(status_code=499)  # nobody reads it; uvicorn drops it


async def _crash(request: Request, exc: Exception) -> Response:
    log.exception("%s: unhandled error", request_id(request))
    return error_response(ApiError(500, "server_error", "internal_error",
                                   "the server failed on this request; the log has the details under its request id"))


def create_app(service: LabelService, config: AppConfig = AppConfig(), *,
               extra_routes: Iterable[BaseRoute] = ()) -> Starlette:
    """The Starlette app over ``service``.

    Args:
        service: the ``LabelService`` (started by the caller).
        config: limits, keys, CORS.
        extra_routes: more routes (added after pcd's own and the protocol modules').

    The protocol modules (``PROTOCOL_MODULES``) are imported when present; each gives
    ``routes(service, config) -> list[Route]``.
    """
    routes: list[BaseRoute] = [
        Route("/v1/label", _wrap(label), methods=["POST"]),
        Route("/v1/schemas", schemas, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/ready", ready, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    id_headers: dict[str, str] = {}  # path -> the protocol's own request-id header, on errors too
    for name in PROTOCOL_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        added = module.routes(service, config)
        header = getattr(module, "REQUEST_ID_HEADER", REQUEST_ID_HEADER)
        if header != REQUEST_ID_HEADER:
            id_headers.update({r.path: header for r in added if hasattr(r, "path")})
        routes.extend(added)
    routes.extend(extra_routes)
    metrics_ = Metrics(service)
    middleware = []
    if config.cors_origins:
        from starlette.middleware.cors import CORSMiddleware

        middleware.append(Middleware(CORSMiddleware, allow_origins=list(config.cors_origins),
                                     allow_methods=["GET", "POST"],
                                     allow_headers=["authorization", "content-type", "x-api-key", "x-request-id"],
                                     expose_headers=["x-request-id", "x-typesafe-request-id", "retry-after"]))
    middleware.append(Middleware(RequestContext, api_keys=tuple(config.api_keys), metrics=metrics_,
                                 known_paths=[r.path for r in routes if hasattr(r, "path")], id_headers=id_headers))
    app = Starlette(routes=routes, middleware=middleware,
                    exception_handlers={ApiError: _api_error, ClientDisconnected: _disconnected, Exception: _crash})
    app.state.service = service
    app.state.config = config
    app.state.metrics = metrics_
    return app


def _wrap(endpoint):
    """``endpoint`` with its ``ApiError`` and crashes rendered as error bodies (a crash never
    reaches the server)."""

    async def wrapped(request: Request) -> Response:
        try:
            return await endpoint(request)
        except ApiError as exc:
            return await _api_error(request, exc)
        except ClientDisconnected as exc:
            return await _disconnected(request, exc)
        except Exception as exc:  # noqa: BLE001
            return await _crash(request, exc)

    wrapped.__doc__ = endpoint.__doc__
    return wrapped
