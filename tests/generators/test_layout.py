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
    assert "trainguard.run.reporter" in loaded and "trainguard.checkpoint.writer" in loaded


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
