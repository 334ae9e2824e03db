"""Per-rank time waiting for data and computing: the series that tell which rank is slow.

The totals a process gave ``Run.step(data_seconds=, compute_seconds=)`` (or a framework
callback measured), from its heartbeat's ``timing``. Counters: they restart at 0 with each
process of the rank, which ``rate()`` takes as a reset. Absent for a rank that never gave a
duration. How the rules use them: docs/metrics.md#who-is-slow.
"""

from __future__ import annotations

from typing import Any

from trainguard.exporter.scrape.collector import MetricSpec
from trainguard.shared.heartbeat import Heartbeat

RR = ("run", "rank")
DATA_WAIT = MetricSpec(
    "trainguard_run_data_wait_seconds_total",
    "counter",
    RR,
    "Seconds the rank's current process waited for its next batch, summed over its timed steps.",
)
COMPUTE = MetricSpec(
    "trainguard_run_compute_seconds_total",
    "counter",
    RR,
    "Seconds the rank's current process computed before the gradient all-reduce, summed over "
    "its timed steps.",
)
TIMED_STEPS = MetricSpec(
    "trainguard_run_timed_steps_total",
    "counter",
    RR,
    "Steps of the rank's current process that carried a data or compute duration.",
)
METRICS = (DATA_WAIT, COMPUTE, TIMED_STEPS)


def add_timing(fam: dict[str, Any], labels: list[str], hb: Heartbeat) -> None:
    """Add the rank's timing counters, when its heartbeat carries any."""
    timing = hb.timing
    if timing is None:
        return
    fam[DATA_WAIT.name].add_metric(labels, timing.data_seconds)
    fam[COMPUTE.name].add_metric(labels, timing.compute_seconds)
    fam[TIMED_STEPS.name].add_metric(labels, timing.steps)
