"""``pcd serve --engine ray``: the same app on Ray Serve, ``--replicas N`` of it behind Ray's router.

Each replica is a Ray Serve deployment replica (an actor, its own process) that builds its own
``LabelService`` and ``create_app`` app from one ``ReplicaSpec`` (the options ``pcd serve`` was
given): it loads the model itself, compiles the startup schemas, warms up, and packs the
requests routed to it, exactly as a one-machine ``pcd serve`` does. Serve's HTTP proxy binds
``--host``/``--port`` (before any replica loads its model) and spreads requests over the
replicas; every route of the one-machine server answers the same through it (``/metrics`` and
``/ready`` are those of the replica the request lands on).

This is the only module that imports Ray Serve. What differs from one machine:

- a replica's constructor returns once its model, schemas and warm-up decode are ready, so
  Serve routes nothing to a replica still loading (``/ready`` through the proxy is 200 as
  soon as one replica is up; ``serve_on_ray`` reports ready when all of them are);
- each replica takes up to ``ServiceConfig.max_queued_requests`` requests at once
  (``max_ongoing_requests``), so its own queue, not Serve's, decides 429;
- SIGTERM or SIGINT on the ``pcd serve`` process: Serve stops routing, lets each replica finish
  its requests (``graceful_shutdown_timeout_s`` = ``--shutdown-timeout-s``), the replicas close
  their services, and a Ray started by ``pcd serve`` is shut down with every process it started.

Ray itself: ``RAY_ADDRESS`` (or ``address``) joins a running cluster; otherwise a local Ray is
started for the server and stopped with it (``pcd_cli.engines.ray_engine.connect`` /
``stop_local_ray``).
"""

from __future__ import annotations

import inspect
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field

from ..errors import EngineError, MissingExtra
from ..schema.model import Schema
from .app import create_app
from .config import AppConfig
from .main import bound_socket, cannot_listen
from ..job import LabelJob
from .service import LabelService, ModelHost, ServiceConfig

log = logging.getLogger("pcd.server")

INSTALL_HINT = "pip install 'pcd-cli[ray]'"
#: Name of the Serve application and of its deployment.
APP_NAME = "pcd"
DEPLOYMENT_NAME = "pcd-serve"


def require_serve():
    """Import Ray Serve, or say how to install it.

    Raises:
        MissingExtra: Ray or Ray Serve is not installed (message: ``pip install 'pcd-cli[ray]'``).
    """
    try:
        import ray  # noqa: F401
        from ray import serve
    except ImportError as exc:
        raise MissingExtra(f"pcd serve --engine ray needs Ray Serve, which is not installed ({exc}); install it "
                           f"with: {INSTALL_HINT}") from None
    return serve


@dataclass(frozen=True)
class ReplicaSpec:
    """What every replica builds its service and app from (pickled to each replica).

    Attributes:
        schemas: the startup schemas, name -> (schema, options) (``LabelService``'s ``schemas``).
        job: the served ``LabelJob``: the model each replica loads (``ModelHost``).
        service: limits and packing of each replica's ``LabelService``.
        default_options: options of request-built schemas (Jev / OpenAI question sets).
        app: keys, body and request limits, CORS (``AppConfig``).
        ready_timeout_s: seconds a replica may take to load, compile and warm up before its
            constructor fails (Serve then starts another, up to its retry count).
        listen_host: the address Serve's proxy listens on (``--host``): on loopback, a request
            whose ``Host`` is not a loopback name (or ``--allowed-host``) is refused, as
            ``pcd serve`` without Ray refuses it (``app.allowed_hosts``).
    """

    schemas: dict[str, tuple[Schema, LabelJob]] = field(default_factory=dict)
    job: LabelJob = LabelJob()
    service: ServiceConfig = ServiceConfig()
    default_options: LabelJob = LabelJob()
    app: AppConfig = AppConfig()
    ready_timeout_s: float = 900.0
    listen_host: str | None = None


def build_replica(spec: ReplicaSpec):
    """One replica's service and app: a ``LabelService`` over a ``ModelHost`` of ``spec``, started
    (its worker loads the model), and ``create_app`` over it. Waits until the service is ready.

    Returns:
        The Starlette app (``app.state.service`` is the service).

    Raises:
        PcdError: the model, a schema or a calibration could not be loaded (the service's
            ``startup_error``). TimeoutError: not ready within ``spec.ready_timeout_s``.
    """
    host = ModelHost(spec.job)
    service = LabelService(host, dict(spec.schemas), config=spec.service, default_options=spec.default_options)
    app = create_app(service, spec.app, listen_host=spec.listen_host)
    service.start()
    end = time.monotonic() + spec.ready_timeout_s
    while not service.ready.wait(0.1):
        if service.startup_error is not None:
            service.close(timeout=5)
            raise service.startup_error
        if time.monotonic() > end:
            service.close(timeout=5)
            raise TimeoutError(f"the replica was not ready within {spec.ready_timeout_s:.0f} s")
    log.info("replica ready (pid %d, model %s)", os.getpid(), service.model_id)
    return app


