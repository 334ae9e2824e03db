"""The CUDA caching allocator's own view of this process's GPU memory, and each device's GPU.

The view is read from ``torch.cuda.memory_stats`` without ever importing torch or initialising
CUDA. Each device's GPU UUID (``torch.cuda.get_device_properties(i).uuid``) lets the exporter
put the allocator's bytes next to the driver's view of the same GPU, and the device's size
(``.total_memory``) is what the leak warning compares the allocator's growth with.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from trainguard.shared.gpu_uuid import normalize_gpu_uuid
from trainguard.shared.heartbeat.record import MAX_DEVICES, MAX_INT, AllocatorStats


class DeviceFacts(NamedTuple):
    """What does not change about a CUDA device in a process (None: unknown)."""

    uuid: str | None
    total_bytes: int | None
    name: str | None = None  # "NVIDIA H100 80GB HBM3", for snapshot metadata


#: device index -> its facts, asked once per device and process
DeviceUuids = dict[int, DeviceFacts]


def allocator_stats(
    device: int, stats: Mapping[str, Any], uuid: str | None = None, total: int | None = None
) -> AllocatorStats:
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
        uuid=uuid,
        total_bytes=total,
    )


def device_facts(
    cuda: Any, device: int, known: DeviceUuids, warn: Callable[[str, str, Any], None]
) -> DeviceFacts:
    """The GPU UUID and size (a MIG slice's own) of CUDA device ``device``.

    Asked once per device (``known`` keeps them). Only called once CUDA is initialised:
    get_device_properties would initialise it.
    """
    if device not in known:
        uuid: str | None = None
        total: int | None = None
        try:
            props = cuda.get_device_properties(device)
        except Exception as exc:  # a failing driver call
            warn("uuid", "trainguard: GPU UUID of a CUDA device unavailable: %s", repr(exc))
            known[device] = DeviceFacts(None, None)
            return known[device]
        name = getattr(props, "name", None)
        name = name[:200] if isinstance(name, str) and name.isprintable() else None
        try:
            uuid = normalize_gpu_uuid(props.uuid)
            problem = None if uuid is not None else "not a GPU UUID (a MIG instance, or ROCm?)"
        except Exception as exc:  # too old a torch for .uuid
            problem = repr(exc)
        if problem is not None:
            warn("uuid", "trainguard: GPU UUID of a CUDA device unavailable: %s", problem)
        value = getattr(props, "total_memory", None)
        if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_INT:
            total = value
        else:
            warn("total", "trainguard: size of a CUDA device unknown: %r", value)
        known[device] = DeviceFacts(uuid, total, name)
    return known[device]


def read_allocator(
    warn: Callable[[str, str, Any], None], uuids: DeviceUuids | None = None
) -> tuple[AllocatorStats, ...]:
    """Read torch.cuda.memory_stats for each device this process used.

    Returns () when the script has not imported torch or initialised CUDA (memory_stats returns
    {} until it did). ``uuids`` keeps each device's GPU UUID and size between calls. A failure
    is reported once through ``warn(key, message, arg)`` and reads as ().
    """
    known: DeviceUuids = {} if uuids is None else uuids
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
            facts = device_facts(cuda, device, known, warn)
            out.append(allocator_stats(device, stats, facts.uuid, facts.total_bytes))
        return tuple(out[:MAX_DEVICES])
    except Exception as exc:
        warn("allocator", "trainguard: allocator stats unavailable: %r", exc)
        return ()


def snapshot_devices(warn: Callable[..., None], uuids: DeviceUuids) -> list[dict[str, Any]]:
    """The allocator's view of each device, with its GPU's name, UUID and size.

    It is what a memory snapshot's metadata records of the devices.
    """
    out = []
    for a in read_allocator(warn, uuids):
        facts = uuids.get(a.device)
        out.append({**a.to_dict(), "name": None if facts is None else facts.name})
    return out
