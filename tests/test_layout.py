"""The package layout is the pipeline (docs/architecture.md): no import cycle inside ``pcd_cli``.

Every ``import`` counts, at the top of a module or inside a function: an import moved into a
function to dodge a cycle is still a cycle here.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "pcd_cli"


def _module_name(path: Path, package: Path) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the ``pcd_cli`` modules it imports (relative and absolute, top-level and lazy).

    ``from . import x`` names the submodule ``x`` when one exists, else the package itself.
    """
    modules = {_module_name(p, package): p for p in package.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        here = name.split(".") if is_package else name.split(".")[:-1]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here[:len(here) - (node.level - 1)]
                    target = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    target = node.module or ""
                candidates = [f"{target}.{a.name}" for a in node.names] + [target]
            elif isinstance(node, ast.Import):
                candidates = [a.name for a in node.names]
            else:
                continue
            for cand in candidates:
                if cand in modules:
                    if cand != name:
                        edges.add(cand)
                    break
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as ``[a, b, ..., a]``, or ``None`` (depth-first search, three colours)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 40  # every module was read
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_the_cycle_check_finds_a_cycle_hidden_in_a_function(tmp_path):
    pkg = tmp_path / "pcd_cli"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("from .b import x\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..sub import a\n")
    graph = import_graph(pkg)
    assert graph["pcd_cli.sub.a"] == {"pcd_cli.sub.b"}
    assert graph["pcd_cli.sub.b"] == {"pcd_cli.sub.a"}
    assert find_cycle(graph) == ["pcd_cli.sub.a", "pcd_cli.sub.b", "pcd_cli.sub.a"]


def test_stages_never_import_the_layers_above_them():
    """The data model and readers are leaves below the decoder; nothing below ``api`` imports it,
    the CLI or an engine (the server and engines sit on top)."""
    graph = import_graph()
    top = {"pcd_cli.cli", "pcd_cli.engines.local", "pcd_cli.engines.ray_engine"}
    for name, edges in graph.items():
        stage = name.split(".")[1] if name.count(".") else ""
        if stage in ("results", "errors", "schema", "decoding", "io", "backends"):
            assert not edges & ({"pcd_cli.api"} | top), (name, sorted(edges & ({"pcd_cli.api"} | top)))
        if stage in ("results", "schema"):
            assert not any(e.startswith(("pcd_cli.decoding", "pcd_cli.io", "pcd_cli.engines")) for e in edges), \
                (name, sorted(edges))


def test_engines_import_no_backend():
    """An engine decides where records run, never how: it reaches the model through the
    ``Labeler`` (its fingerprint ``job_parts``, its ``dtype_note``), a function-local import of
    ``pcd_cli.backends`` included."""
    graph = import_graph()
    assert any(name.startswith("pcd_cli.engines.") for name in graph)
    assert sorted((name, edge) for name, edges in graph.items() if name.startswith("pcd_cli.engines")
                  for edge in edges if edge.startswith("pcd_cli.backends")) == []


#: The stages below the job, in pipeline order (docs/architecture.md), and the layers above them.
LOWER_STAGES = ("schema", "io", "decoding", "backends", "quality")
UPPER_LAYERS = ("job", "tune", "api", "fitting", "engines", "server", "cli")


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Every ``(module, imported)`` where a module of a lower stage (``LOWER_STAGES``) imports a
    module of a layer above it (``UPPER_LAYERS``, a package or a top-level module), sorted."""
    def top(name: str) -> str:
        parts = name.split(".")
        return parts[1] if len(parts) > 1 else ""

    return sorted((name, edge) for name, edges in graph.items() if top(name) in LOWER_STAGES
                  for edge in edges if top(edge) in UPPER_LAYERS)


def test_no_stage_imports_a_layer_above_it():
    """schema, io, decoding, backends and quality never import the job, tune, api, fitting,
    engines, server or cli (issue #42 item 5), a function-local import included; no exceptions."""
    assert upward_imports(import_graph()) == []


def test_the_stage_rule_finds_an_upward_import_hidden_in_a_function(tmp_path):
    pkg = tmp_path / "pcd_cli"
    for folder in ("quality", "server"):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "job.py").write_text("")
    (pkg / "quality" / "fit.py").write_text("def f():\n    from ..job import LabelJob\n")
    (pkg / "server" / "app.py").write_text("from ..quality import fit\n")  # downward: allowed
    assert upward_imports(import_graph(pkg)) == [("pcd_cli.quality.fit", "pcd_cli.job")]


def test_pyproject_names_every_package():
    """A package missing from pyproject's list is silently left out of the wheel (checked once by
    building the wheel and importing its 67 modules in a clean venv; this keeps the list whole)."""
    import tomllib

    listed = set(tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.parent.relative_to(PACKAGE.parent).parts) for p in PACKAGE.rglob("__init__.py")}
    assert on_disk and listed == on_disk, (sorted(on_disk - listed), sorted(listed - on_disk))
