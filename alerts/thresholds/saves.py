"""Thresholds of the alert on saves that fail (``alerts/rules/saves.py``).

They tune how long a run's saves may fail, or be overdue, while it trains on before it pages.
"""

from __future__ import annotations

from alerts.kinds import DURATION, NUMBER
from alerts.thresholds.threshold import Threshold

THRESHOLDS: tuple[Threshold, ...] = (
    Threshold(
        "saves_failing_for",
        "5m",
        DURATION,
        "CheckpointSavesFailing: how long the last save must stay failed (no success since) "
        "before it pages; a retry that succeeds within it pages nothing.",
    ),
    Threshold(
        "saves_stepping_window",
        "15m",
        DURATION,
        "CheckpointSavesFailing: the run counts as training when its step advanced within this "
        "window (a run that stopped is the death and stall alerts' business).",
    ),
    Threshold(
        "saves_overdue_factor",
        2,
        NUMBER,
        "CheckpointSavesFailing: no save succeeded for this many times the location's usual "
        "interval between successful saves (learned over checkpoint_cadence_window), counted "
        "from the later of the last success and the current process's start.",
    ),
    Threshold(
        "saves_overdue_min",
        "10m",
        DURATION,
        "CheckpointSavesFailing: ...and for at least this long, however often the run saves.",
    ),
)
