"""The GPU memory dashboard's row "Runs: driver vs allocator", per run and rank.

The driver's view of GPU memory against the allocator's (torch), with the thresholds of
GPUGhostMemory, AllocatorMemoryLeak and AllocatorFragmentation drawn where a panel shows what
they judge. A module of its own because the row is half of the dashboard
(:mod:`grafana.boards.gpu_memory`, which places it).
"""

from __future__ import annotations

from alerts.site import Site
from grafana.panels import NONZERO_IS_BAD, Panel, stat_panel, table_panel, ts
from grafana.promql import IR, Promql

PER_RANK = "{{run}} rank {{rank}}"
ALLOC = "trainguard_run_allocator_allocated_bytes"


def floor(site: Site) -> str:
    """What a rank keeps across steps, per device: AllocatorMemoryLeak's floor.

    The minimum of its allocated bytes over the site's ``leak_floor_window`` (a few minutes):
    activations and temporaries inside a step do not raise it.
    """
    return f"min_over_time({ALLOC}{{{IR}}}[{site.duration('leak_floor_window')}])"


def time_to_full(q: Promql) -> str:
    """Seconds until the device is full at the floor's pace, as AllocatorMemoryLeak computes it.

    The headroom above the recent peak over the floor's pace over the site's ``leak_window``;
    only where the floor grows.
    """
    site = q.site
    device = q.join_on("job, instance, run, rank, device")
    return (
        f"min {q.group_by('run, rank')} (\n"
        f"  (trainguard_run_allocator_device_total_bytes{{{IR}}}\n"
        f"   - {device}\n"
        f"     max_over_time({ALLOC}{{{IR}}}[{site.duration('leak_floor_window')}]))\n"
        f"  / {device} (deriv({floor(site)}[{site.duration('leak_window')}:1m]) > 0)\n"
        ")"
    )


def split_share(q: Promql) -> str:
    """AllocatorFragmentation's share: inactive split bytes over the free cache.

    The free cache is reserved - allocated; both averaged over the site's ``frag_window``.
    """
    window = q.site.duration("frag_window")
    device = q.join_on("job, instance, run, rank, device")
    return (
        f"max {q.group_by('run, rank')} (\n"
        f"  avg_over_time(trainguard_run_allocator_inactive_split_bytes{{{IR}}}[{window}])\n"
        f"  / {device} (\n"
        f"    avg_over_time(trainguard_run_allocator_reserved_bytes{{{IR}}}[{window}])\n"
        f"    - {device}\n"
        f"    avg_over_time({ALLOC}{{{IR}}}[{window}])\n"
        "  ) > 0\n"
        ")"
    )


def increase(q: Promql, labels: str, metric: str, window: str) -> str:
    """How much a counter grew per ``labels`` over ``window``."""
    return f"sum {q.group_by(labels)} (increase({metric}{{{IR}}}[{window}]))"


