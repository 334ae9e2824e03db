"""GPU health as NVML reports it, per physical GPU.

Why the clocks are held down, the PCIe link against what it could be, utilisation, power,
temperature, ECC errors, row remapping or page retirement, and NVLink errors.

Why: a run that slows down or stalls is most often slowed by its GPU (a hardware slowdown, a
link trained at Gen2, memory going bad) and nothing else says so. These series let the alert
rules page for the GPU states that hurt a run and name the cause on the run's own page.

Read by the GPU collector for every device it enumerates with ``nvmlDeviceGetHandleByIndex``:
physical GPUs only, never MIG instances, so a GPU's counters are published once however it is
partitioned. A read the GPU does not support (``NOT_SUPPORTED``: ECC on a GeForce, remapped rows
before Ampere, retired pages since, utilisation of a MIG-enabled GPU, NVLink on a PCIe card) or
the driver does not have (``FUNCTION_NOT_FOUND``) gives no series, which is not a failure. Any
other error is reported on the scrape (the collector's success goes to 0) and that reading alone
is left out. How each GPU is read and rendered cheaply, and what is read only every
:data:`~trainguard.exporter.collectors.gpu.health.device.SLOW_READ_S`: ``device.py``; the
series: ``metrics.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from trainguard.exporter.collectors.gpu.health.device import (
    RECHECK_UNSUPPORTED_S,
    SLOW_READ_S,
    DeviceHealth,
)
from trainguard.exporter.collectors.gpu.health.lines import Out
from trainguard.exporter.collectors.gpu.health.nvml import Functions
from trainguard.exporter.collectors.gpu.metrics import HEALTH
from trainguard.exporter.scrape.context import Scrape
from trainguard.exporter.scrape.exposition import LineFamily

__all__ = [
    "RECHECK_UNSUPPORTED_S",
    "SLOW_READ_S",
    "GpuHealth",
    "HealthDevice",
]


class HealthDevice(Protocol):
    """What the GPU collector knows of a device: its index label, UUID and NVML handle."""

    @property
    def index(self) -> str: ...
    @property
    def uuid(self) -> str: ...
    @property
    def handle(self) -> Any: ...


class GpuHealth:
    """The health series of one scrape: :meth:`begin`, :meth:`collect` per GPU, :meth:`families`.

    Keeps each GPU's reads and rendered lines between scrapes (:class:`DeviceHealth`), made
    afresh when NVML started afresh (the GPU's handle changed). The slow reads' lines of all
    GPUs are gathered once per slow read, not at every scrape: they change only when one GPU
    read them again (every SLOW_READ_S), was lost, or the GPUs changed. Not thread-safe: the
    GPU collector calls it under its lock.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._devices: dict[str, DeviceHealth] = {}
        self._seen: dict[str, DeviceHealth] = {}
        self._functions: Functions | None = None
        self._out = Out()
        self._now = 0.0
        self._templates = [spec.family() for spec in HEALTH]
        #: this scrape's GPUs in order, each with its slow reads' version (None: lost)
        self._slow_key: list[tuple[DeviceHealth, int] | None] = []
        self._slow_out: tuple[list[tuple[DeviceHealth, int] | None], Out] = ([], Out())

    def begin(self) -> None:
        """Start a scrape: no GPU read yet."""
        self._out = Out()
        self._now = self._clock()
        self._seen = {}
        self._slow_key = []

    def collect(self, dev: HealthDevice, scrape: Scrape) -> None:
        """Read ``dev``'s health; a failed read is reported with ``scrape.error``."""
        device = self._devices.get(dev.uuid)
        if device is None or device.handle is not dev.handle:  # NVML started afresh
            if self._functions is None:
                self._functions = Functions()
            device = DeviceHealth(dev.index, dev.uuid, dev.handle, self._functions)
        self._seen[dev.uuid] = device
        device.collect(self._out, scrape, self._now)
        self._slow_key.append(None if device.lost else (device, device.slow_version))

    def families(self) -> dict[str, LineFamily]:
        """This scrape's health families by name (a GPU not read in it is forgotten)."""
        self._devices = self._seen
        out, slow = self._out, self._slow_lines()
        families = {}
        for i, (spec, template) in enumerate(zip(HEALTH, self._templates, strict=True)):
            lines, rows = out.lines[i], out.rows[i]
            if not lines:  # a series is read at every scrape or slowly, never both
                lines, rows = slow.lines[i], slow.rows[i]
            families[spec.name] = LineFamily(template, lines, rows, spec.name)
        return families

    def _slow_lines(self) -> Out:
        """The slow reads' lines and rows of this scrape's GPUs: the last scrape's if the same.

        Shared between scrapes, so never changed once made.
        """
        key, (last_key, slow) = self._slow_key, self._slow_out
        if key != last_key:
            slow = Out()
            lines, rows = slow.lines, slow.rows
            for entry in key:
                if entry is not None:
                    for i, line, row in entry[0].slow:
                        lines[i].append(line)
                        rows[i].append(row)
            self._slow_out = (key, slow)
        return slow
