"""Thresholds of the checkpoint alerts (``alerts/rules/checkpoints.py``).

They tune the alerts on staleness, steps at risk, damage, orphaned and unjudged files, and the
volume filling up.
"""

from __future__ import annotations

from alerts.kinds import DURATION, NUMBER
from alerts.thresholds.threshold import Threshold

THRESHOLDS: tuple[Threshold, ...] = (
    Threshold(
        "checkpoint_stale",
        "3h",
        DURATION,
        "CheckpointStale: newest complete checkpoint unchanged for this long (Prometheus's "
        "clock) while the run's live process has been up this long (so a run relaunched from an "
        "old checkpoint does not fire; a run with no start age: alive now and this long ago).",
    ),
    Threshold(
        "steps_at_risk_factor",
        3,
        NUMBER,
        "StepsAtRisk: steps since the newest complete primary checkpoint above this many times "
        "the run's usual step distance between checkpoints.",
    ),
    Threshold(
        "checkpoint_cadence_window",
        "7d",
        DURATION,
        "StepsAtRisk: the window over which the usual step distance between checkpoints is "
        "estimated (recording rule run:trainguard_checkpoint_step_cadence:avg).",
    ),
    Threshold(
        "steps_at_risk_for",
        "10m",
        DURATION,
        "StepsAtRisk: how long the steps must stay at risk before the alert fires.",
    ),
    Threshold(
        "checkpoint_damage_for",
        "2m",
        DURATION,
        "CheckpointTruncated / CheckpointHashMismatch: how long the damage must be seen before "
        "paging (the exporter already ignores files still inside their write grace period).",
    ),
    Threshold(
        "partial_orphaned",
        "30m",
        DURATION,
        "CheckpointPartialOrphaned: a .part file not modified for this long.",
    ),
    Threshold(
        "checkpoint_unjudged_for",
        "30m",
        DURATION,
        "CheckpointUnknownMtime, CheckpointUnrecordedFiles: how long checkpoint files that cannot "
        "be judged (mtime 0; no record where records are expected) are seen before warning.",
    ),
    Threshold(
        "volume_fill_window",
        "6h",
        DURATION,
        "CheckpointVolumeFillingUp: the window of the linear prediction of free space.",
    ),
    Threshold(
        "volume_fill_horizon",
        "24h",
        DURATION,
        "CheckpointVolumeFillingUp: the prediction says the volume is full within this long...",
    ),
    Threshold(
        "volume_fill_min_checkpoints",
        10,
        NUMBER,
        "CheckpointVolumeFillingUp: ...and fewer than this many average-sized checkpoints still "
        "fit.",
    ),
    Threshold(
        "volume_fill_for",
        "30m",
        DURATION,
        "CheckpointVolumeFillingUp: how long both must hold before the alert fires.",
    ),
    Threshold(
        "checkpoint_fit_margin",
        1.25,
        NUMBER,
        "CheckpointWillNotFit: the location's free space below this many times the largest of "
        "its newest checkpoints (the next one is as big, plus growth and other writers)...",
    ),
    Threshold(
        "checkpoint_fit_for",
        "10m",
        DURATION,
        "CheckpointWillNotFit: ...for this long while the run is active (longer than a save "
        "and the prune after it, whose dip in free space is no alarm).",
    ),
)
