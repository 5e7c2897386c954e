"""The HTTP app of ``pcd serve``: a Starlette app built by ``create_app(service, config)``.

No globals: everything a route needs hangs on the ``wire.Server`` its format was mounted over (and
on ``app.state``: ``service``, ``config``, ``metrics``, ``label_studio``, ``paths``), so a Ray Serve
deployment can build one app per replica.

The house: each wire format is one module of ``formats/`` (``FORMATS``, mounted in that order),
each a ``routes(server)`` whose handlers take a ``wire.Call`` (one submit, one deadline counted
from arrival); the probes (``/health``, ``/ready``, ``/metrics``) are the app's own; the error
envelope, the status of each error kind and the handlers are ``errors.py``'s; the middleware
(request ids, access log, metrics, receive deadline, CORS, Host, API key, Content-Type) is
``middleware.py``'s; the limits' defaults are ``limits.py``'s. A new format is one module and one
line of ``FORMATS``.

Every route but ``/health`` and ``/ready`` needs an API key when ``config.api_keys`` is set. Every
error, routing ones (404, 405) included, is the ``{"error": {type, code, message}}`` envelope.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from . import limits
from .errors import HANDLERS, ApiError, json_response
from .formats import decisions, jev, label_studio, pcd
from .label_studio import LabelStudioBackend, LabelStudioConfig
from .middleware import REQUEST_ID_HEADER, Cors, Metrics, RequestContext, RequestGuard, allowed_hosts
from .service import LabelService
from .wire import Server

#: The wire formats, in the order their routes are mounted: one module each (``formats/``), each
#: ``routes(server) -> list[Route]``, and ``REQUEST_ID_HEADER`` when its clients read the request
#: id under another header.
FORMATS = (pcd, jev, decisions, label_studio)


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
    max_body_bytes: int = limits.MAX_BODY_BYTES
    max_records_per_request: int = limits.MAX_RECORDS_PER_REQUEST
    request_timeout_s: float | None = limits.REQUEST_TIMEOUT_S
    cors_origins: tuple[str, ...] = ()
    read_timeout_s: float | None = None
    max_header_bytes: int = limits.MAX_HEADER_BYTES
    max_connections: int = limits.MAX_CONNECTIONS
    allowed_hosts: tuple[str, ...] = ()
    #: ``pcd serve --label-studio``: a ``label_studio.LabelStudioConfig`` mounts the Label Studio
    #: ML backend routes (``/setup``, ``/predict``, ``/webhook``, ``/train``, ``/versions``).
    label_studio: LabelStudioConfig | None = None

    @property
    def receive_timeout_s(self) -> float:
        """``read_timeout_s``, else ``request_timeout_s``, else 60 seconds."""
        return float(self.read_timeout_s or self.request_timeout_s or 60.0)


# -- the probes ----------------------------------------------------------------------------------
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


PROBES = (Route("/health", health, methods=["GET"]), Route("/ready", ready, methods=["GET"]),
          Route("/metrics", metrics, methods=["GET"]))


def create_app(service: LabelService, config: AppConfig = AppConfig(), *,
               extra_routes: Iterable[BaseRoute] = (), listen_host: str | None = None) -> Starlette:
    """The Starlette app over ``service``.

    Args:
        service: the ``LabelService`` (started by the caller).
        config: limits, keys, CORS, hosts; ``config.label_studio`` adds the Label Studio backend.
        extra_routes: more routes (added after the formats' and the probes).
        listen_host: the address the server listens on: on loopback, only loopback ``Host``
            names (and ``config.allowed_hosts``) are answered (``allowed_hosts``).
    """
    backend = LabelStudioBackend(service, config.label_studio) if config.label_studio is not None else None
    server = Server(service, config, backend)
    routes: list[BaseRoute] = []
    id_headers: dict[str, str] = {}  # path -> the format's own request-id header, on errors too
    for fmt in FORMATS:
        added = fmt.routes(server)
        header = getattr(fmt, "REQUEST_ID_HEADER", REQUEST_ID_HEADER)
        if header != REQUEST_ID_HEADER:
            id_headers.update({r.path: header for r in added})
        routes.extend(added)
    routes.extend(PROBES)
    served = [r.path for r in routes]  # what the 404 names
    routes.extend(extra_routes)
    paths = [r.path for r in routes if hasattr(r, "path")]
    metrics_ = Metrics(service)
    middleware = [Middleware(RequestContext, metrics=metrics_, known_paths=paths, id_headers=id_headers,
                             receive_timeout_s=config.receive_timeout_s)]
    if config.cors_origins:
        middleware.append(Middleware(Cors, allow_origins=list(config.cors_origins), allow_methods=["GET", "POST"],
                                     allow_headers=["*"],  # mirrored once Cors has checked them
                                     expose_headers=["x-request-id", "x-typesafe-request-id", "retry-after"]))
    middleware.append(Middleware(RequestGuard, api_keys=tuple(config.api_keys), metrics=metrics_,
                                 hosts=allowed_hosts(config, listen_host), cors_origins=tuple(config.cors_origins)))
    app = Starlette(routes=routes, middleware=middleware, exception_handlers=HANDLERS)
    app.router.redirect_slashes = False  # RequestContext serves "/v1/label/" as "/v1/label"
    app.state.service = service
    app.state.config = config
    app.state.metrics = metrics_
    app.state.label_studio = backend
    app.state.paths = served
    if backend is not None:
        backend.restore()
    return app
