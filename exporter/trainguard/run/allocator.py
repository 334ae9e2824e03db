"""The CUDA caching allocator's own view of this process's GPU memory, read from
``torch.cuda.memory_stats`` without ever importing torch or initialising CUDA."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

from trainguard.shared.heartbeat import MAX_DEVICES, MAX_INT, AllocatorStats


def allocator_stats(device: int, stats: Mapping[str, Any]) -> AllocatorStats:
    """The heartbeat's view of one device from ``torch.cuda.memory_stats(device)`` keys."""

    def get(key: str) -> int:
        value = stats.get(key, 0)
        return max(0, min(int(value), MAX_INT))

    return AllocatorStats(
        device=device,
        allocated_bytes=get("allocated_bytes.all.current"),
        reserved_bytes=get("reserved_bytes.all.current"),
        max_allocated_bytes=get("allocated_bytes.all.peak"),
        inactive_split_bytes=get("inactive_split_bytes.all.current"),
        alloc_retries=get("num_alloc_retries"),
        ooms=get("num_ooms"),
    )


def read_allocator(warn: Callable[[str, str, Any], None]) -> tuple[AllocatorStats, ...]:
    """torch.cuda.memory_stats per device this process used; () when the script has not
    imported torch or initialised CUDA (memory_stats returns {} until it did). A failure is
    reported once through ``warn(key, message, arg)`` and reads as ()."""
    torch = sys.modules.get("torch")
    if torch is None:
        return ()
    try:
        cuda = torch.cuda
        if not cuda.is_initialized():
            return ()
        out = []
        for device in range(min(cuda.device_count(), 1024)):
            stats = cuda.memory_stats(device)
            if not stats:
                continue
            reserved = int(stats.get("reserved_bytes.all.current", 0))
            peak = int(stats.get("allocated_bytes.all.peak", 0))
            if reserved == 0 and peak == 0:
                continue  # a device this process never allocated on
            out.append(allocator_stats(device, stats))
        return tuple(out[:MAX_DEVICES])
    except Exception as exc:
        warn("allocator", "trainguard: allocator stats unavailable: %r", exc)
        return ()
