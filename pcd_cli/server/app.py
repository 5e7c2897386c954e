"""The HTTP app of ``pcd serve``: a Starlette app built by ``create_app(service, config)``.

No globals: everything a route needs hangs on the ``wire.Server`` its format was mounted over (and
on ``app.state``: ``service``, ``config``, ``metrics``, ``label_studio``, ``paths``), so a Ray Serve
deployment can build one app per replica.

The house: each wire format is one module of ``formats/`` declaring its ``FORMAT`` (a
``wire.WireFormat``: ``routes(server)``, whose handlers take a ``wire.Call`` (one submit, one
deadline counted from arrival), and the headers its clients read and send); ``FORMATS`` mounts them
in that order; the probes (``/health``, ``/ready``, ``/metrics``) are the app's own; the error
envelope, the status of each error kind and the handlers are ``errors.py``'s; the middleware
(request ids, access log, metrics, receive deadline, CORS, Host, API key, Content-Type) is
``middleware.py``'s, given the formats' headers from their declarations; the limits' defaults are
``limits.py``'s. A new format is one module and one line of ``FORMATS``.

Every route but ``/health`` and ``/ready`` needs an API key when ``config.api_keys`` is set. Every
error, routing ones (404, 405) included, is the ``{"error": {type, code, message}}`` envelope.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from .config import AppConfig
from .errors import EXPOSED_HEADERS, HANDLERS, json_response
from .formats import decisions, jev, label_studio, pcd
from .label_studio import LabelStudioBackend
from .middleware import REQUEST_ID_HEADER, Cors, Metrics, RequestContext, RequestGuard, allowed_hosts
from .service import LabelService
from .service_errors import Draining, NotReady, StartupFailed
from .wire import Server, WireFormat

#: The wire formats, in the order their routes are mounted: each module's one declaration
#: (``wire.WireFormat``: its routes, its request-id headers, its clients' request headers).
FORMATS: tuple[WireFormat, ...] = (pcd.FORMAT, jev.FORMAT, decisions.FORMAT, label_studio.FORMAT)


# -- the probes ----------------------------------------------------------------------------------
async def health(request: Request) -> Response:
    """``GET /health``: 200 while the event loop answers (decoding runs on another thread)."""
    return json_response({"status": "ok"})


async def ready(request: Request) -> Response:
    """``GET /ready``: 200 once the model, every startup schema and a warm-up decode are ready;
    503 before, after a failed start, and while draining."""
    service: LabelService = request.app.state.service
    if service.draining:
        raise Draining("the server is draining (asked to stop: SIGTERM or Ctrl-C); it takes no new work")
    if service.startup_error is not None:
        raise StartupFailed(f"the server could not start: {service.startup_error}")
    if not service.ready.is_set():
        raise NotReady("the model and schemas are still loading")
    return json_response({"status": "ready", "model": service.model_id})


async def metrics(request: Request) -> Response:
    """``GET /metrics``: Prometheus text."""
    from prometheus_client import CONTENT_TYPE_LATEST

    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE_LATEST)


PROBES = (Route("/health", health, methods=["GET"]), Route("/ready", ready, methods=["GET"]),
          Route("/metrics", metrics, methods=["GET"]))


def create_app(service: LabelService, config: AppConfig = AppConfig(), *,
               extra_routes: Iterable[BaseRoute] = (), listen_host: str | None = None,
               formats: Sequence[WireFormat] = FORMATS) -> Starlette:
    """The Starlette app over ``service``.

    Args:
        service: the ``LabelService`` (started by the caller).
        config: limits, keys, CORS, hosts; ``config.label_studio`` adds the Label Studio backend.
        extra_routes: more routes (added after the formats' and the probes).
        formats: the wire formats mounted, in order (``FORMATS``); their declarations give the
            middleware each route's request-id headers and the CORS headers.
        listen_host: the address the server listens on: on loopback, only loopback ``Host``
            names (and ``config.allowed_hosts``) are answered (``allowed_hosts``).
    """
    backend = LabelStudioBackend(service, config.label_studio) if config.label_studio is not None else None
    server = Server(service, config, backend)
    routes: list[BaseRoute] = []
    id_headers: dict[str, tuple[str, ...]] = {}  # path -> the format's own request-id headers, on errors too
    for fmt in formats:
        added = fmt.routes(server)
        if fmt.request_id_headers:
            id_headers.update({r.path: fmt.request_id_headers for r in added})
        routes.extend(added)
    routes.extend(PROBES)
    served = [r.path for r in routes]  # what the 404 names
    routes.extend(extra_routes)
    paths = [r.path for r in routes if hasattr(r, "path")]
    metrics_ = Metrics(service)
    middleware = [Middleware(RequestContext, metrics=metrics_, known_paths=paths, id_headers=id_headers,
                             receive_timeout_s=config.receive_timeout_s)]
    if config.cors_origins:
        exposed = [REQUEST_ID_HEADER, *(h for fmt in formats for h in fmt.request_id_headers), *EXPOSED_HEADERS]
        middleware.append(Middleware(Cors, allow_origins=list(config.cors_origins), allow_methods=["GET", "POST"],
                                     allow_headers=["*"],  # mirrored once Cors has checked them
                                     expose_headers=list(dict.fromkeys(exposed)),
                                     client_headers=frozenset(h for fmt in formats for h in fmt.client_headers),
                                     client_header_prefixes=tuple(p for fmt in formats
                                                                  for p in fmt.client_header_prefixes)))
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
