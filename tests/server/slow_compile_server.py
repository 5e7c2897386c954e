"""A ``pcd serve`` process over ``harness.TokenizingHost`` whose request-built schemas take
``argv[1]`` seconds to compile, for the SIGTERM-during-a-compile test (test_deadlines.py):
``python -m tests.server.slow_compile_server COMPILE_S SHUTDOWN_S`` prints its port, then serves."""

from __future__ import annotations

import logging
import sys

from pcd_cli.server.app import AppConfig
from pcd_cli.server.main import serve
from pcd_cli.job import LabelJob
from pcd_cli.server.service import LabelService

from .harness import AIRLINE, TokenizingHost

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    service = LabelService(TokenizingHost(compile_s=float(sys.argv[1])), {"triage": (AIRLINE, LabelJob())})
    sys.exit(serve(service, AppConfig(), port=0, shutdown_timeout_s=float(sys.argv[2]),
                   on_bound=lambda host, port: print(port, flush=True)))
