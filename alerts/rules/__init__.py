"""The rule groups of ``alerts/trainguard.rules.yml`` and their thresholds.

One module per group (or per group and its ``.slow`` or ``.window`` companion, evaluated every
slow_rules_interval or window_rules_interval), its thresholds at its top.
``GROUPS`` is the file order: recording rules first, because promtool tests evaluate groups in
this order (``group_eval_order``) so that the alerts see the recording rules of the same step.
``THRESHOLDS`` joins the modules' thresholds: the order of the generated file's header and of
``--list`` (after the site-wide ones of ``alerts/site.py``).
"""

from __future__ import annotations

from alerts.kinds import Threshold
from alerts.rules import (
    allocator,
    checkpoint_history,
    checkpoints,
    deaths,
    exporter,
    goodput,
    gpu,
    gpu_health,
    memory,
    pace,
    recording,
    restore,
    runs,
    saves,
    signals,
    stuck,
    training_health,
)
from alerts.rules.common import Alert, Group, Record
from alerts.rules.jobs import deaths as jobs
from alerts.rules.jobs import slow as jobs_slow
from alerts.rules.jobs import stall as jobs_stall

GROUPS: tuple[Group, ...] = (
    recording.GROUP,
    pace.GROUP,
    memory.RANK,
    recording.SLOW,
    runs.GROUP,
    checkpoint_history.SLOW,
    checkpoints.GROUP,
    checkpoints.WINDOW,
    gpu.GROUP,
    gpu.WINDOW,
    allocator.SLOW,
    allocator.GROUP,
    allocator.WINDOW,
    deaths.GROUP,
    exporter.GROUP,
    gpu_health.GROUP,
    gpu_health.WINDOW,
    training_health.GROUP,
    training_health.SLOW,
    stuck.GROUP,
    signals.GROUP,
    jobs.GROUP,
    saves.GROUP,
    restore.GROUP,
    jobs_slow.GROUP,
    goodput.GROUP,
    goodput.SLOW,
    jobs_stall.GROUP,
)

THRESHOLDS: tuple[Threshold, ...] = (
    *runs.THRESHOLDS,
    *checkpoints.THRESHOLDS,
    *gpu.THRESHOLDS,
    *allocator.THRESHOLDS,
    *exporter.THRESHOLDS,
    *deaths.THRESHOLDS,
    *gpu_health.THRESHOLDS,
    *training_health.THRESHOLDS,
    *stuck.THRESHOLDS,
    *signals.THRESHOLDS,
    *jobs.THRESHOLDS,
    *saves.THRESHOLDS,
    *restore.THRESHOLDS,
    *jobs_slow.THRESHOLDS,
    *goodput.THRESHOLDS,
)

__all__ = ["GROUPS", "THRESHOLDS", "Alert", "Group", "Record"]
