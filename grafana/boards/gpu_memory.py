"""GPU memory: the driver's view (NVML) against the allocator's view (torch) of GPU memory, to
see ghost memory, unattributed memory, fragmentation, retries and OOMs; and the GPUs' Xid
errors."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db

from alerts.thresholds import DEFAULTS, resolve
from grafana.boards import gpu_health
from grafana.panels import (
    IR,
    NONZERO_IS_BAD,
    I,
    Panel,
    bar_gauge,
    by,
    dashboard,
    stat_panel,
    table_panel,
    ts,
)
from grafana.panels import TARGET as T

UID = "trainguard-gpu-memory"

PER_GPU = "{{instance}} GPU {{gpu}}"
PER_RANK = "{{run}} rank {{rank}}"
DRIVER = by("run, rank", "trainguard_run_gpu_memory_used_bytes", "sum")
RESERVED = by("run, rank", "trainguard_run_allocator_reserved_bytes", "sum")
ALLOCATED = by("run, rank", "trainguard_run_allocator_allocated_bytes", "sum")
# The live runs' allocator reserved bytes per GPU, joined by UUID (whatever CUDA_VISIBLE_DEVICES
# made of the device index) and labelled with the GPU's NVML index.
LIVE_RESERVED_PER_GPU = (
    f"sum by ({T}, instance, gpu) (\n"
    f"  trainguard_run_allocator_reserved_bytes{{{IR}}}\n"
    f"  * on ({T}, job, instance, run, rank, device) group_left (uuid)\n"
    f"  trainguard_run_allocator_device_info{{{IR}}}\n"
    f"  * on ({T}, job, instance, uuid) group_left (gpu)\n"
    f"  max by ({T}, job, instance, uuid, gpu) (trainguard_gpu_info{{{I}}})\n"
    f"  and on ({T}, job, instance, run, rank) trainguard_run_process_up{{{IR}}} == 1\n"
    ")"
)


# The alerts' default thresholds, drawn on the panels that show what they judge.
_T = resolve()
LEAK_FLOOR = _T["leak_floor_window"]
LEAK_WINDOW = _T["leak_window"]
LEAK_HORIZON_S = float(_T["leak_horizon_s"])
FRAG_WINDOW = _T["frag_window"]
FRAG_SPLIT = float(DEFAULTS["frag_split_share"])
ALLOC = "trainguard_run_allocator_allocated_bytes"
# What a rank keeps across steps: the minimum of its allocated bytes over a few minutes
# (AllocatorMemoryLeak's floor), per device.
FLOOR = f"min_over_time({ALLOC}{{{IR}}}[{LEAK_FLOOR}])"
# Seconds until the device is full at the floor's pace over the leak window (only where it
# grows): the headroom above the recent peak over that pace, as AllocatorMemoryLeak computes it.
TIME_TO_FULL = (
    f"min by ({T}, run, rank) (\n"
    f"  (trainguard_run_allocator_device_total_bytes{{{IR}}}\n"
    f"   - on ({T}, job, instance, run, rank, device)\n"
    f"     max_over_time({ALLOC}{{{IR}}}[{LEAK_FLOOR}]))\n"
    f"  / on ({T}, job, instance, run, rank, device) (deriv({FLOOR}[{LEAK_WINDOW}:1m]) > 0)\n"
    ")"
)
# AllocatorFragmentation's share: inactive split bytes over the free cache (reserved - allocated)
SPLIT_SHARE = (
    f"max by ({T}, run, rank) (\n"
    f"  avg_over_time(trainguard_run_allocator_inactive_split_bytes{{{IR}}}[{FRAG_WINDOW}])\n"
    f"  / on ({T}, job, instance, run, rank, device) (\n"
    f"    avg_over_time(trainguard_run_allocator_reserved_bytes{{{IR}}}[{FRAG_WINDOW}])\n"
    f"    - on ({T}, job, instance, run, rank, device)\n"
    f"    avg_over_time({ALLOC}{{{IR}}}[{FRAG_WINDOW}])\n"
    "  ) > 0\n"
    ")"
)


def _increase(labels: str, metric: str, window: str) -> str:
    """How much a counter grew per ``labels`` over ``window``."""
    return f"sum by ({T}, {labels}) (increase({metric}{{{IR}}}[{window}]))"


def devices() -> list[Panel]:
    """Each GPU as the driver sees it: used vs total, and memory no live process accounts for."""
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
            [by("instance, gpu, name, uuid, driver_version", "trainguard_gpu_info", "max", I)],
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
            "a process's memory is unknown.",
            "bytes",
            [(f"trainguard_gpu_memory_unattributed_bytes{{{I}}}", PER_GPU)],
            thresholds=((None, "green"), (1024**3, "red")),
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
                (LIVE_RESERVED_PER_GPU, f"{PER_GPU} reserved by live runs"),
            ],
            w=24,
            minimum=0,
            dashed="/reserved by live runs$/",
        ),
    ]


def xids() -> list[Panel]:
    """Critical Xid errors per GPU and code."""
    return [
        table_panel(
            "Xid errors by GPU and code",
            "Critical Xid errors the driver reported per GPU and Xid code, counted since the "
            "exporter started (79: fallen off the bus, 48: double-bit ECC, 94/95: contained / "
            "uncontained ECC, 119: GSP timeout...; the runbook's GPUXidError table says what "
            "each means and which page).",
            [by("instance, gpu, uuid, xid", "trainguard_gpu_xid_errors_total", "max", I)],
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
                    by("instance, gpu, xid", "trainguard_gpu_xid_errors_total", "max", I),
                    f"{PER_GPU} Xid {{{{xid}}}}",
                )
            ],
            minimum=0,
        ),
    ]


def processes() -> list[Panel]:
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
            [by("instance, gpu, pid, run", "trainguard_gpu_process_memory_used_bytes")],
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


def runs() -> list[Panel]:
    """Per run and rank, the driver's bytes against the allocator's: ghost memory,
    fragmentation, retries and OOMs."""
    return [
        ts(
            "Driver vs allocator memory per rank",
            "Per rank: driver view (NVML, summed over the rank's PIDs and GPUs), the "
            "allocator's reserved and allocated bytes (torch.cuda.memory_stats), and "
            "the gap driver - reserved drawn as its own series. The gap is normally the "
            "CUDA context (a few hundred MiB); a gap that grows or stays large is ghost "
            "memory (GPUGhostMemory).",
            "bytes",
            [
                (DRIVER, f"{PER_RANK} driver"),
                (RESERVED, f"{PER_RANK} reserved"),
                (ALLOCATED, f"{PER_RANK} allocated"),
                (f"{DRIVER}\n-\n{RESERVED}", f"{PER_RANK} driver - reserved (ghost gap)"),
            ],
            w=16,
            h=9,
            dashed="/ghost gap/",
            colors={"/ghost gap/": "red"},
        ),
        stat_panel(
            "Ghost-memory gap per run",
            "Driver view minus allocator reserved, summed over the run's ranks, now. Expect "
            "about one CUDA context per rank; far more is memory the allocator does not know "
            "about.",
            "bytes",
            (
                f"{by('run', 'trainguard_run_gpu_memory_used_bytes', 'sum')}\n"
                f"- {by('run', 'trainguard_run_allocator_reserved_bytes', 'sum')}",
                "{{run}}",
            ),
            thresholds=((None, "green"), (2 * 1024**3, "orange"), (4 * 1024**3, "red")),
            w=8,
            h=9,
        ),
        ts(
            "Allocator fragmentation",
            "reserved - allocated: memory the caching allocator holds but no tensor uses; "
            "inactive split: the part of it in split blocks that cannot serve a large request. "
            "High values before an OOM with 'free' VRAM point at fragmentation.",
            "bytes",
            [
                (f"{RESERVED}\n- {ALLOCATED}", f"{PER_RANK} reserved - allocated"),
                (
                    by("run, rank", "trainguard_run_allocator_inactive_split_bytes", "sum"),
                    f"{PER_RANK} inactive split",
                ),
            ],
            minimum=0,
        ),
        ts(
            "Allocated and peak allocated",
            "Bytes held by live tensors and the peak since the process started (or since the "
            "training script last reset the peak).",
            "bytes",
            [
                (ALLOCATED, f"{PER_RANK} allocated"),
                (
                    by("run, rank", "trainguard_run_allocator_max_allocated_bytes", "sum"),
                    f"{PER_RANK} peak",
                ),
            ],
            minimum=0,
        ),
        ts(
            "Allocator retries, OOMs and snapshots",
            "Per interval: cudaMalloc retries (the allocator freed its cache to satisfy a "
            "request: AllocatorRetrying), out-of-memory errors (AllocatorOOM) and memory "
            "snapshots (any reason: oom, periodic, requested).",
            "none",
            [
                (
                    _increase(
                        "run, rank",
                        "trainguard_run_allocator_alloc_retries_total",
                        "$__rate_interval",
                    ),
                    f"{PER_RANK} retries",
                ),
                (
                    _increase(
                        "run, rank", "trainguard_run_allocator_ooms_total", "$__rate_interval"
                    ),
                    f"{PER_RANK} OOMs",
                ),
                (
                    _increase(
                        "run, rank",
                        "trainguard_run_memory_snapshot_dumps_total",
                        "$__rate_interval",
                    ),
                    f"{PER_RANK} snapshots",
                ),
            ],
            bars=True,
            minimum=0,
        ),
        stat_panel(
            "OOMs in time range",
            "Out-of-memory errors per run over the dashboard's time range.",
            "none",
            (_increase("run", "trainguard_run_allocator_ooms_total", "$__range"), "{{run}}"),
            thresholds=NONZERO_IS_BAD,
            h=8,
        ),
        stat_panel(
            "Alloc retries in time range",
            "cudaMalloc retries per run over the dashboard's time range.",
            "none",
            (
                _increase("run", "trainguard_run_allocator_alloc_retries_total", "$__range"),
                "{{run}}",
            ),
            thresholds=((None, "green"), (1, "orange")),
            h=8,
        ),
        ts(
            "Memory kept across steps (leak check)",
            f"Per rank: the minimum of allocated bytes over {LEAK_FLOOR} (what the rank keeps "
            "across steps; activations and temporaries inside a step do not raise it) against "
            "the device's size (dashed). A floor that keeps climbing after the warm-up is a "
            "leak: AllocatorMemoryLeak.",
            "bytes",
            [
                (f"sum by ({T}, run, rank) ({FLOOR})", f"{PER_RANK} kept across steps"),
                (
                    by("run, rank", "trainguard_run_allocator_device_total_bytes", "sum"),
                    f"{PER_RANK} device size",
                ),
            ],
            w=16,
            minimum=0,
            dashed="/device size/",
        ),
        stat_panel(
            "Time until full at the current leak pace",
            "Per rank: the headroom above the recent peak of allocated memory divided by how "
            f"fast the floor grows over {LEAK_WINDOW}; only ranks whose floor grows. Red below "
            f"AllocatorMemoryLeak's default horizon ({_T['leak_horizon']}; the alert also needs "
            "a steady climb past the warm-up).",
            "s",
            (TIME_TO_FULL, PER_RANK),
            thresholds=((None, "red"), (LEAK_HORIZON_S, "orange"), (4 * LEAK_HORIZON_S, "green")),
            w=8,
            h=8,
        ),
        ts(
            "Free cache in split blocks (fragmentation)",
            "Per rank: inactive split bytes as a share of the allocator's free cache (reserved "
            f"- allocated), averaged over {FRAG_WINDOW}. AllocatorFragmentation fires above "
            f"{FRAG_SPLIT:g} (orange) while cudaMalloc retries and the free cache is large "
            f"(above {DEFAULTS['frag_free_ratio']} of reserved and {DEFAULTS['frag_free_floor']}).",
            "percentunit",
            [(SPLIT_SHARE, f"{PER_RANK} split share of free cache")],
            thresholds=((None, "green"), (FRAG_SPLIT, "orange")),
            w=24,
            minimum=0,
        ),
        table_panel(
            "Newest memory snapshots",
            "Each rank's newest memory snapshots (oom, periodic, requested) as its reporter "
            "last listed them: the file in the state directory (a .json of metadata beside "
            "it), the step and when it was written. Open a snapshot at "
            "https://pytorch.org/memory_viz; ask a live run for one with trainguard snapshot "
            "RUN. Needs trainguard.Run(..., oom_snapshots=True).",
            [f"trainguard_run_memory_snapshot_timestamp_seconds{{{IR}}} * 1000"],
            columns={
                "run": ("Run", ""),
                "rank": ("Rank", ""),
                "reason": ("Reason", ""),
                "step": ("Step", ""),
                "file": ("File", ""),
                "Value": ("Written", "dateTimeAsIso"),
            },
            hide=("instance",),
            h=8,
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


def build() -> db.Dashboard:
    """The dashboard."""
    return dashboard(
        UID,
        "GPU memory",
        "Driver view (NVML) vs the allocator's view (torch) of GPU memory: ghost memory, "
        "unattributed memory, fragmentation, retries and OOMs; the GPUs' Xid errors.",
        [
            ("Devices", devices()),
            ("GPU errors (Xid)", xids()),
            ("GPU health: clocks, PCIe link, power, ECC", gpu_health.panels()),
            ("Processes (driver view)", processes()),
            ("Runs: driver vs allocator", runs()),
            ("Host processes", host_processes()),
        ],
    )
