"""Shared fixtures: the embedded model, a tiny random-init model, and small schemas (what they are
built from lives in tests/helpers.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pcd_cli.schema.load import parse_schema

from .helpers import ORACLE_SCHEMA, own_cache, tiny_backend

#: Every process the tests start in this process (``subprocess.Popen``, which ``subprocess.run``,
#: the S3 and GCS servers and Ray's ``ray.init`` use), for ``stop_started_processes``.
STARTED: list[subprocess.Popen] = []
_popen_init = subprocess.Popen.__init__


def _tracked_init(self, *args, **kwargs):
    _popen_init(self, *args, **kwargs)
    STARTED[:] = [p for p in STARTED if p.returncode is None]  # those seen ended are forgotten
    STARTED.append(self)


subprocess.Popen.__init__ = _tracked_init


def stop_started_processes(grace: float = 5.0) -> list[str]:
    """Stop what the tests started and left running (issue 51, item 7: a Ctrl-C of ``make test``
    skipped the fixtures' teardown of a store being started, and left SeaweedFS and Ray running):
    Ray first (``ray.shutdown``: its raylet, GCS and workers), then each process still alive:
    SIGTERM to its process group when it leads one (the servers start in a session of their own,
    ``start_new_session``), else to it (a ``pcd serve`` drains and stops its own Ray); SIGKILL
    to what is left after ``grace`` seconds. Returns what was stopped, one line each."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
    alive = [p for p in STARTED if p.poll() is None]
    for p in alive:
        try:
            os.killpg(p.pid, signal.SIGTERM) if os.getpgid(p.pid) == p.pid else p.send_signal(signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    end = time.monotonic() + grace
    for p in alive:
        try:
            p.wait(max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL) if os.getpgid(p.pid) == p.pid else p.kill()
            except (ProcessLookupError, PermissionError):
                pass
            p.wait(30)
    return [f"{p.pid} {p.args if isinstance(p.args, str) else ' '.join(map(str, p.args))[:100]}" for p in alive]


#: Set by the first Ctrl-C (SIGINT) of the run: ``_on_ctrl_c``.
CTRL_C: list[float] = []


def _on_ctrl_c(signum, frame):
    """Remember the Ctrl-C, then raise ``KeyboardInterrupt`` as Python's own handler does. A
    Ctrl-C that lands inside an in-process ``pcd`` command (typer's ``CliRunner``) is caught there
    (click turns it into "Aborted!", a failed test) and pytest went on with the next test, the
    services of later tests starting anew: found by interrupting a whole ``make test`` run."""
    CTRL_C.append(time.monotonic())
    signal.default_int_handler(signum, frame)


def pytest_configure(config):
    """Install ``_on_ctrl_c`` where Ctrl-C has Python's default handler (not where the run was
    started with SIGINT ignored, e.g. in the background of a script)."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_ctrl_c)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """After a test during which Ctrl-C was pressed, stop the session as pytest stops on a Ctrl-C
    it sees itself (exit status 2; ``pytest_sessionfinish`` then stops what is still running)."""
    yield
    if CTRL_C:
        item.session.shouldstop = "interrupted by Ctrl-C (caught inside a test)"


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    """After every fixture's teardown (pytest's own ``pytest_sessionfinish`` runs them), also when
    the run was interrupted (Ctrl-C: exit status 2): stop what is still running
    (``stop_started_processes``)."""
    stopped = stop_started_processes()
    if stopped and (exitstatus == pytest.ExitCode.INTERRUPTED or CTRL_C):
        sys.stderr.write("stopped what the interrupted tests had started: " + "; ".join(stopped) + "\n")


@pytest.fixture(scope="session", autouse=True)
def suite_cache(tmp_path_factory):
    """The suite's own home and cache folder, for every test and every process it starts (issue
    #45): nothing the machine measured or kept (``~/.cache/pcd/dtype-speed.json``, a served
    journal) changes a result; only the converted model files are shared (``helpers.own_cache``).
    Yields the cache folder (``XDG_CACHE_HOME``)."""
    with pytest.MonkeyPatch.context() as mp:
        for name, value in own_cache(tmp_path_factory.mktemp("own-cache")).items():
            mp.setenv(name, value)
        yield Path(os.environ["XDG_CACHE_HOME"])


@pytest.fixture(scope="session")
def oracle_schema():
    return parse_schema(ORACLE_SCHEMA)


@pytest.fixture(scope="session")
def embedded_backend():
    from pcd_cli.backends import load_backend

    return load_backend(None, device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def tiny_chat_backend():
    return tiny_backend(chat_template=True)


@pytest.fixture(scope="session")
def tiny_plain_backend():
    return tiny_backend(chat_template=False, seed=1)


@pytest.fixture
def fewer_resamples(monkeypatch):
    """Bootstrap intervals with 100 resamples, for tests that check no interval (``pytestmark =
    pytest.mark.usefixtures("fewer_resamples")``)."""
    from pcd_cli.quality import metrics as M

    full = M.bootstrap_interval
    monkeypatch.setattr(M, "bootstrap_interval", lambda *a, **k: full(*a, **(k | {"resamples": 100})))


@pytest.fixture(scope="module")
def s3_store(tmp_path_factory):
    """A real S3 store (SeaweedFS, ``tests/s3_server.py``), one per test module that uses it, on
    127.0.0.1 with free ports; stopped after the module (a session-long server was still a child
    of pytest when the server tests check that nothing they started is left), and checked that
    nothing of it is left running.
    Tests set ``s3_store.env`` (the standard AWS variables) to reach it."""
    from . import s3_server

    store = s3_server.start(tmp_path_factory.mktemp("seaweedfs"))
    try:
        yield store
    finally:
        s3_server.stop(store)
        assert store.process.poll() is not None
        assert not s3_server.still_listening(store.ports), "SeaweedFS left a port open"
        assert not s3_server.leftover_sockets(store.ports), "SeaweedFS left a socket in /tmp"
