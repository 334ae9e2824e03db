"""Thresholds of the alerts on a run's progress (``alerts/rules/runs.py``).

They tune the alerts on stalls, the first step, throughput and the log file.
"""

from __future__ import annotations

from alerts.kinds import DURATION, NUMBER
from alerts.thresholds.threshold import Threshold

THRESHOLDS: tuple[Threshold, ...] = (
    Threshold(
        "stall",
        "10m",
        DURATION,
        "TrainingStalled: the least time without a new step (or without a heartbeat) that is a "
        "stall, however fast the run steps.",
    ),
    Threshold(
        "stall_factor",
        3,
        NUMBER,
        "TrainingStalled: a run is stalled after this many times its longest recent interval "
        "between two steps (its own pace: slow steps are not a stall)...",
    ),
    Threshold(
        "stall_window",
        "6h",
        DURATION,
        "TrainingStalled: ...the longest interval between steps seen within this window "
        "(recording rule run_rank:trainguard_run_step_gap_seconds:max)...",
    ),
    Threshold(
        "stall_gap_lookback",
        "5m",
        DURATION,
        "TrainingStalled: ...an interval counts once it ended with a step of the same process, "
        "seen within this long (more than twice pace_rules_interval, whose group records it) "
        "by a process up "
        "longer than this and longer than the interval: a hang that ended with a kill and a "
        "relaunch never teaches the pace...",
    ),
    Threshold(
        "stall_max",
        "4h",
        DURATION,
        "TrainingStalled: ...but never more than this, which is also the threshold while the "
        "run's pace is not known yet (before it completed an interval between two steps).",
    ),
    Threshold(
        "first_step",
        "1h",
        DURATION,
        "TrainingNoFirstStep: a live process that has reported no step this long after it "
        "started (NCCL rendezvous, data loader, checkpoint loading hung).",
    ),
    Threshold(
        "throughput_ratio",
        0.5,
        NUMBER,
        "TrainingThroughputDropped: a live run stepping at less than this fraction of its usual "
        "rate...",
    ),
    Threshold(
        "throughput_window",
        "10m",
        DURATION,
        "TrainingThroughputDropped: ...its rate now being deriv(step) over this window, within "
        "the current process (a just started or resumed process has no rate for this long)...",
    ),
    Threshold(
        "throughput_min_steps",
        10,
        NUMBER,
        "TrainingThroughputDropped: ...unless the rank's longest recent interval between steps "
        "leaves fewer than this many steps in throughput_window (slow steps: a window holding "
        "0-2 steps is no rate)...",
    ),
    Threshold(
        "throughput_window_slow",
        "1h",
        DURATION,
        "TrainingThroughputDropped: ...then its rate is deriv(step) over this window instead, "
        "within the current process...",
    ),
    Threshold(
        "throughput_baseline",
        "6h",
        DURATION,
        "TrainingThroughputDropped: ...its usual rate the 90th percentile of that rate over "
        "this window (earlier processes of the run included: a slower relaunch counts)...",
    ),
    Threshold(
        "throughput_for",
        "15m",
        DURATION,
        "TrainingThroughputDropped: ...for this long.",
    ),
    Threshold(
        "log_stale",
        "30m",
        DURATION,
        "TrainingLogStale: the run's log file not modified for this long (by Prometheus's "
        "clock: no change of its mtime) while the run is alive, and was alive this long ago; "
        "a run whose learned stall threshold is longer (slow steps, logging once per step) "
        "is judged on that threshold instead.",
    ),
)
