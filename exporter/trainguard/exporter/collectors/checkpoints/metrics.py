"""The checkpoints collector's series, in docs/metrics.md's order.

The one place a checkpoint metric is defined: docs/metrics.md is checked against these, the
verdicts (``verdicts``) name the judged ones, the saves (``saves``) their own.
"""

from __future__ import annotations

from trainguard.exporter.scrape.collector import MetricSpec

#: the labels of a location's series
LOCATION = ("run", "location")


def spec(name: str, help: str, labels: tuple[str, ...] = LOCATION) -> MetricSpec:
    """A checkpoint metric: ``trainguard_checkpoint_`` + ``name``, a gauge."""
    return MetricSpec(f"trainguard_checkpoint_{name}", "gauge", labels, help)


LOCATION_UP = spec(
    "location_up",
    "1 if the location's directory and manifest could be read in this scrape, 0 if not (the "
    "location's other series are then absent and the reason is logged).",
)
LOCATION_INFO = spec(
    "location_info",
    "Always 1, one series per watched location: trust_unrecorded says whether the config "
    "counts settled files without records as complete (rules alert on unrecorded files only "
    "where it is false).",
    ("run", "location", "trust_unrecorded"),
)
LAST_STEP = spec("last_step", "Step of the newest complete checkpoint.")
LAST_FINITE_STEP = spec(
    "last_finite_step",
    "Step of the newest complete checkpoint not saved with a non-finite loss (its record says "
    "the loss was finite, or says nothing of it): the one to resume from after a NaN.",
)
LAST_TIMESTAMP = spec(
    "last_timestamp_seconds", "Modification time of the newest complete checkpoint."
)
FILES = spec("files", "Checkpoint files (names matching the pattern, .part not included).")
BYTES = spec("bytes", "Total size of the checkpoint files.")
SIZE = spec(
    "size_bytes",
    "Size of the checkpoint files of a step (newest steps only).",
    ("run", "location", "step"),
)
EXPECTED_SIZE = spec(
    "expected_size_bytes",
    "Size recorded when the step's checkpoint was written (newest steps only).",
    ("run", "location", "step"),
)
TRUNCATED = spec(
    "truncated_files",
    "Files smaller than their recorded size: at once against their own record, else once "
    "untouched for the grace period.",
)
DAMAGED_STEP = spec(
    "newest_damaged_step",
    "Step of the newest checkpoint file at the location that is damaged (damage: truncated, "
    "hash_mismatch); absent when none is. The rules compare it with the newest complete step "
    "of every location of the run: damage to a step held intact elsewhere (or older than an "
    "intact one) warns, damage with nothing as new intact pages.",
    ("run", "location", "damage"),
)
OVERSIZED = spec(
    "oversized_files",
    "Files larger than their recorded size: at once against their own record, else once "
    "untouched for the grace period.",
)
HASH_MISMATCH = spec(
    "hash_mismatch_files",
    "Files of the recorded size whose content does not hash to the recorded SHA-256.",
)
HASH_PENDING = spec(
    "hash_pending_files",
    "Files with a recorded SHA-256 and the expected size not verified yet (in the grace period, "
    "queued, or unreadable).",
)
UNRECORDED = spec(
    "unrecorded_files",
    "Files with no recorded size to judge them by (no manifest record, and for a mirror none on "
    "the primary either): complete only where the config trusts unrecorded files.",
)
#: the series judged from a location's files (the rest are read afresh at every scrape)
JUDGED = (
    LAST_STEP,
    LAST_FINITE_STEP,
    LAST_TIMESTAMP,
    FILES,
    BYTES,
    SIZE,
    EXPECTED_SIZE,
    TRUNCATED,
    DAMAGED_STEP,
    OVERSIZED,
    HASH_MISMATCH,
    HASH_PENDING,
    UNRECORDED,
)
UNKNOWN_MTIME = spec(
    "unknown_mtime_files",
    "Files and .part files whose modification time is unknown (0): never old, never complete.",
)
PARTIAL = spec(
    "partial_files", ".part files: checkpoints being written, or left by a writer that died."
)
PARTIAL_AGE = spec(
    "oldest_partial_age_seconds",
    "Time since the oldest .part file was last written to (absent when there is none).",
)
AVAIL = spec(
    "filesystem_avail_bytes", "Space available to unprivileged users on the location's filesystem."
)
SAVE_FAILURES = MetricSpec(
    "trainguard_checkpoint_save_failures_total",
    "counter",
    ("run", "location", "reason"),
    "Saves into the location that failed, by reason (enospc, edquot, eio, erofs, other), "
    "counted by trainguard.checkpoint and the framework integrations, also when the script "
    "caught the error and trained on.",
)
LAST_SUCCESS = MetricSpec(
    "trainguard_checkpoint_last_save_success_timestamp_seconds",
    "gauge",
    ("run", "location"),
    "When the last save into the location completed (the training host's clock); absent "
    "before the first.",
)
LAST_SUCCESS_AGE = MetricSpec(
    "trainguard_checkpoint_last_save_success_age_seconds",
    "gauge",
    ("run", "location"),
    "Seconds since the last save into the location completed, by the exporter's clock (the "
    "training host's: rules judge how overdue a save is on it, never time() minus a host "
    "timestamp); absent before the first.",
)
LAST_FAILURE = MetricSpec(
    "trainguard_checkpoint_last_save_failure_timestamp_seconds",
    "gauge",
    ("run", "location"),
    "When the last save into the location failed (the training host's clock); absent before "
    "the first.",
)
LAST_FAILURE_AGE = MetricSpec(
    "trainguard_checkpoint_last_save_failure_age_seconds",
    "gauge",
    ("run", "location"),
    "Seconds since the last save into the location failed, by the exporter's clock (the "
    "training host's): beside the success's age, which of the two is newer on any node of a "
    "job, whatever the nodes' clocks; absent before the first.",
)
#: the series the checkpoints collector publishes, in this order
METRICS = (
    LOCATION_UP,
    LOCATION_INFO,
    *JUDGED,
    UNKNOWN_MTIME,
    PARTIAL,
    PARTIAL_AGE,
    AVAIL,
    SAVE_FAILURES,
    LAST_SUCCESS,
    LAST_SUCCESS_AGE,
    LAST_FAILURE,
    LAST_FAILURE_AGE,
)
