"""GPU memory panels: the driver's view (NVML) against the allocator's view (torch).

They show ghost memory, unattributed memory, fragmentation, retries and OOMs; and the GPUs' Xid
errors.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db

from alerts.site import Site
from grafana.boards import gpu_allocator, gpu_health
from grafana.dashboard import dashboard
from grafana.panels import Panel, bar_gauge, table_panel, ts
from grafana.promql import IR, I, Promql

UID = "trainguard-gpu-memory"

PER_GPU = "{{instance}} GPU {{gpu}}"


def live_reserved_per_gpu(q: Promql) -> str:
    """The live runs' allocator reserved bytes per GPU.

    Joined by UUID (whatever CUDA_VISIBLE_DEVICES made of the device index) and labelled with
    the GPU's NVML index.
    """
    return (
        f"sum {q.group_by('instance, gpu')} (\n"
        f"  trainguard_run_allocator_reserved_bytes{{{IR}}}\n"
        f"  * {q.join_on('job, instance, run, rank, device')} group_left (uuid)\n"
        f"  trainguard_run_allocator_device_info{{{IR}}}\n"
        f"  * {q.join_on('job, instance, uuid')} group_left (gpu)\n"
        f"  max {q.group_by('job, instance, uuid, gpu')} (trainguard_gpu_info{{{I}}})\n"
        f"  and {q.join_on('job, instance, run, rank')} trainguard_run_process_up{{{IR}}} == 1\n"
        ")"
    )


def devices(q: Promql) -> list[Panel]:
    """Each GPU as the driver sees it: used vs total, and memory no live process accounts for.

    The unattributed memory panel turns red at the site's GPUUnattributedMemory floor.
    """
    unattributed_floor = q.site.bytes("unattributed_floor")
    return [
        ts(
            "Device memory used vs total",
            "Memory in use on each GPU as the driver (NVML) reports it, against the device "
            "total (dashed).",
            "bytes",
            [
                (f"trainguard_gpu_memory_used_bytes{{{I}}}", f"{PER_GPU} used"),
                (f"trainguard_gpu_memory_total_bytes{{{I}}}", f"{PER_GPU} total"),
            ],
            minimum=0,
            dashed="/ total$/",
        ),
        bar_gauge(
            "Device memory used (fraction)",
            "Used / total per GPU, now (driver view).",
            "percentunit",
            (
                f"trainguard_gpu_memory_used_bytes{{{I}}}\n"
                f"/ trainguard_gpu_memory_total_bytes{{{I}}}",
                PER_GPU,
            ),
            minimum=0,
            maximum=1,
            thresholds=((None, "green"), (0.85, "orange"), (0.95, "red")),
        ),
        table_panel(
            "GPUs",
            "The GPUs each exporter sees: index, model, UUID and driver version.",
            [q.by("instance, gpu, name, uuid, driver_version", "trainguard_gpu_info", "max", I)],
            columns={
                "instance": ("Exporter", ""),
                "gpu": ("GPU", ""),
                "name": ("Model", ""),
                "uuid": ("UUID", ""),
                "driver_version": ("Driver", ""),
            },
            hide=("Value",),
            w=6,
        ),
        ts(
            "Unattributed device memory",
            "Device memory in use that no live process accounts for (device used minus the sum "
            "of live processes' memory). A few hundred MiB per GPU is driver overhead; more, "
            "sustained, is memory held after a crash (GPUUnattributedMemory). No value while "
            "a process's memory is unknown. Dashed: memory held by processes in uninterruptible "
            "sleep (D state, waiting on the driver or a filesystem): after the run's death, "
            "GPUMemoryNotReleased counts it as not given back.",
            "bytes",
            [
                (f"trainguard_gpu_memory_unattributed_bytes{{{I}}}", PER_GPU),
                (
                    f"trainguard_gpu_memory_uninterruptible_bytes{{{I}}}",
                    f"{PER_GPU} in D state",
                ),
            ],
            dashed="/D state$/",
            thresholds=((None, "green"), (unattributed_floor, "red")),
            minimum=0,
        ),
        ts(
            "Processes with unknown memory",
            "GPU processes NVML lists, and those whose memory it cannot report (Windows, WDDM). "
            "The unknown ones are counted here instead of being published as 0 bytes; while "
            "there are any, the GPU's unattributed memory is unknown and left out. Inside WSL "
            "NVML lists no process at all (listed 0 while a run trains there).",
            "none",
            [
                (f"trainguard_gpu_processes{{{I}}}", f"{PER_GPU} listed"),
                (f"trainguard_gpu_processes_memory_unknown{{{I}}}", f"{PER_GPU} memory unknown"),
            ],
            thresholds=((None, "green"), (1, "orange")),
            minimum=0,
        ),
        ts(
            "Device memory vs live runs' allocator",
            "Per GPU: memory in use as the driver reports it, against what the allocators of "
            "the live runs on that GPU have reserved (joined by GPU UUID). The gap is the CUDA "
            "contexts (a few hundred MiB per process), the display and other applications; a "
            "gap that grows with each crash is ghost memory. Where NVML cannot attribute memory "
            "to processes (Windows, WSL) this is how GPUGhostMemory judges a GPU.",
            "bytes",
            [
                (f"trainguard_gpu_memory_used_bytes{{{I}}}", f"{PER_GPU} used"),
                (live_reserved_per_gpu(q), f"{PER_GPU} reserved by live runs"),
            ],
            w=24,
            minimum=0,
            dashed="/reserved by live runs$/",
        ),
    ]


def xids(q: Promql) -> list[Panel]:
    """Critical Xid errors per GPU and code."""
    return [
        table_panel(
            "Xid errors by GPU and code",
            "Critical Xid errors the driver reported per GPU and Xid code, counted since the "
            "exporter started (79: fallen off the bus, 48: double-bit ECC, 94/95: contained / "
            "uncontained ECC, 119: GSP timeout...; the runbook's GPUXidError table says what "
            "each means and which page).",
            [q.by("instance, gpu, uuid, xid", "trainguard_gpu_xid_errors_total", "max", I)],
            columns={
                "instance": ("Exporter", ""),
                "gpu": ("GPU", ""),
                "uuid": ("UUID", ""),
                "xid": ("Xid", ""),
                "Value": ("Count since exporter start", "none"),
            },
            w=12,
        ),
        ts(
            "Xid errors over time",
            "Count of each Xid code per GPU since the exporter started: a step is a new error. "
            "A GPU whose driver offers no Xid events (Windows/WSL) has no series here.",
            "none",
            [
                (
                    q.by("instance, gpu, xid", "trainguard_gpu_xid_errors_total", "max", I),
                    f"{PER_GPU} Xid {{{{xid}}}}",
                )
            ],
            minimum=0,
        ),
    ]


def processes(q: Promql) -> list[Panel]:
    """Memory per GPU process, as the driver attributes it."""
    return [
        ts(
            "Driver memory per process",
            "GPU memory per process as the driver reports it, stacked per exporter. run is "
            "empty for processes that are not a known training run.",
            "bytes",
            [
                (
                    f"trainguard_gpu_process_memory_used_bytes{{{IR}}}",
                    f"{PER_GPU} pid {{{{pid}}}} {{{{run}}}}",
                )
            ],
            stacked=True,
            minimum=0,
        ),
        table_panel(
            "GPU processes now",
            "Processes holding GPU memory now, per GPU, largest first.",
            [q.by("instance, gpu, pid, run", "trainguard_gpu_process_memory_used_bytes")],
            columns={
                "instance": ("Exporter", ""),
                "gpu": ("GPU", ""),
                "pid": ("PID", ""),
                "run": ("Run", ""),
                "Value": ("Driver memory", "bytes"),
            },
            w=12,
        ),
    ]


def host_processes() -> list[Panel]:
    """Host processes per configured name pattern (two where there should be one)."""
    return [
        ts(
            "Host process counts",
            "Number of processes matching each configured name pattern (process_counts in the "
            "config file), e.g. the WSL VM host process. Two where there should be one is the "
            "DuplicateHostProcess alert.",
            "none",
            [(f"trainguard_process_count{{{I}}}", "{{instance}} {{name}}")],
            w=24,
            minimum=0,
        ),
    ]


def build(site: Site) -> db.Dashboard:
    """The dashboard for the site's thresholds and target labels."""
    q = Promql(site)
    return dashboard(
        UID,
        "GPU memory",
        "Driver view (NVML) vs the allocator's view (torch) of GPU memory: ghost memory, "
        "unattributed memory, fragmentation, retries and OOMs; the GPUs' Xid errors.",
        [
            ("Devices", devices(q)),
            ("GPU errors (Xid)", xids(q)),
            ("GPU health: clocks, PCIe link, power, ECC", gpu_health.panels(q)),
            ("Processes (driver view)", processes(q)),
            ("Runs: driver vs allocator", gpu_allocator.runs(q)),
            ("Host processes", host_processes()),
        ],
    )
