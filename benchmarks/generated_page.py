"""The command line of the scripts that write a benchmarks page from its notes and the
benchmarks' JSON (benchmarks/quality_tables.py, benchmarks/serve_tables.py): write the page, or
with ``--check`` only compare it (tests/test_docs.py runs each ``--check``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Sequence


def render_or_check(render: Callable[[], str], output: Path, argv: Sequence[str] | None = None, *,
                    description: str, script: str) -> int:
    """Parse ``argv`` (``None``: the command line); write ``render()``'s text to ``output``
    (UTF-8), or with ``--check`` write nothing and say whether ``output`` holds that text.

    Args:
        render: builds the page's whole text.
        output: the page, ``benchmarks/<name>.md``.
        description: the ``--help`` line (the script's first docstring line).
        script: how to rerun the script, named in the stale message
            (``benchmarks/<script>.py``).

    Returns:
        The exit status: 0 written or up to date; 1 with ``--check`` when ``output`` is missing
        or differs (said on stderr, with the command that regenerates it).
    """
    shown = f"{output.parent.name}/{output.name}"
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--check", action="store_true", help=f"exit 1 when {shown} is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = output.read_text(encoding="utf-8") if output.exists() else ""
        if current != text:
            print(f"{shown} is stale: run python {script}", file=sys.stderr)
            return 1
        return 0
    output.write_text(text, encoding="utf-8")
    print(f"wrote {output}")
    return 0