def runs(q: Promql) -> list[Panel]:
    """Per run and rank, the driver's bytes against the allocator's.

    Ghost memory, fragmentation, retries and OOMs, with the site's thresholds drawn and named.
    """
    site = q.site
    driver = q.by("run, rank", "trainguard_run_gpu_memory_used_bytes", "sum")
    reserved = q.by("run, rank", "trainguard_run_allocator_reserved_bytes", "sum")
    allocated = q.by("run, rank", ALLOC, "sum")
    ghost_floor = site.bytes("ghost_floor")
    leak_floor, leak_window = site.duration("leak_floor_window"), site.duration("leak_window")
    leak_horizon_s = float(site.seconds("leak_horizon"))
    frag_window, frag_split = site.duration("frag_window"), site.number("frag_split_share")
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
                (driver, f"{PER_RANK} driver"),
                (reserved, f"{PER_RANK} reserved"),
                (allocated, f"{PER_RANK} allocated"),
                (f"{driver}\n-\n{reserved}", f"{PER_RANK} driver - reserved (ghost gap)"),
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
                f"{q.by('run', 'trainguard_run_gpu_memory_used_bytes', 'sum')}\n"
                f"- {q.by('run', 'trainguard_run_allocator_reserved_bytes', 'sum')}",
                "{{run}}",
            ),
            # orange from GPUGhostMemory's floor (per rank), red from twice that
            thresholds=((None, "green"), (ghost_floor, "orange"), (2 * ghost_floor, "red")),
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
                (f"{reserved}\n- {allocated}", f"{PER_RANK} reserved - allocated"),
                (
                    q.by("run, rank", "trainguard_run_allocator_inactive_split_bytes", "sum"),
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
                (allocated, f"{PER_RANK} allocated"),
                (
                    q.by("run, rank", "trainguard_run_allocator_max_allocated_bytes", "sum"),
                    f"{PER_RANK} peak",
                ),
            ],
            minimum=0,
        ),
        ts(
            "Allocator retries, OOMs and snapshots",
            "Per interval: cudaMalloc retries (the allocator freed its cache to satisfy a "
            "request: AllocatorRetrying), out-of-memory errors (AllocatorOOM) and memory "
            "snapshots (any reason: oom, periodic, requested; OOM snapshots alone, dumped by "
            "run.capture_oom(), also count as an OOM for AllocatorOOM).",
            "none",
            [
                (
                    increase(
                        q,
                        "run, rank",
                        "trainguard_run_allocator_alloc_retries_total",
                        "$__rate_interval",
                    ),
                    f"{PER_RANK} retries",
                ),
                (
                    increase(
                        q, "run, rank", "trainguard_run_allocator_ooms_total", "$__rate_interval"
                    ),
                    f"{PER_RANK} OOMs",
                ),
                (
                    increase(
                        q,
                        "run, rank",
                        "trainguard_run_memory_snapshot_dumps_total",
                        "$__rate_interval",
                    ),
                    f"{PER_RANK} snapshots",
                ),
                (
                    increase(
                        q, "run, rank", "trainguard_run_memory_snapshots_total", "$__rate_interval"
                    ),
                    f"{PER_RANK} OOM snapshots",
                ),
            ],
            bars=True,
            minimum=0,
        ),
        stat_panel(
            "OOMs in time range",
            "Out-of-memory errors per run over the dashboard's time range.",
            "none",
            (increase(q, "run", "trainguard_run_allocator_ooms_total", "$__range"), "{{run}}"),
            thresholds=NONZERO_IS_BAD,
            h=8,
        ),
        stat_panel(
            "Alloc retries in time range",
            "cudaMalloc retries per run over the dashboard's time range.",
            "none",
            (
                increase(q, "run", "trainguard_run_allocator_alloc_retries_total", "$__range"),
                "{{run}}",
            ),
            thresholds=((None, "green"), (1, "orange")),
            h=8,
        ),
        ts(
            "Memory kept across steps (leak check)",
            f"Per rank: the minimum of allocated bytes over {leak_floor} (what the rank keeps "
            "across steps; activations and temporaries inside a step do not raise it) against "
            "the device's size (dashed). A floor that keeps climbing after the warm-up is a "
            "leak: AllocatorMemoryLeak.",
            "bytes",
            [
                (f"sum {q.group_by('run, rank')} ({floor(site)})", f"{PER_RANK} kept across steps"),
                (
                    q.by("run, rank", "trainguard_run_allocator_device_total_bytes", "sum"),
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
            f"fast the floor grows over {leak_window}; only ranks whose floor grows. Red below "
            f"AllocatorMemoryLeak's horizon ({site.duration('leak_horizon')}; the alert also "
            "needs a steady climb past the warm-up).",
            "s",
            (time_to_full(q), PER_RANK),
            thresholds=((None, "red"), (leak_horizon_s, "orange"), (4 * leak_horizon_s, "green")),
            w=8,
            h=8,
        ),
        ts(
            "Free cache in split blocks (fragmentation)",
            "Per rank: inactive split bytes as a share of the allocator's free cache (reserved "
            f"- allocated), averaged over {frag_window}. AllocatorFragmentation fires above "
            f"{frag_split:g} (orange) while cudaMalloc retries and the free cache is large "
            f"(above {site.shown('frag_free_ratio')} of reserved and "
            f"{site.shown('frag_free_floor')}).",
            "percentunit",
            [(split_share(q), f"{PER_RANK} split share of free cache")],
            thresholds=((None, "green"), (frag_split, "orange")),
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
