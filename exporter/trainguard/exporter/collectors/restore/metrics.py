"""The restore collector's series, in docs/metrics.md's order."""

from __future__ import annotations

from trainguard.exporter.scrape.collector import MetricSpec

LABELS = ("run", "location")
VERIFIED_STEP = MetricSpec(
    "trainguard_checkpoint_restore_verified_step",
    "gauge",
    LABELS,
    "Step of the newest checkpoint a restore drill (trainguard verify --restore) loaded; absent "
    "until one succeeded.",
)
VERIFIED_TIME = MetricSpec(
    "trainguard_checkpoint_restore_verified_timestamp_seconds",
    "gauge",
    LABELS,
    "When the drill that loaded it finished.",
)
LAST_SUCCESS = MetricSpec(
    "trainguard_checkpoint_restore_last_check_success",
    "gauge",
    LABELS,
    "1 if the last restore drill loaded the checkpoint, 0 if it failed or could not check.",
)
LAST_TIME = MetricSpec(
    "trainguard_checkpoint_restore_last_check_timestamp_seconds",
    "gauge",
    LABELS,
    "When the last restore drill finished, whatever its outcome.",
)

LAST_AGE = MetricSpec(
    "trainguard_checkpoint_restore_last_check_age_seconds",
    "gauge",
    LABELS,
    "Seconds since the last restore drill finished, by this host's clock: the newest result "
    "of a location across exporters is the one of least age.",
)
VERIFIED_AGE = MetricSpec(
    "trainguard_checkpoint_restore_verified_age_seconds",
    "gauge",
    LABELS,
    "Seconds since the drill that loaded the verified step finished, by this host's clock.",
)

METRICS = (VERIFIED_STEP, VERIFIED_TIME, LAST_SUCCESS, LAST_TIME, LAST_AGE, VERIFIED_AGE)
