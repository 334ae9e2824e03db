"""The two rooms: a training script that imports trainguard pays for none of the exporter side,
and no module of the training side or of the shared formats names an exporter module, even in
an import that only runs later."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.exporter_proc import child_env
from helpers.paths import REPO

PACKAGE = REPO / "exporter" / "trainguard"
TRAINING_SIDE = ("run", "checkpoint", "shared", "integrations")
#: what the exporter needs and a training script must never load
EXPORTER_ONLY = ("yaml", "prometheus_client", "bcrypt", "pynvml", "rich", "trainguard.exporter")

IMPORTS = """
import json, sys
import trainguard
trainguard.Run
import trainguard.checkpoint
from trainguard.checkpoint import latest, mirror, prune, save
print(json.dumps(sorted(sys.modules)))
"""


def test_training_side_loads_nothing_of_the_exporter() -> None:
    out = subprocess.run(
        [sys.executable, "-c", IMPORTS],
        env=child_env(),
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    loaded = json.loads(out.stdout)
    leaked = [m for m in loaded if any(m == x or m.startswith(x + ".") for x in EXPORTER_ONLY)]
    assert leaked == [], f"a training script would load the exporter side: {leaked}"
    assert "trainguard.run.reporter" in loaded and "trainguard.checkpoint.save" in loaded


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize("side", TRAINING_SIDE)
def test_training_side_sources_never_name_the_exporter(side: str) -> None:
    """Also the imports inside functions, which the import test above cannot see."""
    offenders = {
        str(path.relative_to(PACKAGE)): sorted(
            m
            for m in _imported_modules(path)
            if any(m == x or m.startswith(x + ".") for x in EXPORTER_ONLY)
        )
        for path in sorted((PACKAGE / side).rglob("*.py"))
    }
    assert {k: v for k, v in offenders.items() if v} == {}


# ---------------------------------------------------------------- module size and import cycles

REPO = PACKAGE.parents[1]
#: the 400-line rule: a module longer than this says why in its docstring, with these words
MAX_MODULE_LINES = 400
LONG_MODULE_REASON = "400 lines"
#: the trees whose modules the 400-line rule covers
LINE_LIMIT_TREES = ("exporter/trainguard", "alerts", "grafana")
#: modules of the package being split on another branch (the collectors' rework): drop them
#: from here once it is merged


def _long_modules(tree: str) -> dict[str, int]:
    """The modules of ``tree`` over the limit whose docstring does not say why."""
    out = {}
    for path in sorted((REPO / tree).rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        lines = text.count("\n")
        if lines <= MAX_MODULE_LINES:
            continue
        doc = ast.get_docstring(ast.parse(text, str(path))) or ""
        where = str(path.relative_to(REPO))
        if LONG_MODULE_REASON not in doc:
            out[where] = lines
    return out


@pytest.mark.parametrize("tree", LINE_LIMIT_TREES)
def test_no_module_is_over_400_lines_unless_it_says_why(tree: str) -> None:
    """A module is one concern; one that must be longer says why (its docstring names the
    limit: "... longer than 400 lines because ...")."""
    assert _long_modules(tree) == {}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports, anywhere in it (inside functions too): the
    module named, and for ``from package import name``, the submodule ``name`` where there is
    one. Importing a submodule also runs its package's ``__init__``, which is not counted: a
    package that re-exports its modules is not a cycle."""
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                edges.add(base)
                edges.update(f"{base}.{a.name}" for a in node.names)
        graph[name] = {e for e in edges if e in paths and e != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                found.append(sorted(scc))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_package_has_no_import_cycle() -> None:
    """No two modules import each other, directly or round a loop, even from inside a
    function: a cycle means two modules are one concern, or one holds what the other should."""
    graph = _import_graph()
    assert "trainguard.checkpoint.save" in graph["trainguard.checkpoint"]  # the graph is real
    assert _cycles(graph) == []


def test_the_cycle_check_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
