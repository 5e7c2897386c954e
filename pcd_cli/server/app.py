"""The HTTP app of ``pcd serve``: a Starlette app built by ``create_app(service, config)``.

No globals: everything a route needs hangs on ``app.state`` (``service``, ``config``,
``metrics``), so a Ray Serve deployment can build one app per replica.

Routes: ``POST /v1/label`` (rows with the columns and values of ``pcd label``'s Parquet output),
``GET /v1/schemas``, ``GET /health``, ``GET /ready``, ``GET /metrics``, and the routes of
``pcd_cli.server.jev`` and ``pcd_cli.server.decisions`` (each module's ``routes(service, config)``),
plus any ``extra_routes``.

Every response carries ``x-request-id`` (the client's own, if it sent a usable one, else a new
``req_<32 hex>``); every log line about a request names it (a client's id with ``#<n>`` added, so
two requests sending the same id stay apart); record text is never logged, nor an exception's
message (``errors.log_crash``). Every route but ``/health`` and ``/ready`` needs an API key when
``config.api_keys`` is set. Every error, routing ones (404, 405) included, is the
``{"error": {type, code, message}}`` envelope.

Before a route runs, in this order (the middleware stack of ``create_app``): ``RequestContext``
(ids, access log, metrics, the body's receive deadline: 408), CORS (``--cors-origin``), then
``RequestGuard``: the ``Host`` check against DNS rebinding (421), the API key (401), a cross-origin
``Origin`` not allowed by ``--cors-origin`` (403) and a body that is not JSON (415).
"""

from __future__ import annotations

import asyncio
import hmac
import importlib
import itertools
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
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ..errors import PcdError
from ..io.output import check_columns, results_table
from ..io.readers import DEFAULT_ID_COLUMN, InputSpec, row_to_record
from ..results import RecordResult
from .errors import ApiError, log_crash, printable
from .protocols import read_json
from .service import ClientDisconnected, LabelService

log = logging.getLogger("pcd.server")

#: Routes answered without an API key (probes).
OPEN_PATHS = frozenset({"/health", "/ready"})
#: Modules whose ``routes(service, config)`` are added when they exist (the Jev and OpenAI routes).
PROTOCOL_MODULES = ("pcd_cli.server.jev", "pcd_cli.server.decisions")
REQUEST_ID_HEADER = "x-request-id"
_GOOD_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
#: Host names a server listening on loopback answers for (plus ``--allowed-host`` names).
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
#: Request headers a browser may preflight for the routes (``--cors-origin``): pcd's own, the
#: ``openai`` SDK's and ``typesafe-sdk``'s; ``CORS_HEADER_PREFIXES`` covers the SDKs' families
#: (``x-stainless-os``, ``x-stainless-retry-count``, ``X-TypeSafe-SDK``, ...).
CORS_HEADERS = frozenset({"authorization", "content-type", "content-encoding", "accept", "x-api-key", "x-request-id",
                          "x-typesafe-request-id", "idempotency-key", "openai-organization", "openai-project",
                          "openai-beta"})
CORS_HEADER_PREFIXES = ("x-stainless-", "x-typesafe-")
#: Methods whose body must be JSON (415 otherwise).
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


