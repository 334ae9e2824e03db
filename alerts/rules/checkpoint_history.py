"""What the checkpoint alerts read over hours, recorded every slow_rules_interval.

CheckpointStale and CheckpointVolumeFillingUp (``checkpoints.py``) judge ranges of hours
(checkpoint_stale, 3h; volume_fill_window, 6h) of every location: read every 15 s, those were
the checkpoint group's costliest part at fleet scale (bench/RESULTS.md, "Fleet scale"). Here
they are read once every slow_rules_interval (5m); the alerts read the records with
last_over_time over slow_rules_lookback, and so fire (and resolve) up to 5m later.
"""

from __future__ import annotations

from alerts.rules.common import Group, Record

#: max - min of the newest checkpoint's timestamp over checkpoint_stale (0: unchanged)
SPREAD = "run_location:trainguard_checkpoint_last_timestamp_seconds:spread"
#: changes of the newest checkpoint's timestamp over checkpoint_stale
CHANGES = "run_location:trainguard_checkpoint_last_timestamp_seconds:changes"
#: the location's least location_up over checkpoint_stale (1: readable all along)
UP_MIN = "run_location:trainguard_checkpoint_location_up:min"
#: the location's newest checkpoint step seen within checkpoint_stale (absent: none)
STEP_SEEN = "run_location:trainguard_checkpoint_last_step:last"
#: the volume's free bytes predicted volume_fill_horizon ahead from volume_fill_window
AVAIL_PREDICTED = "run_location:trainguard_checkpoint_filesystem_avail_bytes:predicted"

SLOW = Group(
    "trainguard-checkpoints.slow",
    interval="${slow_rules_interval}",
    rules=(
        Record(
            SPREAD,
            """
            max by (${target_labels}, run, location) (
              max_over_time(trainguard_checkpoint_last_timestamp_seconds[${checkpoint_stale}])
            )
            - max by (${target_labels}, run, location) (
              min_over_time(trainguard_checkpoint_last_timestamp_seconds[${checkpoint_stale}])
            )
            """,
        ),
        Record(
            CHANGES,
            """
            max by (${target_labels}, run, location) (
              changes(trainguard_checkpoint_last_timestamp_seconds[${checkpoint_stale}])
            )
            """,
        ),
        Record(
            UP_MIN,
            """
            min by (${target_labels}, run, location) (
              min_over_time(trainguard_checkpoint_location_up[${checkpoint_stale}])
            )
            """,
        ),
        Record(
            STEP_SEEN,
            """
            max by (${target_labels}, run, location) (
              last_over_time(trainguard_checkpoint_last_step[${checkpoint_stale}])
            )
            """,
        ),
        Record(
            AVAIL_PREDICTED,
            """
            predict_linear(
              trainguard_checkpoint_filesystem_avail_bytes[${volume_fill_window}],
              ${volume_fill_horizon_s}
            )
            """,
        ),
    ),
)
