"""GPU memory and critical Xid errors as the driver reports them (NVML through pynvml).

Memory per device, per process, and the part of device memory that no live process accounts
for (ghost memory); and the critical Xid errors the driver reported per GPU (read on a thread
of their own, see ``xid.py``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pynvml
from prometheus_client.core import Metric

from trainguard.exporter.collectors.gpu.health import gpus as gpu_health
from trainguard.exporter.collectors.gpu.metrics import (
    GPU_INFO,
    MEMORY_TOTAL,
    MEMORY_USED,
    METRICS,
    NVML_AVAILABLE,
    OWN,
    PROCESS_MEMORY,
    PROCESSES,
    PROCESSES_UNKNOWN,
    RUN_MEMORY,
    UNATTRIBUTED,
    UNINTERRUPTIBLE,
    XID_ERRORS,
    XID_SUPPORTED,
)
from trainguard.exporter.collectors.gpu.processes import COMPUTE, GRAPHICS, ProcessLister
from trainguard.exporter.collectors.gpu.xid import XidCounts, XidDevice, XidWatcher
from trainguard.exporter.runs.table import Setup
from trainguard.exporter.scrape.collector import Collector, CollectorError
from trainguard.exporter.scrape.context import Scrape
from trainguard.exporter.scrape.relay import Unfinished
from trainguard.shared import procinfo
from trainguard.shared.gpu_uuid import normalize_gpu_uuid

log = logging.getLogger(__name__)

#: pid -> (run, rank) for the processes of runs that are alive now
PidRuns = Callable[[Scrape], Mapping[int, tuple[str, str]]]


@dataclass(frozen=True)
class _Device:
    index: str
    uuid: str
    name: str
    handle: Any


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class GpuCollector(Collector):
    """Keeps NVML initialised between scrapes (device handles and names are cached).

    Any device-level failure makes the next scrape start NVML afresh, which is how a GPU that
    was lost and came back, or a driver that was reloaded, is picked up again.
    """

    name = "gpu"
    help = "GPU memory through NVML, the driver's view per device and process"
    metrics = METRICS

    @classmethod
    def build(cls, setup: Setup) -> GpuCollector:
        collector = cls(pid_runs=setup.table.pid_runs)
        collector.shared_reads = (setup.table.view,)
        return collector

    def __init__(self, pid_runs: PidRuns | None = None) -> None:
        self._pid_runs = pid_runs
        self._lock = threading.Lock()
        self._devices: tuple[_Device, ...] | None = None
        self._driver = ""
        self._uuids: dict[int, str] = {}  # remembered so a GPU lost at start is still named
        self._started_with: tuple[str, int] | None = None
        self._xids = XidCounts()  # since the exporter started, across NVML restarts
        self._xid_watcher: XidWatcher | None = None
        self._told_no_driver = False
        self._listers = (ProcessLister(COMPUTE), ProcessLister(GRAPHICS))
        self._health = gpu_health.GpuHealth()

    def _start(self, scrape: Scrape) -> tuple[_Device, ...] | None:
        """Initialise NVML and cache what doesn't change: handles, UUIDs, names, driver.

        None when no NVIDIA driver is installed at all.
        """
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError_LibraryNotFound:
            # A checkpoint server or a CPU node: nothing is wrong, there is nothing to watch.
            # Tried again at every scrape (a failed dlopen is cheap): a driver installed later
            # is picked up.
            if not self._told_no_driver:
                self._told_no_driver = True
                log.info(
                    "no NVIDIA driver (the NVML library cannot be loaded): no GPU metrics; "
                    "trainguard_gpu_nvml_available is 0 (run with --no-collector.gpu to skip "
                    "the GPU collector on this host)"
                )
            return None
        except pynvml.NVMLError as exc:
            raise CollectorError(f"NVML is not available: {exc}") from exc
        self._told_no_driver = False
        try:
            self._driver = _text(pynvml.nvmlSystemGetDriverVersion())
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as exc:
            self._stop()
            raise CollectorError(f"NVML failed while listing devices: {exc}") from exc
        devices = []
        for i in range(count):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                raw = _text(pynvml.nvmlDeviceGetUUID(handle))
                # one spelling with the training side's, so the two join exactly
                uuid = normalize_gpu_uuid(raw) or raw
                name = _text(pynvml.nvmlDeviceGetName(handle))
            except pynvml.NVMLError as exc:
                scrape.error(f"GPU {i} ({self._uuids.get(i, 'uuid unknown')}): {exc}")
                continue
            self._uuids[i] = uuid
            devices.append(_Device(index=str(i), uuid=uuid, name=name, handle=handle))
        if self._started_with != (self._driver, count):
            self._started_with = (self._driver, count)
            log.info("NVML started: driver %s, %d GPU(s)", self._driver, count)
        return tuple(devices)

    def close(self) -> None:
        """Shut NVML down (the exporter never does: it keeps NVML between scrapes)."""
        with self._lock:
            self._stop()

    def _stop(self) -> None:
        self._devices = None
        for lister in self._listers:
            lister.forget()
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()

    def gather(self, scrape: Scrape) -> Iterable[Metric]:
        families: dict[str, Any] = {spec.name: spec.family() for spec in OWN}
        run_memory: dict[tuple[str, str, str], int | None] = {}
        with self._lock:
            self._health.begin()
            try:
                self._gather_devices(scrape, families, run_memory)
            except CollectorError as exc:  # NVML did not start: no GPU series this time...
                scrape.error(str(exc))
            health = self._health.families()  # rendered lines, after the families above
        # ...but the Xid counts are the exporter's own memory: a GPU that fell off the bus
        # (Xid 79) and took the driver with it must not take its Xid count along
        xid_family = families[XID_ERRORS.name]
        for (index, uuid, xid), count in self._xids.items():
            xid_family.add_metric([index, uuid, xid], count)
        run_family = families[RUN_MEMORY.name]
        for (run, rank, gpu), used in sorted(run_memory.items()):
            if used is not None:
                run_family.add_metric([run, rank, gpu], used)
        families.update(health)
        return families.values()

    def _gather_devices(
        self,
        scrape: Scrape,
        families: dict[str, Any],
        run_memory: dict[tuple[str, str, str], int | None],
    ) -> None:
        failed = False
        if self._devices is None:
            started = self._start(scrape)
            if started is None:
                families[NVML_AVAILABLE.name].add_metric([], 0)
                return
            self._devices = started
            failed = bool(scrape.errors)
        devices = self._devices
        families[NVML_AVAILABLE.name].add_metric([], 1)
        if not self._watch_xids(devices, scrape):
            failed = True
        pid_runs: dict[int, tuple[str, str]] | None = {}
        try:
            pid_runs = dict(self._pid_runs(scrape)) if self._pid_runs else {}
        except Unfinished as exc:
            # the runs are unknown (the state directory hangs): the devices are still served,
            # but no process is said to belong to no run, and no run's memory is summed
            scrape.error(f"processes not attributed to runs: {exc}")
            pid_runs = None
        states: dict[int, str | None] = {}  # a process on several GPUs is looked up once
        for dev in devices:
            try:
                self._gather_device(dev, pid_runs, families, run_memory, states)
            except pynvml.NVMLError as exc:
                scrape.error(f"GPU {dev.index} ({dev.uuid}): {exc}")
                failed = True
            else:  # a GPU that failed above is reported once, not again for each health read
                self._health.collect(dev, scrape)
        if failed:
            self._stop()  # start afresh next scrape: a lost GPU may come back

    def _watch_xids(self, devices: tuple[_Device, ...], scrape: Scrape) -> bool:
        """Keep a watcher on these GPUs' Xid events.

        A new one is started when a GPU appears that the current one does not watch, or when
        its wait failed (reported, and replaced at once, so that a wait that keeps failing fails
        every scrape). False when anything failed.
        """
        ok = True
        watcher = self._xid_watcher
        if watcher is not None and not watcher.alive:
            scrape.error(f"Xid events: {watcher.error}")
            self._xid_watcher = watcher = None
            ok = False
        if watcher is not None and watcher.covers(d.uuid for d in devices):
            return ok
        replacement = XidWatcher(self._xids)
        try:
            replacement.start(XidDevice(d.index, d.uuid, d.handle) for d in devices)
        except pynvml.NVMLError as exc:
            scrape.error(f"cannot watch Xid events: {exc}")
            return False
        if watcher is not None:
            watcher.stop()  # after the replacement registered: no gap without a watcher
        self._xid_watcher = replacement
        return ok

    def _gather_device(
        self,
        dev: _Device,
        pid_runs: Mapping[int, tuple[str, str]] | None,
        families: dict[str, Any],
        run_memory: dict[tuple[str, str, str], int | None],
        states: dict[int, str | None],
    ) -> None:
        mem = pynvml.nvmlDeviceGetMemoryInfo(dev.handle)
        used_by_pid: dict[int, int | None] = {}
        for lister in self._listers:
            for pid, current in lister.list(dev.index, dev.handle):
                # a process in both lists is one process; NVML reports the same memory twice
                previous = used_by_pid.get(pid)
                if pid not in used_by_pid or (
                    current is not None and (previous is None or current > previous)
                ):
                    used_by_pid[pid] = current
        labels = [dev.index, dev.uuid]
        families[GPU_INFO.name].add_metric([dev.index, dev.uuid, dev.name, self._driver], 1)
        families[MEMORY_TOTAL.name].add_metric(labels, mem.total)
        families[MEMORY_USED.name].add_metric(labels, mem.used)
        unknown = 0
        attributed = 0
        uninterruptible = 0
        for pid, used in sorted(used_by_pid.items()):
            owner = pid_runs.get(pid) if pid_runs is not None else None
            if owner is not None:
                key = (owner[0], owner[1], dev.index)
                prior = run_memory.get(key, 0)
                run_memory[key] = None if prior is None or used is None else prior + used
            if used is None:
                unknown += 1
                continue
            if pid_runs is not None:
                families[PROCESS_MEMORY.name].add_metric(
                    [*labels, str(pid), owner[0] if owner else ""], used
                )
            if pid not in states:
                states[pid] = procinfo.process_state(pid)
            # a zombie's or a gone process's memory is no live process's: unattributed
            if procinfo.holds_memory(states[pid]):
                attributed += used
                if states[pid] == "D":
                    uninterruptible += used
        families[PROCESSES.name].add_metric(labels, len(used_by_pid))
        families[PROCESSES_UNKNOWN.name].add_metric(labels, unknown)
        watcher = self._xid_watcher
        if watcher is not None and dev.uuid in watcher.supported:
            families[XID_SUPPORTED.name].add_metric(labels, 1 if watcher.supported[dev.uuid] else 0)
        if unknown == 0:
            families[UNATTRIBUTED.name].add_metric(labels, max(mem.used - attributed, 0))
            families[UNINTERRUPTIBLE.name].add_metric(labels, uninterruptible)