@dataclass(frozen=True)
class AppConfig:
    """HTTP-side settings of ``pcd serve``.

    Attributes:
        api_keys: keys accepted (``Authorization: Bearer KEY``, ``x-api-key: KEY``, or KEY as the
            password of ``Authorization: Basic``, as Label Studio sends it); empty: no
            key needed.
        max_body_bytes: largest request body (after decompression); larger is 413, refused
            while streaming (never read whole).
        max_records_per_request: most records in one ``/v1/label`` request (most questions in
            a Jev or OpenAI one); more is 413.
        request_timeout_s: a request not answered this long after it arrived gets 503.
        cors_origins: origins allowed by CORS; empty: no CORS headers at all.
        read_timeout_s: most seconds to receive a request's header block (from its first byte,
            or from the connection's opening) and, separately, its body (from the end of the
            headers); past it 408 and the connection is closed (Slowloris, CVE-2007-6750).
            ``None``: ``request_timeout_s`` (60 when that is ``None`` too).
        max_header_bytes: largest request line plus header block; larger is 431 (RFC 6585 §5)
            and the connection is closed (h11's ``max_incomplete_event_size``).
        max_connections: most open connections; one more is answered 503 ``too_many_connections``
            (``Retry-After: 1``) and closed.
        allowed_hosts: ``Host`` names answered besides the loopback ones when the server listens
            on loopback (and the only ones answered otherwise, when given); ``"*"``: any Host.
            Another Host is 421 (RFC 9110 §15.5.20): a web page reaching a loopback server
            through DNS rebinding sends its own name.
    """

    api_keys: tuple[str, ...] = ()
    max_body_bytes: int = 8 * 1024 * 1024
    max_records_per_request: int = 1024
    request_timeout_s: float | None = 60.0
    cors_origins: tuple[str, ...] = ()
    read_timeout_s: float | None = None
    max_header_bytes: int = 64 * 1024
    max_connections: int = 1024
    allowed_hosts: tuple[str, ...] = ()
    #: ``pcd serve --label-studio``: a ``label_studio.LabelStudioConfig`` mounts the Label Studio
    #: ML backend routes (``/setup``, ``/predict``, ``/webhook``, ``/train``, ``/versions``).
    label_studio: Any = None

    @property
    def receive_timeout_s(self) -> float:
        """``read_timeout_s``, else ``request_timeout_s``, else 60 seconds."""
        return float(self.read_timeout_s or self.request_timeout_s or 60.0)


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
    """ASGI middleware, outermost: request ids, the access log line, request metrics, and the
    receive deadline of the body.

    Every response carries ``x-request-id``; a protocol route whose module names another
    request-id header (``id_headers``: path -> header, e.g. the Jev routes' ``x-typesafe-request-id``)
    carries that one too, the middleware's own answers (401) included. ``request.state.log_id``
    names the request in the log: the id itself when the server made it, the client's id plus
    ``#<n>`` (a per-app counter) when the client sent one. One path ending in ``/`` is served as
    the route without it (never a redirect: a redirect would be built from the client's own
    ``Host`` and ``X-Forwarded-Proto``). The body must arrive within ``receive_timeout_s`` of the
    headers; past it the route's read raises ``ApiError`` 408 (``Connection: close``)."""

    def __init__(self, app, *, metrics: Metrics, known_paths: Iterable[str],
                 id_headers: dict[str, str] | None = None, receive_timeout_s: float = 60.0):
        self.app = app
        self.id_headers = {path: h.encode() for path, h in (id_headers or {}).items()}
        self.metrics = metrics
        self.known = frozenset(known_paths)
        self.receive_timeout_s = receive_timeout_s
        self._numbers = itertools.count(1)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        given = _header(scope, b"x-request-id")
        if given and _GOOD_ID.fullmatch(given):
            rid, log_id = given, f"{given}#{next(self._numbers)}"
        else:
            rid = log_id = "req_" + uuid.uuid4().hex
        state = scope.setdefault("state", {})
        state["request_id"], state["log_id"] = rid, log_id
        state["arrived"] = time.monotonic()  # the request deadline counts from here, body reading included
        path = scope.get("path", "")
        if len(path) > 1 and path.endswith("/") and path.rstrip("/") in self.known:
            path = path.rstrip("/")
            scope = {**scope, "path": path, "raw_path": path.encode()}
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

        body_deadline = time.monotonic() + self.receive_timeout_s
        body_done = False

        async def receive_by_deadline():
            nonlocal body_done
            if body_done:
                return await receive()
            left = body_deadline - time.monotonic()
            try:
                if left <= 0:
                    raise asyncio.TimeoutError
                message = await asyncio.wait_for(receive(), left)
            except asyncio.TimeoutError:
                body_done = True
                raise ApiError(408, "invalid_request_error", "request_timeout",
                               f"the request body did not arrive within {self.receive_timeout_s:g} s of its headers "
                               "(--read-timeout-s); send it at once", {"Connection": "close"}) from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_done = True
            return message

        try:
            await self.app(scope, receive_by_deadline, send_with_id)
        finally:
            seconds = time.perf_counter() - started
            if status["code"] == 413:
                self.metrics.refused["too_large"] += 1
            self.metrics.requests.labels(route, str(status["code"])).inc()
            self.metrics.seconds.labels(route).observe(seconds)
            preflight = scope.get("method") == "OPTIONS" and _header(scope, b"access-control-request-method")
            log.info("%s %s %s %d %.1f ms%s", log_id, scope.get("method"), route, status["code"], seconds * 1e3,
                     " (CORS preflight)" if preflight else "")


