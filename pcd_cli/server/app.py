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

from typing import Iterable

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from .config import AppConfig
from .errors import HANDLERS, ApiError, json_response
from .formats import decisions, jev, label_studio, pcd
from .label_studio import LabelStudioBackend
from .middleware import REQUEST_ID_HEADER, Cors, Metrics, RequestContext, RequestGuard, allowed_hosts
from .service import LabelService
from .wire import Server

#: The wire formats, in the order their routes are mounted: one module each (``formats/``), each
#: ``routes(server) -> list[Route]``, and ``REQUEST_ID_HEADER`` when its clients read the request
#: id under another header.
FORMATS = (pcd, jev, decisions, label_studio)


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
