"""Shared by the fuzz harnesses: make this checkout's ``trainguard`` importable when a harness
is run by hand (``python tests/fuzz/fuzz_heartbeat.py ...``)."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SEEDS = {
    "heartbeat": REPO / "tests" / "data" / "heartbeats",
    "manifest": REPO / "tests" / "data" / "manifests",
}
if str(REPO / "exporter") not in sys.path:
    sys.path.insert(0, str(REPO / "exporter"))