class RequestGuard:
    """ASGI middleware, inside CORS (so its refusals carry the CORS headers): refuses a request
    before any route reads it. In this order:

    * ``Host`` (when ``hosts`` is given): a name or address not in ``hosts`` is 421
      ``misdirected_request`` (RFC 9110 §15.5.20); a missing Host (HTTP/1.0) passes. This is
      what keeps a keyless server on loopback from being driven by a web page through DNS
      rebinding (the page's requests carry the attacker's name).
    * the API key (when ``api_keys`` is set): 401 ``invalid_api_key`` with ``WWW-Authenticate``.
    * ``Origin`` on a POST: a browser's cross-origin request from an origin not in
      ``cors_origins`` (and not the server's own) is 403 ``origin_not_allowed``.
    * the body's ``Content-Type`` on POST, PUT and PATCH: JSON only (``application/json`` or a
      ``+json`` type; none given passes): anything else is 415 ``unsupported_media_type`` with
      ``Accept: application/json`` (RFC 9110 §15.5.16), so a browser's preflight-free
      ``text/plain`` POST is never parsed.

    ``/health`` and ``/ready`` (``OPEN_PATHS``) are always open; CORS preflights (``OPTIONS``)
    never need a key.
    """

    def __init__(self, app, *, api_keys: tuple[str, ...], metrics: Metrics, hosts: frozenset[str] | None,
                 cors_origins: tuple[str, ...] = ()):
        self.app = app
        self.keys = tuple(k.encode() for k in api_keys)
        self.metrics = metrics
        self.hosts = hosts
        self.origins = frozenset(o.rstrip("/").lower() for o in cors_origins)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("path", "") in OPEN_PATHS:
            return await self.app(scope, receive, send)
        err = self._refusal(scope)
        if err is not None:
            return await error_response(err)(scope, receive, send)
        await self.app(scope, receive, send)

    def _refusal(self, scope) -> ApiError | None:
        method = scope.get("method")
        host = _header(scope, b"host")
        if self.hosts is not None and host is not None and host_name(host) not in self.hosts:
            self.metrics.refused["misdirected"] += 1
            return ApiError(421, "invalid_request_error", "misdirected_request",
                            f"this server does not answer for Host {printable(host)[:100]!r}; it answers for "
                            f"{', '.join(sorted(self.hosts))} (--allowed-host adds a name)")
        if self.keys and method != "OPTIONS" and not self._authorized(scope):
            self.metrics.refused["unauthorized"] += 1
            return ApiError(401, "authentication_error", "invalid_api_key",
                            "a valid API key is needed: send 'Authorization: Bearer <key>'",
                            {"WWW-Authenticate": "Bearer"})
        if method in _BODY_METHODS:
            origin = _header(scope, b"origin")
            if origin is not None and origin.rstrip("/").lower() not in self.origins \
                    and host_name(origin.split("://", 1)[-1]) != (host_name(host) if host else None):
                self.metrics.refused["origin_not_allowed"] += 1
                return ApiError(403, "permission_error", "origin_not_allowed",
                                f"requests from the web origin {printable(origin)[:100]!r} are not allowed; "
                                "--cors-origin lists the origins a browser may call this server from")
            ctype = (_header(scope, b"content-type") or "").split(";", 1)[0].strip().lower()
            if ctype and ctype != "application/json" and not ctype.endswith("+json") \
                    and not ctype.startswith("multipart/"):  # multipart: read_json's own 415 names it
                self.metrics.refused["unsupported_media_type"] += 1
                return ApiError(415, "invalid_request_error", "unsupported_media_type",
                                f"Content-Type {printable(ctype)[:100]!r} is not accepted: send the body as JSON "
                                "with 'Content-Type: application/json'", {"Accept": "application/json"})
        return None

    def _authorized(self, scope) -> bool:
        """Whether the request carries one of the keys (every key compared in constant time)."""
        auth = _header(scope, b"authorization") or ""
        given = auth[7:].strip() if auth[:7].lower() == "bearer " else _basic_password(auth) \
            if auth[:6].lower() == "basic " else (_header(scope, b"x-api-key") or "")
        given_b = given.encode("latin-1", "replace")
        ok = False
        for key in self.keys:
            ok |= hmac.compare_digest(given_b, key)
        return ok


