"""Docs that cannot go stale: every ``pcd ...`` command line in the README parses against the
real CLI (every option exists, every value is accepted by its type)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer.main

from pcd_cli.cli import app

ROOT = Path(__file__).resolve().parents[1]
#: Pages whose command lines are checked (docs/cli.md is generated usage, checked by the next test).
DOCS = [ROOT / "README.md", *(p for p in sorted((ROOT / "docs").glob("*.md")) if p.name != "cli.md")]


def command_lines(path: Path) -> list[tuple[int, str]]:
    """``(line number, command)`` for every ``pcd`` command in the file's code blocks and inline
    code spans, backslash continuations joined, comments and shell redirections dropped."""
    text = path.read_text(encoding="utf-8")
    found: list[tuple[int, str]] = []
    in_block, pending, start = False, "", 0
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip().startswith("```"):
            in_block, pending = not in_block, ""
            continue
        if in_block:
            stripped = line.strip()
            if pending:
                pending += " " + stripped
            elif re.match(r"^(\$ )?(\.venv/bin/)?pcd ", stripped):
                pending, start = re.sub(r"^(\$ )?(\.venv/bin/)?", "", stripped), number
            if pending and not pending.endswith("\\"):
                found.append((start, pending))
                pending = ""
            elif pending:
                pending = pending[:-1]
    return found


def _parse(command: str) -> None:
    words = shlex.split(command, comments=True)
    for stop in ("|", ">", "2>", "&&"):
        if stop in words:
            words = words[: words.index(stop)]
    group = typer.main.get_command(app)
    ctx = group.make_context("pcd", words[1:], resilient_parsing=False)
    args = [*getattr(ctx, "_protected_args", getattr(ctx, "protected_args", [])), *ctx.args]
    name, sub, rest = group.resolve_command(ctx, args)
    sub.make_context(name, rest, parent=ctx)


CASES = [(f"{p.name}:{n}", cmd) for p in DOCS for n, cmd in command_lines(p)]


def test_the_readme_has_commands_to_check():
    assert len(CASES) >= 10


@pytest.mark.parametrize("where, command", CASES, ids=[w for w, _ in CASES])
def test_documented_command_parses(where, command):
    _parse(command)


def test_cli_reference_is_generated_from_the_code(tmp_path):
    """docs/cli.md is what ``make docs`` writes from the Typer app; regenerate it when this fails."""
    import subprocess
    import sys

    fresh = tmp_path / "cli.md"
    subprocess.run([sys.executable, "-m", "typer", "pcd_cli.cli", "utils", "docs", "--name", "pcd", "--output",
                    str(fresh)], check=True, cwd=ROOT, capture_output=True, env={"COLUMNS": "100", "PATH": ""})
    assert (ROOT / "docs" / "cli.md").read_text(encoding="utf-8") == fresh.read_text(encoding="utf-8"), \
        "docs/cli.md is stale: run make docs"
