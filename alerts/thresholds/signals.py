"""Thresholds of the alerts on runs stopped by a signal (``alerts/rules/signals.py``).

They tune how long a run stopped by its scheduler (a preemption, a time limit, scancel, a pod
deleted) is a warning before, not restarted, it pages as a death.
"""

from __future__ import annotations

from alerts.kinds import DURATION
from alerts.thresholds.threshold import Threshold

THRESHOLDS: tuple[Threshold, ...] = (
    Threshold(
        "terminated_restart_window",
        "30m",
        DURATION,
        "TrainingProcessTerminated (per node) and TrainingJobTerminated (per job): a rank "
        "stopped by a signal (or its time limit) is a warning for this long after its last "
        "heartbeat; not restarted by then, TrainingProcessDied or TrainingJobRankDied "
        "(critical) pages for it.",
    ),
)
