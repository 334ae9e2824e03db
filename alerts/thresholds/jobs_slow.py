"""Thresholds of the job-level rules on slow ranks and goodput.

They tune ``alerts/rules/jobs_slow.py`` (TrainingRankSlow) and ``alerts/rules/goodput.py``
(TrainingGoodputLow).
"""

from __future__ import annotations

from alerts.kinds import DURATION, NUMBER
from alerts.thresholds.threshold import Threshold

THRESHOLDS: tuple[Threshold, ...] = (
    Threshold(
        "slow_rank_factor",
        1.5,
        NUMBER,
        "TrainingRankSlow: a rank's own time per step (waiting for data plus computing before "
        "the gradient all-reduce) at least this many times the median of its job's ranks...",
    ),
    Threshold(
        "slow_rank_for",
        "15m",
        DURATION,
        "TrainingRankSlow: ...for this long.",
    ),
    Threshold(
        "slow_rank_window",
        "5m",
        DURATION,
        "TrainingRankSlow: the window of the rates a rank's time per step is taken from.",
    ),
    Threshold(
        "goodput_min",
        0.9,
        NUMBER,
        "TrainingGoodputLow: the share of a live job's accounted time of the last 24h spent "
        "on productive steps (not recomputing lost steps, not down after a death, not stalled "
        "or starting) below which it fires.",
    ),
    Threshold(
        "goodput_min_accounted",
        "1h",
        DURATION,
        "TrainingGoodputLow: only for a job accounted at least this long in the last 24h (a "
        "job's first minutes, starting up, are not a goodput to page on).",
    ),
    Threshold(
        "goodput_gone_after",
        "1h",
        DURATION,
        "Goodput: a job whose ranks have all written no heartbeat for this long (dead, never "
        "restarted) is no longer accounted: its time is neither good nor lost until it comes "
        "back.",
    ),
)
