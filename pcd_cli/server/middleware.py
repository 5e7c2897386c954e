"""The ASGI middleware of ``pcd serve``, outermost first (``app.create_app`` stacks them):
``RequestContext`` (request ids, the access log, metrics, the body's receive deadline: 408), CORS
(``--cors-origin``, ``Cors``), then ``RequestGuard``: the ``Host`` check against DNS rebinding (421),
the API key (401), a cross-origin ``Origin`` not allowed (403) and a body that is not JSON (415).
Also the app's Prometheus ``Metrics`` and the host-name helpers.

Every response carries ``x-request-id`` (the client's own, if it sent a usable one, else a new
``req_<32 hex>``); every log line about a request names it (a client's id with ``#<n>`` added, so
two requests sending the same id stay apart); record text is never logged.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import logging
import re
import time
import uuid
from collections import Counter
from typing import TYPE_CHECKING, Iterable

from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response

from .errors import ApiError, error_response, json_response, printable
from .service import LabelService

if TYPE_CHECKING:
    from .config import AppConfig

log = logging.getLogger("pcd.server")

#: Routes answered without an API key (probes).
OPEN_PATHS = frozenset({"/health", "/ready"})
REQUEST_ID_HEADER = "x-request-id"
_GOOD_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
#: Host names a server listening on loopback answers for (plus ``--allowed-host`` names).
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
#: Request headers a browser may preflight for any route (``--cors-origin``): pcd's own; each wire
#: format adds its clients' (``wire.WireFormat.client_headers`` and ``client_header_prefixes``:
#: the ``openai`` SDK's ``x-stainless-*``, ``typesafe-sdk``'s ``x-typesafe-*``, ...).
CORS_HEADERS = frozenset({"authorization", "content-type", "content-encoding", "accept", "x-api-key", "x-request-id"})
#: Methods whose body must be JSON (415 otherwise).
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


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


class RequestContext:
    """ASGI middleware, outermost: request ids, the access log line, request metrics, and the
    receive deadline of the body.

    Every response carries ``x-request-id``; a route whose wire format names other request-id
    headers (``id_headers``: path -> headers, from ``wire.WireFormat.request_id_headers``, e.g. the
    Jev routes' ``x-typesafe-request-id``) carries those too, the middleware's own answers (401)
    included. ``request.state.log_id``
    names the request in the log: the id itself when the server made it, the client's id plus
    ``#<n>`` (a per-app counter) when the client sent one. One path ending in ``/`` is served as
    the route without it (never a redirect: a redirect would be built from the client's own
    ``Host`` and ``X-Forwarded-Proto``). The body must arrive within ``receive_timeout_s`` of the
    headers; past it the route's read raises ``ApiError`` 408 (``Connection: close``)."""

    def __init__(self, app, *, metrics: Metrics, known_paths: Iterable[str],
                 id_headers: dict[str, tuple[str, ...]] | None = None, receive_timeout_s: float = 60.0):
        self.app = app
        self.id_headers = {path: tuple(h.lower().encode() for h in hs) for path, hs in (id_headers or {}).items()}
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
                for own in self.id_headers.get(path, ()):  # e.g. x-typesafe-request-id on a 401 from /v1/systemone
                    if all(k.lower() != own for k, _ in headers):
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


class Cors(CORSMiddleware):
    """Starlette's CORS middleware that allows the request headers of ``CORS_HEADERS``, plus the
    wire formats' ``client_headers`` and ``client_header_prefixes`` families, and refuses a
    preflight with the error envelope.

    Args:
        client_headers, client_header_prefixes: the wire formats' clients' request headers
            (``wire.WireFormat``), read by ``app.create_app`` from the declarations.
        **options: Starlette's ``CORSMiddleware`` options.
    """

    def __init__(self, app, *, client_headers: Iterable[str] = (), client_header_prefixes: Iterable[str] = (),
                 **options):
        super().__init__(app, **options)
        self.known_headers = CORS_HEADERS | frozenset(h.lower() for h in client_headers)
        self.known_prefixes = tuple(p.lower() for p in client_header_prefixes)

    def preflight_response(self, request_headers) -> Response:
        requested = [h.strip().lower() for h in request_headers.get("access-control-request-headers", "").split(",")
                     if h.strip()]
        unknown = [h for h in requested if h not in self.known_headers and not h.startswith(self.known_prefixes)]
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
