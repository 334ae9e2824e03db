"""The processes NVML lists on a GPU, in one NVML call per list and scrape.

Why not pynvml's ``nvmlDeviceGet*RunningProcesses``: it asks NVML twice at every call, first
for the count (with no buffer), then for the list in a buffer it allocates, and turns every
entry into a Python object attribute by attribute. NVML fills a buffer that is large enough
at the first call, so :class:`ProcessLister` keeps each device's buffer from the last scrape
and asks once; only when the list has outgrown it (NVML answers "insufficient size" with the
count it needs) does it ask again with a larger one. At 64 GPUs that is 128 NVML calls a
scrape fewer, and with the test NVML library, which re-reads its state file at every call,
the larger part of the GPU collector's cost.
"""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml

COMPUTE = "nvmlDeviceGetComputeRunningProcesses_v3"
GRAPHICS = "nvmlDeviceGetGraphicsRunningProcesses_v3"
#: entries a device's first buffer holds; a longer list grows it (to twice the count, plus 5,
#: as pynvml does, so a few new processes don't make the next scrape ask twice again)
FIRST_CAPACITY = 32
#: NVML asked again at most this many times in one call when processes keep appearing
MAX_RETRIES = 3
_NOT_AVAILABLE = ctypes.c_ulonglong(-1).value


class _ProcessInfo(ctypes.Structure):
    """``nvmlProcessInfo_v2_t`` (which the ``_v3`` functions fill) as a plain ctypes structure.

    It has pynvml's own fields, but is not pynvml's class, which intercepts every attribute
    read.
    """

    _fields_ = pynvml.c_nvmlProcessInfo_v3_t._fields_


class ProcessLister:
    """One NVML process list (compute or graphics) of every device.

    The buffers are kept between scrapes. Not thread-safe: the GPU collector calls it under its
    lock.
    """

    def __init__(self, symbol: str) -> None:
        self._symbol = symbol
        self._buffers: dict[str, Any] = {}  # device index -> the ctypes array of last time

    def list(self, device: str, handle: Any) -> list[tuple[int, int | None]]:
        """(pid, used bytes or None when the driver does not know) per process, in NVML's order.

        Raises ``pynvml.NVMLError`` as pynvml's functions do.
        """
        # pynvml's own look-up: the symbol resolved once from the library it loaded
        fn = pynvml._nvmlGetFunctionPointer(self._symbol)
        buffer = self._buffers.get(device)
        if buffer is None:
            buffer = (_ProcessInfo * FIRST_CAPACITY)()
        count = ctypes.c_uint(len(buffer))
        for _ in range(MAX_RETRIES):
            ret = fn(handle, ctypes.byref(count), buffer)
            if ret != pynvml.NVML_ERROR_INSUFFICIENT_SIZE:
                break
            buffer = (_ProcessInfo * (count.value * 2 + 5))()
            count.value = len(buffer)
        if ret != pynvml.NVML_SUCCESS:
            raise pynvml.NVMLError(ret)
        self._buffers[device] = buffer
        out: list[tuple[int, int | None]] = []
        for entry in buffer[: count.value]:
            used = entry.usedGpuMemory
            out.append((entry.pid, None if used == _NOT_AVAILABLE else used))
        return out

    def forget(self) -> None:
        """Drop the buffers (NVML restarted: the devices may have changed)."""
        self._buffers.clear()
