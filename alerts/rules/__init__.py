"""The rule groups of ``alerts/trainguard.rules.yml``, one module each, in file order.

Recording rules come first: promtool tests evaluate groups in this order (``group_eval_order``)
so that the alerts see the recording rules of the same step.
"""

from __future__ import annotations

from alerts.rules import (
    allocator,
    checkpoint_history,
    checkpoints,
    deaths,
    exporter,
    goodput,
    gpu,
    gpu_health,
    jobs,
    jobs_slow,
    jobs_stall,
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

GROUPS: tuple[Group, ...] = (
    recording.GROUP,
    pace.GROUP,
    memory.RANK,
    memory.GPU,
    recording.SLOW,
    runs.GROUP,
    checkpoint_history.SLOW,
    checkpoints.GROUP,
    gpu.GROUP,
    allocator.SLOW,
    allocator.GROUP,
    deaths.GROUP,
    exporter.GROUP,
    gpu_health.GROUP,
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

__all__ = ["GROUPS", "Alert", "Group", "Record"]
