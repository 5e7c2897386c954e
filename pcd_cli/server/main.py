"""Running the server: bind the port, start the worker (it loads the model), serve, drain on SIGTERM.

``serve`` is what ``pcd serve`` calls; ``ServerThread`` runs the same server in a thread of the
calling process (tests, benchmarks).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import threading
import time

from .app import create_app
from .config import AppConfig
from .service import LabelService

log = logging.getLogger("pcd.server")

#: Seconds uvicorn waits, once drained, for the last responses to be written.
RESPONSE_GRACE_S = 5.0


def _uvicorn():
    try:
        import uvicorn
    except ImportError as exc:
        from ..errors import MissingExtra

        raise MissingExtra("pcd serve needs the server extra: pip install 'pcd-cli[serve]'") from exc
    return uvicorn


def _envelope_bytes(status: int, reason: str, code: str, message: str, extra: str = "") -> bytes:
    """A whole HTTP/1.1 response with the error envelope and ``Connection: close``, written by the
    protocol itself (before any request reached the app)."""
    from .errors import ApiError

    body = json.dumps(ApiError(status, "invalid_request_error" if status < 500 else "server_error", code,
                               message).body()).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"connection: close\r\n{extra}\r\n").encode() + body


def guarded_protocol(*, header_timeout_s: float, max_connections: int):
    """uvicorn's h11 protocol with the bounds uvicorn lacks (uvicorn's ``timeout_keep_alive`` only
    runs between requests and is reset by every byte, so a client trickling a header a byte at a
    time holds its connection for ever: Slowloris, CVE-2007-6750):

    * a request's header block must be complete within ``header_timeout_s`` of its first byte
      (or of the connection's opening): else 408 ``request_timeout`` and the connection closes;
    * a header block over h11's ``max_incomplete_event_size`` (``AppConfig.max_header_bytes``)
      is 431 ``headers_too_large`` (RFC 6585 §5), any other malformed request 400
      ``invalid_http``, both in the error envelope (uvicorn sends plain text);
    * over ``max_connections`` open connections, a new one is answered 503
      ``too_many_connections`` (``Retry-After: 1``) and closed.

    h11 (not httptools) is used because it bounds the header block's size.
    """
    from uvicorn.protocols.http.h11_impl import H11Protocol, h11

    class GuardedH11Protocol(H11Protocol):
        _header_timer = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                log.warning("%d connections open (--max-connections %d): a new one refused", len(self.connections),
                            max_connections)
                transport.write(_envelope_bytes(503, "Service Unavailable", "too_many_connections",
                                                f"the server holds {max_connections} connections (--max-connections); "
                                                "retry in a moment", "retry-after: 1\r\n"))
                transport.close()
                return
            self._arm()

        def _arm(self) -> None:
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(header_timeout_s, self._headers_late)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def data_received(self, data: bytes) -> None:
            waiting = self.conn.their_state is h11.IDLE
            if waiting:
                self._arm()  # counts from the first byte of a request's headers
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()  # keep-alive: uvicorn's own timer bounds the idle wait

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _headers_late(self) -> None:
            self._header_timer = None
            if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
                return
            if self.cycle is not None and not self.cycle.response_complete:
                return  # a response is still being written on this connection
            if not self.conn.trailing_data[0]:
                self.transport.close()  # nothing sent: an idle connection, closed quietly
                return
            log.info("a request's headers did not arrive within %.0f s; connection closed (408)", header_timeout_s)
            self.transport.write(_envelope_bytes(408, "Request Timeout", "request_timeout",
                                                 f"the request's headers did not arrive within {header_timeout_s:g} s "
                                                 "(--read-timeout-s)"))
            self.transport.close()

        def send_400_response(self, msg: str) -> None:
            buffered = len(self.conn.trailing_data[0])
            limit = self.conn._max_incomplete_event_size  # noqa: SLF001 - h11 names no public accessor
            if buffered > limit:
                data = _envelope_bytes(431, "Request Header Fields Too Large", "headers_too_large",
                                       f"the request line and headers are over {limit} bytes (--max-header-bytes)")
            else:
                data = _envelope_bytes(400, "Bad Request", "invalid_http", "the request is not valid HTTP/1.1")
            self._disarm()
            self.transport.write(data)
            self.transport.close()

    return GuardedH11Protocol


def make_server(service: LabelService, app_config: AppConfig, *, host: str, port: int,
                shutdown_timeout_s: float = 30.0, extra_routes=()):
    """A drain-aware uvicorn server over ``create_app(service, app_config)``, and its socket,
    already bound (``host``, ``port``; port 0 picks a free one).

    The HTTP protocol is ``guarded_protocol``'s (header deadline, header size, connection
    count; ``app_config``'s ``receive_timeout_s``, ``max_header_bytes``, ``max_connections``);
    ``X-Forwarded-*`` headers are not trusted (``proxy_headers=False``).

    The first SIGTERM or SIGINT (``handle_exit``) drains: ``/ready`` and new work answer 503,
    queued and running requests finish (at most ``shutdown_timeout_s``), then the server stops;
    past ``shutdown_timeout_s`` the still-queued requests are answered 503 at once (``shed``) and
    only the decode call running then is waited for. A second signal stops it at once.

    Raises:
        OSError: the address cannot be bound (in use, not local).
    """
    uvicorn = _uvicorn()

    class DrainingServer(uvicorn.Server):
        drain_since: float | None = None

        def handle_exit(self, sig, frame) -> None:  # signal handler: only flags (no lock taken)
            if self.drain_since is not None:
                self.should_exit = self.force_exit = True
                return
            self.drain_since = time.monotonic()
            service.draining = True

        async def on_tick(self, counter: int) -> bool:
            if self.drain_since is not None and not self.should_exit:
                waited = time.monotonic() - self.drain_since
                if service.idle:
                    log.info("drained in %.1f s; stopping", waited)
                    self.should_exit = True
                elif waited >= shutdown_timeout_s:  # answer the queued 503 now, while responses can go out
                    log.warning("not drained after %.1f s: %d queued requests answered 503; stopping after the "
                                "decode call running now", waited, service.shed())
                    self.should_exit = True
            if service.startup_error is not None:
                self.should_exit = True
            return await super().on_tick(counter)

    app = create_app(service, app_config, extra_routes=extra_routes, listen_host=host)
    http = guarded_protocol(header_timeout_s=app_config.receive_timeout_s, max_connections=app_config.max_connections)
    config = uvicorn.Config(app, host=host, port=port, log_config=None, access_log=False, lifespan="off",
                            timeout_graceful_shutdown=RESPONSE_GRACE_S, server_header=False, http=http,
                            h11_max_incomplete_event_size=app_config.max_header_bytes, proxy_headers=False)
    sock = bound_socket(host, port, reuse_address=True)
    sock.listen(2048)
    sock.set_inheritable(True)
    return DrainingServer(config), sock


def bound_socket(host: str, port: int, *, reuse_address: bool) -> socket.socket:
    """A TCP socket bound to ``host:port`` (IPv6 when ``host`` has a colon), not yet listening.

    ``reuse_address`` sets ``SO_REUSEADDR`` (pcd's own server, which may restart on a port left in
    TIME_WAIT); without it the bind fails as Ray Serve's proxy's would (it does not set it).

    Raises:
        OSError: the address cannot be bound (in use, not this machine's, a privileged port).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if reuse_address:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def cannot_listen(host: str, port: int, reason: str):
    """The one error of ``pcd serve`` for an address it cannot listen on, whichever the engine
    (an ``InputError``: exit 2)."""
    from ..errors import InputError

    return InputError(f"--host {host} --port {port}: cannot listen there ({reason})")


def serve(service: LabelService, app_config: AppConfig, *, host: str = "127.0.0.1", port: int = 8000,
          shutdown_timeout_s: float = 30.0, on_bound=None) -> int:
    """Run the server in this thread until it is drained (SIGTERM/SIGINT); returns the exit code.

    The port is bound before the model loads (the worker loads it while ``/health`` answers);
    ``on_bound(host, port)`` is called once bound.

    A thread of the service still running once it is closed (a compile, which cannot be
    interrupted) is abandoned: the process exits at once with the code below (``os._exit``, after
    the log is flushed), as the interpreter's own exit would abort inside the native code it runs.

    Returns:
        0 after a drain; when the start failed, ``startup_exit_code`` (2 a schema or calibration
        problem, 3 the model or a compile problem), as ``pcd label`` would exit.
    """
    server, sock = make_server(service, app_config, host=host, port=port, shutdown_timeout_s=shutdown_timeout_s)
    bound = sock.getsockname()
    log.info("listening on http://%s:%d (loading the model)", host, bound[1])
    if on_bound is not None:
        on_bound(host, bound[1])
    service.start()
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        # the decode call running now (one chunk) ends; the drain has used most of the budget already
        spent = time.monotonic() - server.drain_since if server.drain_since is not None else 0.0
        service.close(timeout=max(RESPONSE_GRACE_S, shutdown_timeout_s - spent))
    if service.startup_error is not None:
        error = service.startup_error
        log.error("could not start: %s", error)
        code = startup_exit_code(error)
    else:
        log.info("stopped")
        code = 0
    left = service.threads_alive
    if left:  # a compile cannot be interrupted; leaving it to the interpreter's exit aborts (C++ terminate)
        log.warning("%s still running after the drain (a compile cannot be interrupted): abandoned; exiting %d",
                    ", ".join(left), code)
        logging.shutdown()
        os._exit(code)
    return code


def startup_exit_code(error: BaseException) -> int:
    """The exit code of a server whose start failed with ``error``, from the CLI's own mapping
    (``pcd_cli.errors.EXIT_CODES``, as ``pcd label`` would exit: a schema or calibration problem
    2, the model or a compile problem 3); an error pcd did not raise on purpose while loading the
    model counts as the model's (``ModelError``: 3)."""
    from ..errors import EXIT_CODES, ModelError, PcdError, exit_code

    return exit_code(error) if isinstance(error, PcdError) else EXIT_CODES[ModelError]


class ServerThread:
    """The server on 127.0.0.1 (a free port) in a thread of this process, for tests and benchmarks.

        with ServerThread(service, AppConfig()) as srv:
            httpx.get(srv.url + "/ready")

    ``drain()`` does what SIGTERM does; leaving the block drains and joins every thread started.
    """

    def __init__(self, service: LabelService, app_config: AppConfig = AppConfig(), *, shutdown_timeout_s: float = 10.0,
                 extra_routes=(), wait_ready: bool = True):
        self.service = service
        self.server, self.sock = make_server(service, app_config, host="127.0.0.1", port=0,
                                             shutdown_timeout_s=shutdown_timeout_s, extra_routes=extra_routes)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.wait_ready = wait_ready
        self.shutdown_timeout_s = shutdown_timeout_s
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, name="pcd-http",
                                       daemon=True)

    def __enter__(self) -> "ServerThread":
        self.service.start()
        self.thread.start()
        if self.wait_ready:
            self.service.ready.wait(60)
            while not self.server.started:
                time.sleep(0.01)
        return self

    def drain(self) -> None:
        """As SIGTERM: refuse new work, finish the queued, stop."""
        self.server.handle_exit(signal.SIGTERM, None)

    def __exit__(self, *exc) -> None:
        if self.server.drain_since is None:
            self.drain()
        self.thread.join(self.shutdown_timeout_s + RESPONSE_GRACE_S + 5)
        self.sock.close()
        self.service.close()
