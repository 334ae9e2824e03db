"""Thresholds of the alert on where a stalled job is stuck (``alerts/rules/stuck.py``)."""

from __future__ import annotations

from alerts.kinds import DURATION
from alerts.thresholds.threshold import Threshold

THRESHOLDS: tuple[Threshold, ...] = (
    Threshold(
        "stuck_for",
        "10m",
        DURATION,
        "TrainingRankStuck: how long rank(s) of a job must be stuck apart from the rest (outside "
        "the collective the others wait in) before it fires. Each rank reports where it is "
        "once its step is overdue by its own pace (3x its median interval between steps, at "
        "least 30 s).",
    ),
)
