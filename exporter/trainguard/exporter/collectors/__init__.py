"""The collectors, one module each, and the list the exporter builds them from.

Each is a :class:`trainguard.exporter.scrape.collector.Collector` that declares its name, help and
whether it is on by default. :data:`COLLECTORS` is the list the exporter's
``--[no-]collector.NAME`` flags and its collectors are built from, in the order their series
are served.
"""

from __future__ import annotations

from trainguard.exporter.collectors.checkpoints.collector import CheckpointsCollector
from trainguard.exporter.collectors.gpu.collector import GpuCollector
from trainguard.exporter.collectors.processes import ProcessesCollector
from trainguard.exporter.collectors.restore.collector import RestoreCollector
from trainguard.exporter.collectors.runs.collector import RunsCollector
from trainguard.exporter.scrape.collector import Collector

COLLECTORS: tuple[type[Collector], ...] = (
    GpuCollector,
    ProcessesCollector,
    RunsCollector,
    CheckpointsCollector,
    RestoreCollector,
)
