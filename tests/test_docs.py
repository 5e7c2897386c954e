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


#: A test file named in backticks (``tests/<folder>/test_x.py``), alone or with a test of it
#: (``tests/<folder>/test_x.py::test_y``); ``::test_z`` after one names another test of the same file.
TEST_REFERENCE = re.compile(r"`(tests/[\w/]+\.py)?(?:::([A-Za-z_]\w*))?`")


def _test_names(path: Path) -> set[str]:
    """The test functions of a test file, at its top level or in its classes."""
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_every_test_the_docs_name_exists():
    """The rule -> code -> test maps (docs/contributing.md, docs/architecture.md) and every other
    page: each ``tests/...py::name`` they cite is a test function of that file, each test file a file."""
    missing = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1):
            current = None
            for match in TEST_REFERENCE.finditer(line):
                path, name = match.groups()
                if path:
                    current = path
                    if not (ROOT / path).is_file():
                        missing.append(f"{page.name}:{number}: {path} is not a file")
                        continue
                if name and current is None:
                    missing.append(f"{page.name}:{number}: ::{name} follows no test file")
                elif name and (ROOT / current).is_file() and name not in _test_names(ROOT / current):
                    missing.append(f"{page.name}:{number}: {current}::{name} is not a test of that file")
    assert not missing, "\n".join(missing)


def test_the_reference_check_reads_what_the_map_writes():
    line = "| rule | `tests/io/test_io.py::test_a`, `::test_b`, `tests/cli/test_cli.py` `decoding/compile.py` `::1` |"
    assert [m.groups() for m in TEST_REFERENCE.finditer(line) if any(m.groups())] == [
        ("tests/io/test_io.py", "test_a"), (None, "test_b"), ("tests/cli/test_cli.py", None)]


def test_the_serve_benchmarks_page_is_generated_from_the_json():
    """benchmarks/serve_results.md (the measurements docs/serve.md points to) is what
    benchmarks/serve_tables.py writes from the benchmarks' JSON and benchmarks/serve_notes.md;
    regenerate it when this fails."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "serve_tables.py"), "--check"],
                         capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr


def test_the_quality_benchmarks_page_is_generated_from_the_json():
    """benchmarks/quality.md is what benchmarks/quality_tables.py writes from the benchmarks' JSON
    and benchmarks/quality_notes.md; regenerate it when this fails."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "quality_tables.py"), "--check"],
                         capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr
