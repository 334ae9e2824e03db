"""Thresholds of the training health alerts (``alerts/rules/training_health.py``).

They tune the alerts on a non-finite loss, a loss spike against the run's own recent level, and
a run that keeps restarting without getting past its checkpoint.
"""

from __future__ import annotations

from alerts.kinds import DURATION, NUMBER
from alerts.thresholds.threshold import Threshold

THRESHOLDS: tuple[Threshold, ...] = (
    Threshold(
        "loss_nonfinite_steps",
        3,
        NUMBER,
        "TrainingLossNonFinite: a rank's loss was NaN or infinite for this many consecutive "
        "observed steps (the reporter observes the latest step once per interval, 1 s by "
        "default: about this many seconds with fast steps).",
    ),
    Threshold(
        "loss_spike_factor",
        2,
        NUMBER,
        "TrainingLossSpike: a rank's loss is above this many times its own median over "
        "loss_spike_baseline...",
    ),
    Threshold(
        "loss_spike_baseline",
        "1h",
        DURATION,
        "TrainingLossSpike: ...the window of that median; the run must have reported a loss "
        "this long ago already (warm-up)...",
    ),
    Threshold(
        "loss_spike_min_samples",
        30,
        NUMBER,
        "TrainingLossSpike: ...with at least this many finite loss samples (rule evaluations) "
        "in the window...",
    ),
    Threshold(
        "loss_spike_for",
        "5m",
        DURATION,
        "TrainingLossSpike: ...at every evaluation for this long (a single noisy batch is not a "
        "spike).",
    ),
    Threshold(
        "restart_loop_restarts",
        3,
        NUMBER,
        "TrainingRestartLoop: the run recorded this many deaths (each followed by a restart)...",
    ),
    Threshold(
        "restart_loop_window",
        "2h",
        DURATION,
        "TrainingRestartLoop: ...within this window, while its newest complete primary "
        "checkpoint did not advance (without checkpoints: while its current process has not "
        "got further than the deaths of the window).",
    ),
)
