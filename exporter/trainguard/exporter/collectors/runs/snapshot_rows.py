"""A run's CUDA memory snapshots as the exporter publishes them, per run and rank.

What ``Run(oom_snapshots=True)`` dumped (at an OOM, on its schedule, when asked), what it could
not, whether torch records the allocation history, and the newest snapshot files
(docs/snapshots.md). The reporter carries the counts across the run's restarts.
"""

from __future__ import annotations

from typing import Any

from trainguard.exporter.scrape.collector import MetricSpec
from trainguard.shared.heartbeat import SNAPSHOT_REASONS, Heartbeat

RR = ("run", "rank")
SNAPSHOTS = MetricSpec(
    "trainguard_run_memory_snapshots_total",
    "counter",
    RR,
    "CUDA memory snapshots dumped at an OOM (carried across restarts of the run).",
)
SNAPSHOT_DUMPS = MetricSpec(
    "trainguard_run_memory_snapshot_dumps_total",
    "counter",
    ("run", "rank", "reason"),
    "CUDA memory snapshots written, by reason: oom, periodic, requested (carried across "
    "restarts of the run).",
)
SNAPSHOT_FAILURES = MetricSpec(
    "trainguard_run_memory_snapshot_failures_total",
    "counter",
    ("run", "rank", "reason"),
    "CUDA memory snapshots that could not be taken (no CUDA, no snapshot API, disk full), by "
    "reason; training went on.",
)
SNAPSHOT_HISTORY = MetricSpec(
    "trainguard_run_memory_history_recording",
    "gauge",
    RR,
    "1 if torch records the CUDA allocation history the run's snapshots show, 0 if it could "
    "not start recording.",
)
SNAPSHOT_RECENT = MetricSpec(
    "trainguard_run_memory_snapshot_timestamp_seconds",
    "gauge",
    ("run", "rank", "reason", "file", "step"),
    "When each of the run's newest memory snapshots was written; file is its name in the "
    "state directory.",
)
SNAPSHOT_METRICS = (SNAPSHOTS, SNAPSHOT_DUMPS, SNAPSHOT_FAILURES, SNAPSHOT_HISTORY, SNAPSHOT_RECENT)


def add_snapshots(fam: dict[str, Any], labels: list[str], hb: Heartbeat) -> None:
    """Add the heartbeat's snapshot counters, history flag and newest files."""
    fam[SNAPSHOTS.name].add_metric(labels, hb.memory_snapshots)
    snaps = hb.snapshots
    if snaps is None:
        return
    for reason in SNAPSHOT_REASONS:
        fam[SNAPSHOT_DUMPS.name].add_metric([*labels, reason], snaps.counts.get(reason, 0))
        fam[SNAPSHOT_FAILURES.name].add_metric([*labels, reason], snaps.failures.get(reason, 0))
    if snaps.history is not None:
        fam[SNAPSHOT_HISTORY.name].add_metric(labels, 1 if snaps.history else 0)
    for rec in snaps.recent:
        step = "" if rec.step is None else str(rec.step)
        fam[SNAPSHOT_RECENT.name].add_metric([*labels, rec.reason, rec.file, step], rec.time)
