"""The eros package imports in one direction: its import graph, read from the source (every import, at module
level or inside a function, where a cycle hides from the linter), has no cycle; nor has it with the local stack
(``eros_dev``), which imports eros and is never imported by it (``tests/test_packaging.py`` checks that side).
Dreaming had one (the sweep imported the deep pass inside a function, the deep pass imported the sweep's module)
until it became a package of peers over one job lifecycle (``eros.dreaming``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from helpers import ROOT

pytestmark = pytest.mark.unit

PACKAGE = ROOT / "layers" / "eros" / "eros"
DEV_STACK = ROOT / "devstack" / "eros_dev"


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _typing_only(tree: ast.AST) -> set[ast.AST]:
    """The nodes under ``if TYPE_CHECKING:``: imports that never run (annotations only)."""
    return {inner for node in ast.walk(tree)
            if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
            for stmt in node.body for inner in ast.walk(stmt)}


def imports(path: Path, modules: set[str], root: Path = PACKAGE, typing_only: bool = False) -> set[str]:
    """The eros modules ``path`` imports anywhere in it, at module level or in a function (with ``typing_only``:
    those imported only for annotations instead). ``from . import x`` is module ``x`` when x is one, else the
    package it is taken from."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text())
    skipped = _typing_only(tree)
    for node in ast.walk(tree):
        if (node in skipped) != typing_only:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {m for m in found if m in modules and m != name}


def graph(typing_only: bool = False) -> dict[str, set[str]]:
    """Every module of eros and eros_dev, with the modules of either it imports."""
    paths = [(p, root) for root in (PACKAGE, DEV_STACK) for p in sorted(root.rglob("*.py"))]
    modules = {module_name(p, root) for p, root in paths}
    return {module_name(p, root): imports(p, modules, root, typing_only=typing_only) for p, root in paths}


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph (its modules in order, the first repeated at the end), or None."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_cycle_finder_finds_a_cycle_hidden_in_a_function(tmp_path):
    # The shape dreaming had: a module-level import one way, a function-level import back.
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "a.py").write_text("from . import b\n")
    (root / "b.py").write_text("def f():\n    from . import a\n")
    modules = {"pkg", "pkg.a", "pkg.b"}
    edges = {module_name(p, root): imports(p, modules, root) for p in sorted(root.glob("*.py"))}
    assert edges == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}}
    assert cycle(edges) == ["pkg.a", "pkg.b", "pkg.a"]


def test_the_eros_package_and_the_local_stack_have_no_import_cycle():
    edges = graph()
    assert len(edges) > 40 and edges["eros.dreaming.tick"] >= {"eros.dreaming.jobs", "eros.dreaming.session",
                                                               "eros.dreaming.deep_pass", "eros.store.claims"}
    assert edges["eros_dev.server"] >= {"eros_dev.tokens", "eros_dev.dreaming", "eros_dev.lambda_runtime",
                                        "eros.json_body", "eros.config"}
    assert cycle(edges) is None, cycle(edges)


def test_the_typing_only_imports_are_known():
    # Imports under TYPE_CHECKING never run, so they are no edge above. store.rows names store.usage's Admitted in
    # a TypedDict field (store.usage imports store.rows: the one back-reference, for annotations only); providers
    # names the offline models it imports where chosen. A new one is seen here.
    assert {m: found for m, found in graph(typing_only=True).items() if found} == {
        "eros.store.rows": {"eros.store.usage"}, "eros.providers": {"eros.providers.offline"}}


def test_the_job_kinds_are_peers_over_the_lifecycle():
    edges = graph()
    assert "eros.dreaming.tick" not in edges["eros.dreaming.jobs"] | edges["eros.dreaming.session"] \
        | edges["eros.dreaming.deep_pass"]  # the tick uses the kinds, never the other way
    assert "eros.dreaming.session" not in edges["eros.dreaming.deep_pass"]
    assert "eros.dreaming.deep_pass" not in edges["eros.dreaming.session"]
    assert edges["eros.dreaming.jobs"].isdisjoint({"eros.dreaming.session", "eros.dreaming.deep_pass"})
