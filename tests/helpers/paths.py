"""Where things are in this checkout, for every test and helper: one place, so that a test file
can move between tests/'s groups (training/, shared/, exporter/, generators/, harness/) without
any path in it changing."""

from __future__ import annotations

from pathlib import Path

#: the repository root (this file is tests/helpers/paths.py)
REPO = Path(__file__).resolve().parents[2]
#: tests/, on sys.path (pyproject's pythonpath), so ``helpers`` imports from anywhere below it
TESTS = REPO / "tests"
#: the training children and fork server the tests start as scripts
HELPERS = TESTS / "helpers"
#: the committed corpora and configs (heartbeats/, manifests/, configs/)
DATA = TESTS / "data"
