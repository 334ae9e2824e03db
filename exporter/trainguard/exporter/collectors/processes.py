"""Counts of host processes by name pattern.

Two instances of a VM host process (``vmmem``) where there should be one is a session that was
never released and still holds GPU memory.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import psutil
from prometheus_client.core import Metric

from trainguard.exporter.config.model import ProcessCount
from trainguard.exporter.runs.table import Setup
from trainguard.exporter.scrape.collector import Collector, MetricSpec
from trainguard.exporter.scrape.context import Scrape

PROCESS_COUNT = MetricSpec(
    "trainguard_process_count",
    "gauge",
    ("name",),
    "Number of host processes whose name matches the configured pattern.",
)


class ProcessesCollector(Collector):
    name = "processes"
    help = "counts of the host processes named in the config file"
    metrics = (PROCESS_COUNT,)

    @classmethod
    def build(cls, setup: Setup) -> ProcessesCollector:
        return cls(setup.config.process_counts)

    def __init__(self, counts: Sequence[ProcessCount]) -> None:
        self._counts = tuple(counts)

    def gather(self, scrape: Scrape) -> Iterable[Metric]:
        family = PROCESS_COUNT.family()
        if not self._counts:
            return [family]
        totals = dict.fromkeys((c.name for c in self._counts), 0)
        for proc in psutil.process_iter(["name"]):
            pname = proc.info.get("name")
            if not pname:
                continue  # vanished or access denied: it cannot be told apart, so not counted
            for count in self._counts:
                if count.match.search(pname):
                    totals[count.name] += 1
        for name, total in totals.items():
            family.add_metric([name], total)
        return [family]
