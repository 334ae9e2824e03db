"""Thresholds of the allocator alerts (``alerts/rules/allocator.py``).

They tune the alerts on retries, OOMs, leaks and fragmentation.
"""

from __future__ import annotations

from alerts.kinds import BYTES, DURATION, NUMBER
from alerts.thresholds.threshold import Threshold

THRESHOLDS: tuple[Threshold, ...] = (
    Threshold(
        "alloc_retry_window",
        "10m",
        DURATION,
        "AllocatorRetrying: cudaMalloc retries in every window of this length...",
    ),
    Threshold(
        "alloc_retry_for",
        "15m",
        DURATION,
        "AllocatorRetrying: ...for this long.",
    ),
    Threshold(
        "oom_window",
        "5m",
        DURATION,
        "AllocatorOOM, AllocatorOOMCaught: a rank that stepped within this window is still "
        "making progress after its OOM (warning); one that did not, or whose process is gone, "
        "pages.",
    ),
    Threshold(
        "oom_recent",
        "30m",
        DURATION,
        "AllocatorOOM, AllocatorOOMCaught: an OOM (or OOM memory snapshot) within this window is "
        "news; also a counter that appeared above 0 within it while Prometheus was scraping the "
        "exporter (an OOM in the first batch).",
    ),
    Threshold(
        "leak_floor_window",
        "5m",
        DURATION,
        "AllocatorMemoryLeak: a rank's allocated memory floor is its minimum over this window "
        "(recording rule run_rank_device:trainguard_run_allocator_allocated_bytes:floor): what "
        "it keeps across steps; a spike inside a step does not raise it...",
    ),
    Threshold(
        "leak_warmup",
        "30m",
        DURATION,
        "AllocatorMemoryLeak: ...no warning in a process's first leak_warmup + leak_window "
        "(the ramp of the first steps: optimizer state, caches, the longest batch so far)...",
    ),
    Threshold(
        "leak_window",
        "30m",
        DURATION,
        "AllocatorMemoryLeak: ...the floor's pace (deriv) and its growth per step are measured "
        "over this window...",
    ),
    Threshold(
        "leak_rise_window",
        "10m",
        DURATION,
        "AllocatorMemoryLeak: ...the floor must be above its value this long ago at every "
        "evaluation for leak_for (a steady climb, not one step up)...",
    ),
    Threshold(
        "leak_trend_window",
        "2h",
        DURATION,
        "AllocatorMemoryLeak: ...or, for a leak in steps (a few GiB kept every so often, flat "
        "between), the floor past the warm-up rose in at least leak_rises separate "
        "leak_rise_windows of the last leak_trend_window, its pace measured over that window "
        "(one step up, a buffer kept for good, is a single rise)...",
    ),
    Threshold(
        "leak_rises",
        3,
        NUMBER,
        "AllocatorMemoryLeak: ...at least this many rises...",
    ),
    Threshold(
        "leak_horizon",
        "24h",
        DURATION,
        "AllocatorMemoryLeak: ...and at that pace fill the device (its headroom above the "
        "recent peak of allocated memory) within this long...",
    ),
    Threshold(
        "leak_for",
        "30m",
        DURATION,
        "AllocatorMemoryLeak: ...all of it for this long.",
    ),
    Threshold(
        "frag_window",
        "10m",
        DURATION,
        "AllocatorFragmentation: averages of reserved, allocated and inactive split bytes over "
        "this window, and cudaMalloc retries within it...",
    ),
    Threshold(
        "frag_free_ratio",
        0.3,
        NUMBER,
        "AllocatorFragmentation: ...reserved bytes not allocated (the allocator's free cache) "
        "above this fraction of reserved...",
    ),
    Threshold(
        "frag_free_floor",
        "2GiB",
        BYTES,
        "AllocatorFragmentation: ...and above this many bytes...",
    ),
    Threshold(
        "frag_split_share",
        0.5,
        NUMBER,
        "AllocatorFragmentation: ...with inactive split bytes above this fraction of that free "
        "cache (free, but in pieces of split blocks that large requests cannot use)...",
    ),
    Threshold(
        "frag_for",
        "15m",
        DURATION,
        "AllocatorFragmentation: ...while cudaMalloc retries happen, for this long.",
    ),
)
