"""The collectors, one module each, and the list the exporter builds them from.

Each is a :class:`trainguard.exporter.collector.Collector` that declares its name, help and
whether it is on by default. :data:`COLLECTORS` is the list the exporter's
``--[no-]collector.NAME`` flags and its collectors are built from, in the order their series
are served.
"""

from __future__ import annotations

from trainguard.exporter.collector import Collector
from trainguard.exporter.collectors.checkpoints import CheckpointsCollector
from trainguard.exporter.collectors.gpu import GpuCollector
from trainguard.exporter.collectors.processes import ProcessesCollector
from trainguard.exporter.collectors.restore import RestoreCollector
from trainguard.exporter.collectors.runs import RunsCollector

COLLECTORS: tuple[type[Collector], ...] = (
    GpuCollector,
    ProcessesCollector,
    RunsCollector,
    CheckpointsCollector,
    RestoreCollector,
)
