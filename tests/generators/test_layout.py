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


# ---------------------------------------------------------------- one way down between the rooms

#: the rooms of the package, highest first; a room is a package (or a module), and the rooms of
#: one rank are siblings. A module may import its own room and the rooms of lower ranks only:
#: never a higher rank, never a sibling (two siblings that need each other are one concern, or
#: one holds what belongs lower down).
RANKS: tuple[tuple[str, ...], ...] = (
    ("trainguard.__main__",),  # ``python -m trainguard``: the exporter's command
    ("trainguard.exporter.cli", "trainguard.exporter.terminal"),  # the two commands
    ("trainguard.exporter.http",),
    ("trainguard.exporter.collectors",),  # the list of collectors the exporter builds
    (
        "trainguard.exporter.collectors.runs",
        "trainguard.exporter.collectors.gpu",
        "trainguard.exporter.collectors.checkpoints",
        "trainguard.exporter.collectors.restore",
        "trainguard.exporter.collectors.processes",
    ),
    ("trainguard.exporter.runs",),
    ("trainguard.exporter.scrape",),
    ("trainguard.exporter.config",),
    ("trainguard.exporter",),  # the side's package docstring
    ("trainguard", "trainguard.integrations"),  # what a training script imports
    ("trainguard.run",),
    ("trainguard.checkpoint",),
    ("trainguard.shared",),
    ("trainguard._version",),
)


def _room(module: str) -> tuple[int, str]:
    """The rank and the room of ``module``: the longest room name it is, or is inside of."""
    best: tuple[int, str] | None = None
    for rank, rooms in enumerate(RANKS):
        for room in rooms:
            inside = module == room or module.startswith(room + ".")
            if inside and (best is None or len(room) > len(best[1])):
                best = (rank, room)
    assert best is not None, f"{module} is in no room of RANKS: give it one"
    return best


def _edges_against_the_ranks(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for module, imported in sorted(graph.items()):
        rank, room = _room(module)
        for target in sorted(imported):
            t_rank, t_room = _room(target)
            if t_room == room or t_rank > rank:
                continue
            why = "a sibling" if t_rank == rank else "a higher rank"
            bad.append(f"{module} -> {target} ({why}: {room} -> {t_room})")
    return bad


def test_imports_go_one_way_down() -> None:
    """Entry points > http > the collectors > the run table > the scrape > config > the training
    side > the shared formats: a newcomer finds a concern by its room, and a change to a lower
    room never needs a higher one."""
    graph = _import_graph()
    assert "trainguard.exporter.scrape.collector" in graph["trainguard.exporter.cli"]  # real graph
    assert _edges_against_the_ranks(graph) == []


def test_the_rank_check_finds_an_edge_up_and_one_across() -> None:
    graph = {
        "trainguard.exporter.scrape.context": {"trainguard.exporter.runs.table"},
        "trainguard.exporter.collectors.gpu.collector": {"trainguard.exporter.collectors.runs"},
        "trainguard.exporter.collectors.gpu.metrics": {"trainguard.exporter.scrape.collector"},
    }
    assert _edges_against_the_ranks(graph) == [
        "trainguard.exporter.collectors.gpu.collector -> trainguard.exporter.collectors.runs "
        "(a sibling: trainguard.exporter.collectors.gpu -> trainguard.exporter.collectors.runs)",
        "trainguard.exporter.scrape.context -> trainguard.exporter.runs.table "
        "(a higher rank: trainguard.exporter.scrape -> trainguard.exporter.runs)",
    ]


#: the most modules the exporter side's own folder may hold at its top level
MAX_EXPORTER_TOP_MODULES = 8


def test_the_exporter_side_top_level_is_its_rooms() -> None:
    top = sorted(p.name for p in (PACKAGE / "exporter").glob("*.py"))
    assert len(top) <= MAX_EXPORTER_TOP_MODULES, top


def _name_families(names: list[str]) -> dict[str, list[str]]:
    """Groups of 3+ sibling module names that share a first or last ``_``-word (``gpu_health``,
    ``gpu_health_device``, ``gpu_health_fields``; ``exit_rows``, ``job_rows``, ``stuck_rows``):
    pieces of one concern split to stay short, which belong in a package of their own. A plural
    counts as its singular (``snapshots``, ``snapshot_files``)."""

    def word(w: str) -> str:
        return w[:-1] if w.endswith("s") and len(w) > 3 else w

    groups: dict[str, list[str]] = {}
    for name in names:
        words = name.split("_")
        for key in {f"{word(words[0])}_*", f"*_{word(words[-1])}"}:
            groups.setdefault(key, []).append(name)
    return {k: sorted(v) for k, v in groups.items() if len(v) >= 3}


def test_no_family_of_sibling_modules_named_by_one_prefix_or_suffix() -> None:
    """One folder per concern: three or more modules of one folder named ``thing_a``,
    ``thing_b``, ``thing_c`` are one concern split by size, not by concept."""
    found = {}
    for folder in sorted({p.parent for p in PACKAGE.rglob("*.py")} | {PACKAGE}):
        names = [p.stem for p in folder.glob("*.py") if not p.stem.startswith("__")]
        families = _name_families(names)
        if families:
            found[str(folder.relative_to(PACKAGE.parent))] = families
    assert found == {}


def test_the_family_check_finds_prefixes_suffixes_and_plurals() -> None:
    assert _name_families(["gpu_health", "gpu_health_device", "gpu_health_fields", "xid"]) == {
        "gpu_*": ["gpu_health", "gpu_health_device", "gpu_health_fields"]
    }
    assert _name_families(["exit_rows", "job_rows", "run_rows", "rows"]) == {
        "*_row": ["exit_rows", "job_rows", "rows", "run_rows"]
    }
    assert _name_families(["snapshots", "snapshot_files", "snapshot_requests"]) == {
        "snapshot_*": ["snapshot_files", "snapshot_requests", "snapshots"]
    }
    assert _name_families(["stepdir", "steps", "verdict"]) == {}
