"""Critical Xid errors read from NVML's event API on a thread, counted per GPU and Xid code.

Critical Xid errors include a GPU fallen off the bus, a double-bit ECC error, a GSP timeout.

Why a thread and not a zero-timeout read at scrape time: NVML keeps only the most recent Xid
code, so every event still queued when the set is read reports that code ("If there are
multiple xid errors generated before nvmlEventSetWait is invoked then the last seen xid error
type is returned for all xid error events"). An Xid 48 followed by a routine Xid 45 before the
next scrape would read as two 45s. A thread that always waits reads each event as it comes.

The watcher holds its own NVML reference (``nvmlInit`` is reference-counted), so its event set
stays registered while the GPU collector shuts NVML down and starts it afresh after a device
error; a scrape never waits for it. It is replaced when a GPU appears that it does not watch,
or when its wait fails.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pynvml

log = logging.getLogger(__name__)

#: how long one wait for an event lasts; a stopped watcher exits within this
WAIT_MS = 1000
#: distinct Xid codes counted per GPU; further ones are counted as xid="other"
MAX_CODES_PER_GPU = 32
OTHER = "other"
#: errors meaning "this driver or GPU offers no such events", not a failure
_UNSUPPORTED = (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound)


@dataclass(frozen=True)
class XidDevice:
    """A GPU as the collector labels it."""

    index: str
    uuid: str
    handle: Any


def _address(pointer: Any) -> int | None:
    """The address an NVML device handle points at: what identifies the device of an event."""
    try:
        return ctypes.cast(pointer, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return None


class XidCounts:
    """Xid events per (GPU index, uuid, code) since the exporter started.

    Shared by the watchers (one after another) and the scrapes.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str, str], int] = {}
        self._codes: dict[tuple[str, str], set[str]] = {}

    def add(self, index: str, uuid: str, code: int) -> None:
        xid = str(code)
        with self._lock:
            codes = self._codes.setdefault((index, uuid), set())
            if xid not in codes and len(codes) >= MAX_CODES_PER_GPU:
                xid = OTHER
            codes.add(xid)
            key = (index, uuid, xid)
            count = self._counts[key] = self._counts.get(key, 0) + 1
        if count == 1:
            log.warning(
                "GPU %s (%s): Xid %s: the driver reported a critical error (counted in "
                "trainguard_gpu_xid_errors_total; later ones of this code are logged at debug)",
                index or "?",
                uuid or "uuid unknown",
                code,
            )
        else:
            log.debug("GPU %s (%s): Xid %s (%d since start)", index, uuid, code, count)

    def items(self) -> list[tuple[tuple[str, str, str], int]]:
        with self._lock:
            return sorted(self._counts.items())


class XidWatcher:
    """One NVML session and event set watching the given GPUs for critical Xid events.

    With it goes the daemon thread that waits on it. :meth:`start` registers synchronously (so the
    scrape that starts it knows which GPUs are watched) and raises ``pynvml.NVMLError`` for a
    failure other than "not supported".
    """

    def __init__(self, counts: XidCounts) -> None:
        self._counts = counts
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._by_address: dict[int, XidDevice] = {}
        #: uuid -> whether its Xid events are watched (False: the driver offers none)
        self.supported: dict[str, bool] = {}
        self.error: str | None = None  # why the wait failed, once it has

    def start(self, devices: Iterable[XidDevice]) -> None:
        devices = tuple(devices)
        pynvml.nvmlInit()  # our own reference: the collector may shut its own down
        event_set = None
        running = False
        try:
            try:
                event_set = pynvml.nvmlEventSetCreate()
            except _UNSUPPORTED:
                self.supported = {d.uuid: False for d in devices}
                return
            for dev in devices:
                self.supported[dev.uuid] = self._register(dev, event_set)
            if any(self.supported.values()):
                self._thread = threading.Thread(
                    target=self._run, args=(event_set,), name="trainguard-gpu-xid", daemon=True
                )
                self._thread.start()
                running = True
        finally:
            if not running:
                _release(event_set)

    def _register(self, dev: XidDevice, event_set: Any) -> bool:
        xid = pynvml.nvmlEventTypeXidCriticalError
        try:
            if not pynvml.nvmlDeviceGetSupportedEventTypes(dev.handle) & xid:
                return False
            pynvml.nvmlDeviceRegisterEvents(dev.handle, xid, event_set)
        except _UNSUPPORTED:
            return False
        address = _address(dev.handle)
        if address is not None:
            self._by_address[address] = dev
        return True

    def covers(self, uuids: Iterable[str]) -> bool:
        """Whether every one of these GPUs has been looked at (watched or unsupported)."""
        return all(uuid in self.supported for uuid in uuids)

    @property
    def alive(self) -> bool:
        """Still able to deliver events (or never needed to: no GPU offers them)."""
        return self.error is None and (self._thread is None or self._thread.is_alive())

    def stop(self) -> None:
        """Ask the thread to end; never waits.

        The thread frees the set and its NVML reference within WAIT_MS (or when a hung driver
        call returns).
        """
        self._stop.set()

    def _run(self, event_set: Any) -> None:
        try:
            while not self._stop.is_set():
                try:
                    data = pynvml.nvmlEventSetWait_v2(event_set, WAIT_MS)
                except pynvml.NVMLError_Timeout:
                    continue
                except pynvml.NVMLError as exc:
                    self.error = f"waiting for Xid events failed: {exc}"
                    return
                if data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                    self._count(data)
        except Exception as exc:  # a bug here must not go unnoticed, nor kill the exporter
            log.debug("Xid watcher failed", exc_info=True)
            self.error = f"Xid watcher failed: {type(exc).__name__}: {exc}"
        finally:
            _release(event_set)

    def _count(self, data: Any) -> None:
        address = _address(data.device)
        dev = self._by_address.get(address) if address is not None else None
        # an event whose device we cannot name is still counted: losing it is worse
        index, uuid = (dev.index, dev.uuid) if dev is not None else ("", "")
        self._counts.add(index, uuid, int(data.eventData))


def _release(event_set: Any) -> None:
    """Free the set (if any) and give back the NVML reference taken for it."""
    if event_set is not None:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlEventSetFree(event_set)
    with contextlib.suppress(pynvml.NVMLError):
        pynvml.nvmlShutdown()