def _basic_password(auth: str) -> str:
    """The password of ``Authorization: Basic base64(user:password)``: Label Studio's ML backend
    settings send their basic-auth user and password this way (``MLBackend.basic_auth``); the
    password is checked as an API key (any user name). Empty when it does not decode."""
    import base64
    import binascii

    try:
        return base64.b64decode(auth[6:].strip(), validate=True).decode("latin-1").partition(":")[2]
    except (binascii.Error, ValueError):
        return ""


def host_name(host: str) -> str:
    """The name or address of a ``Host`` value (or of an origin without its scheme), lower-cased,
    without the port: ``Example.com:8000`` -> ``example.com``, ``[::1]:8000`` -> ``[::1]``."""
    host = host.strip().lower().split("/", 1)[0]
    if host.startswith("["):
        return host.split("]", 1)[0] + "]"
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def allowed_hosts(config: AppConfig, listen_host: str | None) -> frozenset[str] | None:
    """The ``Host`` names ``RequestGuard`` answers for: the loopback names plus
    ``config.allowed_hosts`` when ``listen_host`` is a loopback address; only
    ``config.allowed_hosts`` when given for another address; ``None`` (no check) otherwise, or
    when ``allowed_hosts`` holds ``"*"``."""
    extra = frozenset(host_name(h) for h in config.allowed_hosts)
    if "*" in extra:
        return None
    if listen_host is not None and is_loopback(listen_host):
        return LOOPBACK_HOSTS | extra | {host_name(listen_host)}
    return extra or None


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is a loopback address."""
    import ipaddress

    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class _Cors(CORSMiddleware):
    """Starlette's CORS middleware that allows the request headers of ``CORS_HEADERS`` and the
    ``CORS_HEADER_PREFIXES`` families, and refuses a preflight with the error envelope."""

    def preflight_response(self, request_headers) -> Response:
        requested = [h.strip().lower() for h in request_headers.get("access-control-request-headers", "").split(",")
                     if h.strip()]
        unknown = [h for h in requested if h not in CORS_HEADERS and not h.startswith(CORS_HEADER_PREFIXES)]
        response = super().preflight_response(request_headers)
        if unknown or response.status_code != 200:
            failures = response.body.decode("latin-1").removeprefix("Disallowed CORS ") if response.status_code != 200 \
                else "headers"
            why = f"header {unknown[0]!r} is not one a request to pcd carries" if unknown else f"{failures} not allowed"
            err = ApiError(400, "invalid_request_error", "cors_preflight_refused",
                           f"CORS preflight refused: {printable(why)}; allowed origins are set by --cors-origin")
            headers = {k: v for k, v in response.headers.items() if k.lower().startswith("access-control-")
                       and k.lower() != "access-control-allow-origin" or k.lower() == "vary"}
            if "origin" not in failures:
                headers["Access-Control-Allow-Origin"] = request_headers["origin"]
            return json_response(err.body(), 400, headers)
        return response


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
    body = await read_json(request, config.max_body_bytes, text_checked_by_caller=("records",))
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
    """``service.submit`` for this request: its log id, the configured deadline (counted from the
    request's arrival, ``RequestContext``), its connection."""
    service: LabelService = request.app.state.service
    timeout = request.app.state.config.request_timeout_s
    arrived = getattr(request.state, "arrived", None) or time.monotonic()
    return await service.submit(schema, records, request_id=request.state.log_id,
                                deadline=arrived + timeout if timeout else None,
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
        log.error("%s: %s (%s)", _log_id(request), exc.code, exc.status)
    return error_response(exc)


async def _disconnected(request: Request, exc: Exception) -> Response:
    """499 for a client that left (while its upload streamed in, or while its request waited);
    nobody reads it, and the access log line (INFO) is the only line about it."""
    return Response(status_code=499)


async def _crash(request: Request, exc: Exception) -> Response:
    log_crash(log, f"{_log_id(request)}: unhandled error", exc)
    return error_response(ApiError(500, "server_error", "internal_error",
                                   "the server failed on this request; the log has the details under its request id"))


#: ``code`` of the routing errors (``HTTPException`` raised by Starlette's router).
_HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}


async def _http_error(request: Request, exc: HTTPException) -> Response:
    """A routing error (404 no such route, 405 a method the route does not take, with ``Allow``
    as RFC 9110 §15.5.6 asks) in the error envelope, so that the official clients read its
    ``code``."""
    method, path = request.method, printable(request.url.path)[:200]
    headers = dict(exc.headers or {})
    if "Allow" in headers:  # Starlette builds it from a set: sorted, so that it reads the same each time
        headers["Allow"] = ", ".join(sorted(m.strip() for m in headers["Allow"].split(",")))
    if exc.status_code == 404:
        message = f"no route {path!r}; pcd serves /v1/label, /v1/schemas, /v1/systemone, /v1/models, /v1/decisions, " \
                  "/health, /ready and /metrics"
    elif exc.status_code == 405:
        message = f"{method} is not allowed on {path!r}; allowed: {headers.get('Allow', '')}"
    else:
        message = printable(str(exc.detail))
    return error_response(ApiError(exc.status_code, "invalid_request_error",
                                   _HTTP_CODES.get(exc.status_code, "http_error"), message, headers))


def _log_id(request: Request) -> str:
    return getattr(request.state, "log_id", None) or request_id(request)


def create_app(service: LabelService, config: AppConfig = AppConfig(), *,
               extra_routes: Iterable[BaseRoute] = (), listen_host: str | None = None) -> Starlette:
    """The Starlette app over ``service``.

    Args:
        service: the ``LabelService`` (started by the caller).
        config: limits, keys, CORS, hosts.
        extra_routes: more routes (added after pcd's own and the protocol modules').
        listen_host: the address the server listens on: on loopback, only loopback ``Host``
            names (and ``config.allowed_hosts``) are answered (``allowed_hosts``).

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
    backend = None
    if config.label_studio is not None:
        from .label_studio import LabelStudioBackend

        backend = LabelStudioBackend(service, config.label_studio, render=render_label)
        routes.extend(backend.routes())
        backend.restore()
    routes.extend(extra_routes)
    metrics_ = Metrics(service)
    middleware = [Middleware(RequestContext, metrics=metrics_, known_paths=[r.path for r in routes if hasattr(r, "path")],
                             id_headers=id_headers, receive_timeout_s=config.receive_timeout_s)]
    if config.cors_origins:
        middleware.append(Middleware(_Cors, allow_origins=list(config.cors_origins), allow_methods=["GET", "POST"],
                                     allow_headers=["*"],  # mirrored once _Cors has checked them
                                     expose_headers=["x-request-id", "x-typesafe-request-id", "retry-after"]))
    middleware.append(Middleware(RequestGuard, api_keys=tuple(config.api_keys), metrics=metrics_,
                                 hosts=allowed_hosts(config, listen_host), cors_origins=tuple(config.cors_origins)))
    app = Starlette(routes=routes, middleware=middleware,
                    exception_handlers={ApiError: _api_error, ClientDisconnected: _disconnected,
                                        ClientDisconnect: _disconnected, HTTPException: _http_error,
                                        Exception: _crash})
    app.router.redirect_slashes = False  # RequestContext serves "/v1/label/" as "/v1/label"
    app.state.service = service
    app.state.config = config
    app.state.metrics = metrics_
    app.state.label_studio = backend
    return app


def _wrap(endpoint):
    """``endpoint`` with its ``ApiError`` and crashes rendered as error bodies (a crash never
    reaches the server)."""

    async def wrapped(request: Request) -> Response:
        try:
            return await endpoint(request)
        except ApiError as exc:
            return await _api_error(request, exc)
        except (ClientDisconnected, ClientDisconnect) as exc:
            return await _disconnected(request, exc)
        except Exception as exc:  # noqa: BLE001
            return await _crash(request, exc)

    wrapped.__doc__ = endpoint.__doc__
    return wrapped
