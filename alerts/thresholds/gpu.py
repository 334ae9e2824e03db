"""Thresholds of the GPU alerts (``alerts/rules/gpu.py``).

They tune the alerts on ghost and unattributed memory, duplicate host processes and Xid errors.
"""

from __future__ import annotations

from alerts.kinds import BYTES, DURATION, NUMBER, XIDS
from alerts.thresholds.threshold import Threshold

THRESHOLDS: tuple[Threshold, ...] = (
    Threshold(
        "ghost_ratio",
        1.5,
        NUMBER,
        "GPUGhostMemory: driver-view VRAM of a run's rank above this many times its allocator "
        "reserved memory...",
    ),
    Threshold(
        "ghost_floor",
        "2GiB",
        BYTES,
        "GPUGhostMemory: ...and above it by at least this much (robust to the CUDA context's "
        "fixed ~300-600 MiB).",
    ),
    Threshold(
        "ghost_window",
        "5m",
        DURATION,
        "GPUGhostMemory: both conditions must hold for the whole of this window...",
    ),
    Threshold(
        "ghost_for",
        "10m",
        DURATION,
        "GPUGhostMemory: ...and then for this long before the alert fires.",
    ),
    Threshold(
        "ghost_context_allowance",
        "600MiB",
        BYTES,
        "GPUGhostMemory per GPU (where NVML cannot attribute memory to processes: WDDM/WSL): "
        "device memory each live process is allowed beyond its allocator's reserved bytes (its "
        "CUDA context, cuBLAS/cuDNN workspaces)...",
    ),
    Threshold(
        "ghost_device_floor",
        "3GiB",
        BYTES,
        "GPUGhostMemory per GPU: ...and the device's used memory must exceed that by this much "
        "(and by ghost_ratio), for ghost_window and ghost_for. Above the per-rank ghost_floor: "
        "on a desktop the display and other applications use the GPU too.",
    ),
    Threshold(
        "unattributed_floor",
        "1GiB",
        BYTES,
        "GPUUnattributedMemory: device VRAM used that no live process accounts for, above this.",
    ),
    Threshold(
        "unattributed_for",
        "15m",
        DURATION,
        "GPUUnattributedMemory: how long the unattributed memory must stay before the alert fires.",
    ),
    Threshold(
        "duplicate_process_for",
        "5m",
        DURATION,
        "DuplicateHostProcess: more than one instance of a configured host process for this long.",
    ),
    Threshold(
        "xid_critical",
        "48,62,64,74,79,95,119,120,140,154",
        XIDS,
        "GPUXidError (critical): Xid codes after which the GPU needs a reset, a reboot or "
        "service before it can train again (fallen off the bus, uncontained ECC, GSP, "
        "NVLink...; the table is in the runbook).",
    ),
    Threshold(
        "xid_warning",
        "13,31,43,61,63,69,92,94,109",
        XIDS,
        "GPUXidError (warning): Xid codes that killed or hurt the application but leave the GPU "
        "usable (a contained ECC error, a page fault, a retired page...). A code in both lists "
        "is critical; codes in neither (45, a follow-up of others) do not alert.",
    ),
    Threshold(
        "xid_window",
        "1h",
        DURATION,
        "GPUXidError: an Xid counted within this window fires at once and resolves when the "
        "window holds no new one.",
    ),
)
