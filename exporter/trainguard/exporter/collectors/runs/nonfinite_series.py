"""The series of a run's non-finite scalars, from the heartbeat's ``nonfinite`` record.

Served by the runs collector (:mod:`trainguard.exporter.collectors.runs.collector`), per run and
rank; absent for heartbeats of reporters older than the record. What "observed" means (one step per
reporter wake-up) is in :mod:`trainguard.run.scalar_health` and docs/metrics.md.
"""

from __future__ import annotations

from typing import Any

from trainguard.exporter.scrape.collector import MetricSpec
from trainguard.shared.heartbeat import Heartbeat

NONFINITE = MetricSpec(
    "trainguard_run_scalar_nonfinite_total",
    "counter",
    ("run", "rank", "name"),
    "Steps the reporter observed (at most one per writer interval) whose scalar was NaN or "
    "infinite; per process (restarts from 0).",
)
LOSS_STREAK = MetricSpec(
    "trainguard_run_loss_nonfinite_streak",
    "gauge",
    ("run", "rank"),
    "Consecutive observed steps, up to the latest, whose loss was NaN or infinite; 0 once a "
    "finite loss is reported.",
)
METRICS = (NONFINITE, LOSS_STREAK)


def add_nonfinite(fam: dict[str, Any], labels: list[str], hb: Heartbeat) -> None:
    """Add one rank's non-finite counts and loss streak to the families ``fam``."""
    record = hb.nonfinite
    if record is None:
        return
    for name, count in sorted(record.counts.items()):
        fam[NONFINITE.name].add_metric([*labels, name], count)
    fam[LOSS_STREAK.name].add_metric(labels, record.loss_streak)
