"""Serving helpers for the server tests in this folder: a server over a fake host on 127.0.0.1 (a
free port), a ``--label-studio`` one with a fake trainer (``label_studio_server``), the check that
nothing it started is left running, raw-socket requests, and running a replayed-fault script
(``cases/``) against a server.

``TokenizingHost`` is ``tests/server/fakes.FakeHost`` whose labelers encode every text they decode
as UTF-8, as a real tokenizer does (so a lone surrogate that reaches a decode call fails the whole
call, as it did with the embedded model), and whose labelers of request-built schemas take
``compile_s`` seconds to build (a large question set compiling on the real model).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from pcd_cli.schema.load import load_schema
from pcd_cli.server.app import AppConfig
from pcd_cli.server.label_studio import LabelStudioConfig
from pcd_cli.server.main import ServerThread
from pcd_cli.job import LabelJob
from pcd_cli.server.service import LabelService, ServiceConfig

from ..helpers import FakeFit, retrained_labeler
from .fakes import FakeHost, FakeLabeler

ROOT = Path(__file__).resolve().parents[2]
CASES = Path(__file__).resolve().parent / "cases"
AIRLINE = load_schema(ROOT / "schemas" / "airline_sentiment.yaml")
SMS = load_schema(ROOT / "schemas" / "sms_spam.yaml")


class TokenizingLabeler(FakeLabeler):
    def label_batch(self, batch):
        for r in batch:
            text = getattr(r, "text", None)
            if isinstance(text, str):
                text.encode("utf-8")  # a real tokenizer fails here on a lone surrogate
        return super().label_batch(batch)


class TokenizingHost(FakeHost):
    """``FakeHost`` with UTF-8 encoding labelers; ``compile_s``: seconds to build the labeler of
    a schema that is not a startup one (``startup`` names the startup schemas)."""

    def __init__(self, *, compile_s: float = 0.0, startup: tuple[str, ...] = ("airline_sentiment", "sms_spam"),
                 **kw):
        super().__init__(**kw)
        self.compile_s = compile_s
        self.startup = startup
        self.compile_started = threading.Event()

    def labeler(self, schema, options):
        if schema.name not in self.startup and self.compile_s:
            self.compile_started.set()
            time.sleep(self.compile_s)
        labeler = super().labeler(schema, options)
        return TokenizingLabeler(labeler.schema, labeler.options, self)


@pytest.fixture
def no_leftovers():
    """No thread (and no child process) started by the test is left once it ends."""
    before = {t.ident for t in threading.enumerate()}
    yield
    check_nothing_left(before)


def check_nothing_left(before: set) -> None:
    deadline = time.monotonic() + 10
    while True:
        left = [t for t in threading.enumerate() if t.ident not in before and t.is_alive()]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not left, f"threads left running: {[t.name for t in left]}"
    assert children() == [], f"child processes left: {children()}"


def children() -> list[int]:
    """Live (not zombie) child processes of this process, from /proc."""
    out = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
        except OSError:
            continue
        if fields.get("PPid", "").strip() == str(os.getpid()) and not fields.get("State", "").startswith("Z"):
            out.append(int(status.parent.name))
    return out


def serve(host=None, *, config: ServiceConfig = ServiceConfig(), app_config: AppConfig = AppConfig(),
          schemas=None, **kw) -> ServerThread:
    """A ``ServerThread`` over ``host`` (default: a ``TokenizingHost``) serving ``triage``
    (airline_sentiment, as the case scripts expect) and ``sms``."""
    host = host or TokenizingHost()
    schemas = schemas or {"triage": (AIRLINE, LabelJob()), "sms": (SMS, LabelJob())}
    return ServerThread(LabelService(host, schemas, config=config), app_config, **kw)


@contextmanager
def label_studio_server(state: Path) -> Iterator[tuple[ServerThread, object, Path]]:
    """A ``--label-studio`` server (``serve``) over a ``TokenizingHost``, its state in ``state``
    (``LabelStudioConfig.state_dir``), the default gold floor; the trainer faked (``FakeFit``:
    holdout accuracy 0.5 before, 0.75 after), a retrained labeler built on the same host
    (``retrained_labeler``), and the project PATCH to Label Studio answered ``"ok"``. Yields
    ``(server, its LabelStudioBackend, state)``; on leaving, waits for a retrain in flight (30 s)
    and checks that no thread or child process it started is left (``check_nothing_left``)."""
    before = {t.ident for t in threading.enumerate()}
    host = TokenizingHost()
    with serve(host, app_config=AppConfig(label_studio=LabelStudioConfig(state_dir=str(state)))) as srv:
        backend = srv.server.config.app.state.label_studio
        backend.fit = FakeFit({"accuracy": 0.5, "nll": 1.0}, {"accuracy": 0.75, "nll": 0.8})
        backend.build = lambda schema, job, own: retrained_labeler(schema, job, host)
        backend.patch_project = lambda *a: "ok"
        yield srv, backend, state
        backend.wait_training(30)
    check_nothing_left(before)

def port_of(srv: ServerThread) -> int:
    return int(srv.url.rsplit(":", 1)[1])


def raw(srv: ServerThread, data: bytes, *, timeout: float = 10.0) -> bytes:
    """Send ``data`` on a fresh connection and read until the server closes it (or ``timeout``)."""
    with socket.create_connection(("127.0.0.1", port_of(srv)), timeout=timeout) as s:
        s.sendall(data)
        out = b""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                chunk = s.recv(65536)
            except (socket.timeout, ConnectionResetError):
                break
            if not chunk:
                break
            out += chunk
        return out


def run_case(name: str, srv: ServerThread, *, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``cases/<name>.py PORT`` against ``srv`` (exit 0 when pcd behaves)."""
    return subprocess.run([sys.executable, str(CASES / f"{name}.py"), str(port_of(srv))], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


def envelope(response) -> dict:
    """The ``error`` object of an httpx response's body, asserting the documented envelope."""
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"type", "code", "message"}, body
    return body["error"]
