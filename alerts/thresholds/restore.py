"""Thresholds of the restore drill alerts (``alerts/rules/restore.py``).

They say how long a complete checkpoint may go without a restore drill loading it.
"""

from __future__ import annotations

from alerts.kinds import DURATION
from alerts.thresholds.threshold import Threshold

THRESHOLDS: tuple[Threshold, ...] = (
    Threshold(
        "restore_verified_within",
        "24h",
        DURATION,
        "CheckpointRestoreUnverified: the newest complete checkpoint of this long ago (or a newer "
        "one) must have been loaded by a restore drill (trainguard verify --restore) by now. "
        "Schedule the drill well within it (the deploy/ examples run it every 6h).",
    ),
)
