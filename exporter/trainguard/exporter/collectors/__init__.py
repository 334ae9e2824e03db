"""The collectors, one package each (``processes`` a module), and the list the exporter builds.

Each is a :class:`trainguard.exporter.scrape.collector.Collector` that declares its name, help,
whether it is on by default and its series, and is built from the
:class:`~trainguard.exporter.runs.table.Setup` they share. :data:`COLLECTORS` is the list the
exporter's ``--[no-]collector.NAME`` flags and its collectors are built from, in the order their
series are served.
"""

from __future__ import annotations

from typing import Protocol

from trainguard.exporter.collectors.checkpoints.collector import CheckpointsCollector
from trainguard.exporter.collectors.gpu.collector import GpuCollector
from trainguard.exporter.collectors.processes import ProcessesCollector
from trainguard.exporter.collectors.restore.collector import RestoreCollector
from trainguard.exporter.collectors.runs.collector import RunsCollector
from trainguard.exporter.runs.table import Setup
from trainguard.exporter.scrape.collector import Collector, MetricSpec


class Buildable(Protocol):
    """A collector class as the exporter sees it before building it: its flag and its series."""

    @property
    def name(self) -> str: ...
    @property
    def help(self) -> str: ...
    @property
    def enabled_by_default(self) -> bool: ...
    @property
    def metrics(self) -> tuple[MetricSpec, ...]: ...

    def build(self, setup: Setup) -> Collector:
        """The collector the exporter runs, wired to what it shares with the others."""
        ...


COLLECTORS: tuple[Buildable, ...] = (
    GpuCollector,
    ProcessesCollector,
    RunsCollector,
    CheckpointsCollector,
    RestoreCollector,
)
