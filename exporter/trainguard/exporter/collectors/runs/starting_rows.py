"""Ranks whose live process has not begun training: seen, and not judged on progress.

A framework callback reports from the framework's set-up, before a checkpoint is loaded, so that
a relaunch that dies loading it is a process the exporter sees (its pid in
``trainguard_run_info``) and, once gone without finishing, a death (``process_up`` 0). An
evaluation-only script builds the same trainer and never trains: while such a process is
starting (heartbeat ``starting``, docs/heartbeat.md#starting) its ``process_up``,
``finished`` and start time are left out, so that no rule judges it as a run that should step
(no first step, stalled, log or checkpoint stale, goodput), and ``trainguard_run_starting`` says
it is there. A relaunch after a death is never starting (the reporter judges it at once: no
evaluation follows a crash under its run's name), nor is a process that has ended.
"""

from __future__ import annotations

from typing import Any

from trainguard.exporter.runs.rows import RunRow
from trainguard.exporter.scrape.collector import MetricSpec

STARTING = MetricSpec(
    "trainguard_run_starting",
    "gauge",
    ("run", "rank"),
    "Always 1 for a rank whose live process has not begun training (set-up, checkpoint loading, "
    "or only evaluating); its process_up, finished and start time are absent meanwhile.",
)


def starting(row: RunRow) -> bool:
    """Whether the row's process is alive (or not known gone) and has not begun training."""
    hb = row.heartbeat
    return hb is not None and hb.starting and hb.state == "running" and row.up is not False


def add_starting(fam: dict[str, Any], row: RunRow) -> bool:
    """Add the row's ``trainguard_run_starting`` series when it is starting; whether it is."""
    if not starting(row):
        return False
    fam[STARTING.name].add_metric([row.run, row.rank], 1)
    return True
