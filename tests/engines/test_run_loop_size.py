"""The local run loop stays readable (issue 53): no function or method in ``engines/local.py``
is over ``MAX_FUNCTION_LINES`` lines (``def`` to its last line, docstring included), and
``label_file`` is a thin call of ``FileRun``'s steps."""

from __future__ import annotations

import ast
from pathlib import Path

LOCAL = Path(__file__).resolve().parents[2] / "pcd_cli" / "engines" / "local.py"
MAX_FUNCTION_LINES = 60


def function_lengths(source: str) -> dict[str, int]:
    """``qualified name -> lines`` of every function of ``source`` (methods as ``Class.name``,
    nested functions as ``outer.inner``), counted from its ``def`` (decorators excluded) to its
    last line."""
    lengths: dict[str, int] = {}

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    lengths[name] = child.end_lineno - child.lineno + 1
                walk(child, f"{name}.")
            else:
                walk(child, prefix)

    walk(ast.parse(source), "")
    return lengths


def test_no_function_of_the_local_engine_is_over_60_lines():
    lengths = function_lengths(LOCAL.read_text(encoding="utf-8"))
    too_long = {name: n for name, n in lengths.items() if n > MAX_FUNCTION_LINES}
    assert not too_long, f"functions of {LOCAL.name} over {MAX_FUNCTION_LINES} lines: {too_long}; split them"
    # the run's steps are methods of one object, not closures of label_file
    assert {"FileRun.resume", "FileRun.feed", "FileRun.commit", "FileRun.finish"} <= set(lengths)
    assert not [name for name in lengths if name.startswith("label_file.")], "label_file has closures again"


def test_the_length_check_counts_methods_and_nested_functions():
    source = "class A:\n    def m(self):\n        def inner():\n            pass\n" + "        x = 1\n" * 70
    source += "\n\ndef f():\n    return 1\n"
    lengths = function_lengths(source)
    assert lengths == {"A.m": 73, "A.m.inner": 2, "f": 2}