class ServeReplicaApp:
    """The app as a replica serves it: Serve's proxy already gives every request an
    ``x-request-id`` (the client's own, or a new one) and writes it on the response, and the app
    takes that same id, so the app's copy of the response header is dropped (one header, one
    value). ``state`` is the app's (``state.service``)."""

    def __init__(self, app):
        self.app = app
        self.state = app.state

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_once(message):
            if message["type"] == "http.response.start":
                message["headers"] = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"x-request-id"]
            await send(message)

        await self.app(scope, receive, send_once)


def deployment(spec: ReplicaSpec, *, replicas: int, num_cpus: float = 1.0, num_gpus: float = 0.0,
               shutdown_timeout_s: float = 30.0):
    """The Serve application: ``replicas`` replicas of the pcd app, each built by ``build_replica``.

    Args:
        replicas: number of replicas (each loads the model once).
        num_cpus, num_gpus: Ray resources each replica reserves (a replica that asks for no GPU
            sees none: Ray hides them).
        shutdown_timeout_s: how long a stopping replica may take to finish its requests.

    Returns:
        A bound Serve application for ``serve.run``.
    """
    serve = require_serve()

    def build_app():  # called in each replica, after its constructor
        return ServeReplicaApp(build_replica(spec))

    class PcdReplica:
        """One replica of ``pcd serve``: its own LabelService (and model) behind the same routes."""

        def check_health(self) -> None:
            service = self._asgi_app.state.service
            if service.startup_error is not None:
                raise RuntimeError(f"the replica's service failed: {service.startup_error}")
            if service._thread is not None and not service._thread.is_alive() and not service.draining:
                raise RuntimeError("the replica's worker thread died")

        def __del__(self) -> None:
            app = getattr(self, "_asgi_app", None)
            if app is not None:
                service = app.state.service
                service.drain()
                service.close(timeout=shutdown_timeout_s)

    options = dict(name=DEPLOYMENT_NAME, num_replicas=replicas,
                   ray_actor_options={"num_cpus": num_cpus, "num_gpus": num_gpus},
                   # the replica's own queue decides 429 (with Retry-After); Serve only routes
                   max_ongoing_requests=spec.service.max_queued_requests + 16,
                   graceful_shutdown_timeout_s=shutdown_timeout_s, graceful_shutdown_wait_loop_s=0.5,
                   health_check_period_s=5.0)
    if "max_constructor_retry_count" in inspect.signature(serve.deployment).parameters:
        options["max_constructor_retry_count"] = 1  # a model that cannot load will not load on a retry
    ingress = serve.ingress(build_app)(PcdReplica)
    return serve.deployment(ingress, **options).bind()


def replica_resources(ray, replicas: int, device: str, started_here: bool) -> tuple[float, float]:
    """(CPUs, GPUs) each replica reserves.

    One CPU each; on a local Ray with fewer CPUs than replicas, the CPUs shared evenly (so
    ``--replicas 4`` still starts on a 2-core laptop). A GPU share when the device may be CUDA
    (``auto`` or ``cuda``) and the cluster has GPUs: one each, or the GPUs shared evenly when there
    are fewer than replicas.
    """
    resources = ray.cluster_resources()
    cpus = 1.0
    if started_here:
        cpus = min(1.0, float(resources.get("CPU", 1.0)) / replicas)
    gpus = 0.0
    if device in ("auto", "cuda") and resources.get("GPU", 0) > 0:
        gpus = min(1.0, float(resources["GPU"]) / replicas)
    return cpus, gpus


def serve_on_ray(spec: ReplicaSpec, *, host: str = "127.0.0.1", port: int = 8000, replicas: int = 1,
                 shutdown_timeout_s: float = 30.0, address: str | None = None, on_ready=None,
                 stop: threading.Event | None = None) -> int:
    """Run ``pcd serve`` on Ray Serve until SIGTERM/SIGINT (or ``stop``); returns the exit code.

    Starts (or joins: ``address`` / ``RAY_ADDRESS``) Ray, starts Serve's HTTP proxy on
    ``host:port``, deploys ``replicas`` replicas and waits for them all to be ready, then calls
    ``on_ready(host, port)``. On the first SIGTERM or SIGINT: the Serve application is deleted
    (replicas finish their requests, at most ``shutdown_timeout_s``), Serve is shut down, and a
    Ray started here is stopped with every process it started.

    Returns:
        0 after a drain; 3 when a replica could not start (the model, a schema or the
        cluster; the reason is logged).

    Raises:
        MissingExtra: Ray Serve is not installed. EngineError: the cluster cannot be reached, or
        Serve's proxy failed to start. InputError: ``host:port`` cannot be bound (checked before a
        local Ray starts, and named again if the proxy's own bind fails), as for ``--engine local``.
    """
    if replicas < 1:
        raise EngineError(f"--replicas must be at least 1, not {replicas}")
    serve = require_serve()
    from ..engines.ray_engine import connect, stop_local_ray

    import ray

    address = address or os.environ.get("RAY_ADDRESS") or None
    if address is None:  # the proxy will listen on this machine: a taken port fails before Ray starts
        try:
            bound_socket(host, port, reuse_address=False).close()
        except OSError as exc:
            raise cannot_listen(host, port, exc.strerror or str(exc)) from None
    stop = stop or threading.Event()
    previous = {}
    started_here = False
    code = 0
    try:
        started_here, seconds = connect(address)
        log.info("Ray %s in %.1f s", "started" if started_here else "joined", seconds)
        if threading.current_thread() is threading.main_thread():
            # after ray.init, which installs its own SIGTERM handler (it aborts the process)
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, lambda *_: stop.set())
        num_cpus, num_gpus = replica_resources(ray, replicas, spec.job.device, started_here)
        start_proxy(serve, host, port)
        log.info("Ray Serve proxy on http://%s:%d; starting %d replica(s)", host, port, replicas)
        app = deployment(spec, replicas=replicas, num_cpus=num_cpus, num_gpus=num_gpus,
                         shutdown_timeout_s=shutdown_timeout_s)
        try:
            serve.run(app, name=APP_NAME, route_prefix="/", blocking=False)
        except Exception as exc:  # noqa: BLE001 - Serve wraps the replica's error in its own
            log.error("the replicas could not start: %s", _first_line(_deployment_message(serve) or str(exc)))
            code = 3
        if code == 0:
            log.info("%d replica(s) ready on http://%s:%d", replicas, host, port)
            if on_ready is not None:
                on_ready(host, port)
            while not stop.wait(0.5):
                pass
            log.info("draining: stopping the replicas (at most %.0f s)", shutdown_timeout_s)
            serve.delete(APP_NAME, _blocking=True)
    finally:
        try:
            if ray.is_initialized():
                serve.shutdown()
        finally:
            if started_here:
                stop_local_ray(ray)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    log.info("stopped")
    return code


def start_proxy(serve, host: str, port: int) -> None:
    """``serve.start`` with Serve's HTTP proxy on ``host:port``.

    Raises:
        InputError: the proxy cannot bind the address (taken since pcd checked it, e.g. by another
            process, or on the cluster's head node), as ``pcd serve`` says for its own server (exit 2).
        EngineError: the proxy failed to start for another reason (its message).
    """
    try:
        serve.start(http_options={"host": host, "port": port})
    except Exception as exc:  # noqa: BLE001 - Ray wraps the proxy actor's error in a RayTaskError
        cause = getattr(exc, "cause", None) or exc
        text = str(cause).strip()
        message = text.splitlines()[-1] if text else type(cause).__name__
        if "Failed to bind" in text:
            raise cannot_listen(host, port, "Ray Serve's proxy: " + message) from None
        raise EngineError(f"Ray Serve's HTTP proxy did not start on {host}:{port}: {message}") from exc


def _deployment_message(serve) -> str | None:
    """Serve's status message of the pcd deployment (a failed replica's traceback), if any."""
    try:
        app = serve.status().applications.get(APP_NAME)
        deployment = app.deployments.get(DEPLOYMENT_NAME) if app is not None else None
        return deployment.message if deployment is not None and deployment.message else None
    except Exception:  # noqa: BLE001 - only a better message is lost
        return None


def _first_line(text: str) -> str:
    """The line naming the pcd error in a replica's traceback (``pcd_cli.errors.ModelError: ...``),
    else the last line."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("pcd_cli.") and "Error" in line.split(":", 1)[0]:
            return line
    return lines[-1] if lines else "unknown reason"
