"""Thresholds of the alerts on recorded deaths (``alerts/rules/deaths.py``).

They tune the alerts on a restart after a death, and on deaths near the same step.
"""

from __future__ import annotations

from alerts.kinds import DURATION, NUMBER
from alerts.thresholds.threshold import Threshold

THRESHOLDS: tuple[Threshold, ...] = (
    Threshold(
        "restart_window",
        "1h",
        DURATION,
        "TrainingProcessRestarted: a restarted run recorded a death whose last heartbeat is less "
        "than this old (one alert per death, firing this long).",
    ),
    Threshold(
        "repeated_death_window",
        "24h",
        DURATION,
        "RepeatedDeathNearSameStep: a death recorded within this window...",
    ),
    Threshold(
        "repeated_death_steps",
        500,
        NUMBER,
        "RepeatedDeathNearSameStep: ...whose step lies within this many steps of the previous "
        "recorded death(s).",
    ),
)
