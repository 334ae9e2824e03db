"""Is the PyTorch CUDA allocator short of memory? The allocator's alerts.

AllocatorRetrying, AllocatorOOM (the run died or stopped after it), AllocatorOOMCaught (it
caught the OOM and carries on), and the two that come before an OOM: AllocatorMemoryLeak (what a
rank keeps across steps climbs towards the device's size) and AllocatorFragmentation (free cache
in pieces while cudaMalloc retries). The OOM alerts are judged at every evaluation (``GROUP``),
the three on pressure that builds over minutes every window_rules_interval (``WINDOW``).

Longer than 400 lines because the group carries its own thresholds at its top, beside the
rules they tune (one group, one file: a new alert and its thresholds are one edit here, not
a rule here and a table elsewhere); split, the two halves would be one concern again.
"""

from __future__ import annotations

from alerts.kinds import BYTES, DURATION, NUMBER, Threshold
from alerts.rules.common import (
    RANK_ARGS,
    RANK_SEL,
    Alert,
    Group,
    Record,
    promql,
    query_bytes,
    query_value,
)

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

DEV_SEL = RANK_SEL + ",device=%q"
DEV_ARGS = RANK_ARGS + " $labels.device"
#: what a rank keeps allocated across steps: the minimum over a few minutes, which a spike
#: inside a step (activations, a large temporary) does not raise
FLOOR = "run_rank_device:trainguard_run_allocator_allocated_bytes:floor"
#: the device's size: as the process reported it, else its GPU's as NVML reports it
TOTAL = "run_rank_device:trainguard_run_allocator_device_total_bytes:max"
#: the floor of a process past its warm-up only (absent in its first leak_warmup): the trend
#: of a leak in steps is judged on it, so the warm-up's ramp is never counted as rises
SETTLED = "run_rank_device:trainguard_run_allocator_allocated_bytes:floor_settled"
#: seconds until the device is full at the pace of a leak, +Inf where there is none (see SLOW)
TO_FULL = "run_rank_device:trainguard_run_allocator_full_in_seconds:leak"
#: a rank's device's allocator figures averaged over frag_window (AllocatorFragmentation; each
#: was computed three or four times in the alert)
AVG_RESERVED = "run_rank_device:trainguard_run_allocator_reserved_bytes:avg"
#: what became of each rank within oom_window: 1 alive and stepping, 2 finished (GROUP)
OOM_FATE = "run_rank:trainguard_run_oom_fate:window"
AVG_ALLOCATED = "run_rank_device:trainguard_run_allocator_allocated_bytes:avg"
#: the ranks that finished within oom_window, read twice by OOM_FATE: recorded before it, so
#: that each read is of a record empty on a fleet at work, not of every rank's samples over
#: the window
FINISHED_IN_WINDOW = "run_rank:trainguard_run_finished:window"
#: the ranks whose process is gone, for the two alerts that leave them out: recorded once, and
#: empty on a fleet at work (test_rule_ranks.py reads a record of this expression as the guard)
DOWN = "run_rank:trainguard_run_process_up:zero"
#: what the device has left above the recent peak of allocated memory
HEADROOM = promql(
    """
    (
      ${total}
      - on (${target_labels}, run, rank, device)
      max by (${target_labels}, run, rank, device) (
        max_over_time(trainguard_run_allocator_allocated_bytes[${leak_floor_window}])
      )
    )
    """
)


def _avg(metric: str) -> str:
    """A rank's device's allocator figure averaged over frag_window.

    One series per device whatever labels of the scrape (a Kubernetes pod) changed within the
    window.
    """
    return (
        "max by (${target_labels}, run, rank, device) "
        "(avg_over_time(trainguard_run_allocator_" + metric + "[${frag_window}]))"
    )


SNIPPETS = {
    "oom_fate": OOM_FATE,
    "down": DOWN,
    "finished_in_window": FINISHED_IN_WINDOW,
    # PromQL: the records of both groups, the headroom
    "to_full": TO_FULL,
    "avg_reserved": AVG_RESERVED,
    "avg_allocated": AVG_ALLOCATED,
    "avg_split": _avg("inactive_split_bytes"),
    "floor": FLOOR,
    "headroom": HEADROOM,
    "settled": SETTLED,
    "total": TOTAL,
    # A whole sentence on the rank's allocator, for both alerts.
    "stats": (
        "Allocator now: reserved "
        + query_bytes("sum(trainguard_run_allocator_reserved_bytes{" + RANK_SEL + "})", RANK_ARGS)
        + ", allocated "
        + query_bytes("sum(trainguard_run_allocator_allocated_bytes{" + RANK_SEL + "})", RANK_ARGS)
        + ", inactive split "
        + query_bytes(
            "sum(trainguard_run_allocator_inactive_split_bytes{" + RANK_SEL + "})", RANK_ARGS
        )
        + "."
    ),
    "snapshots": query_value(
        "sum(trainguard_run_memory_snapshots_total{" + RANK_SEL + "})",
        RANK_ARGS,
    ),
    # AllocatorMemoryLeak: bytes per step the floor grew over the window
    "leak_per_step": query_bytes(
        "(last_over_time("
        + FLOOR
        + "{"
        + DEV_SEL
        + "}[${slow_rules_lookback}]) - last_over_time("
        + FLOOR
        + "{"
        + DEV_SEL
        + "}[${slow_rules_lookback}] offset ${leak_window}))"
        + " / on (${target_labels}, run, rank)"
        + " (max by (${target_labels}, run, rank) (trainguard_run_step{"
        + RANK_SEL
        + "}) - max by (${target_labels}, run, rank) (trainguard_run_step{"
        + RANK_SEL
        + "} offset ${leak_window}))",
        DEV_ARGS + " " + DEV_ARGS + " " + RANK_ARGS + " " + RANK_ARGS,
    ),
    "leak_steps": query_value(
        "max(trainguard_run_step{"
        + RANK_SEL
        + "}) - max(trainguard_run_step{"
        + RANK_SEL
        + "} offset ${leak_window})",
        RANK_ARGS + " " + RANK_ARGS,
    ),
    "leak_floor": query_bytes(
        "last_over_time(" + FLOOR + "{" + DEV_SEL + "}[${slow_rules_lookback}])", DEV_ARGS
    ),
    "leak_total": query_bytes(
        "last_over_time(" + TOTAL + "{" + DEV_SEL + "}[${slow_rules_lookback}])", DEV_ARGS
    ),
    "frag_stats": (
        "Averages over ${frag_window}: reserved "
        + query_bytes(
            "max(avg_over_time(trainguard_run_allocator_reserved_bytes{"
            + DEV_SEL
            + "}[${frag_window}]))",
            DEV_ARGS,
        )
        + ", allocated "
        + query_bytes(
            "max(avg_over_time(trainguard_run_allocator_allocated_bytes{"
            + DEV_SEL
            + "}[${frag_window}]))",
            DEV_ARGS,
        )
        + ", inactive split "
        + query_bytes(
            "max(avg_over_time(trainguard_run_allocator_inactive_split_bytes{"
            + DEV_SEL
            + "}[${frag_window}]))",
            DEV_ARGS,
        )
        + "; cudaMalloc retries in the last ${frag_window}: "
        + query_value(
            "max(increase(trainguard_run_allocator_alloc_retries_total{"
            + DEV_SEL
            + "}[${frag_window}]))",
            DEV_ARGS,
        )
        + "."
    ),
    "ooms": query_value(
        "sum(trainguard_run_allocator_ooms_total{" + RANK_SEL + "})",
        RANK_ARGS,
    ),
}

GROUP = Group(
    "trainguard-allocator",
    run_context=True,
    snippets=SNIPPETS,
    rules=(
        Record(FINISHED_IN_WINDOW, "last_over_time(trainguard_run_finished[${oom_window}]) == 1"),
        # What became of each rank within oom_window, judged once for AllocatorOOM and
        # AllocatorOOMCaught: 1 alive and stepping (an OOM it caught), 2 finished cleanly
        # (never an OOM page); absent otherwise (gone, or alive without a step: AllocatorOOM)
        Record(
            OOM_FATE,
            """
            (
              last_over_time(trainguard_run_process_up[${oom_window}]) == 1
              and on (${target_labels}, run, rank) changes(trainguard_run_step[${oom_window}]) > 0
              unless on (${target_labels}, run, rank) ${finished_in_window}
            ) * 0 + 1
            or
            ${finished_in_window} * 0 + 2
            """,
        ),
        Alert(
            "AllocatorOOM",
            "critical",
            expr="""
            run_rank:trainguard_run_allocator_ooms:recent
            unless on (${target_labels}, run, rank) ${oom_fate}
            """,
            summary="Run {{ $labels.run }} rank {{ $labels.rank }} hit CUDA out of memory.",
            description="""
            Run {{ $labels.run }} rank {{ $labels.rank }} on ${rank_host}
            recorded a CUDA out-of-memory in the last ${oom_recent} (OOMs so far: ${ooms},
            memory snapshots dumped so far: ${snapshots}) and has not stepped in the last
            ${oom_window}, or
            its process is gone. ${stats} Reserved far above allocated, or a large inactive
            split, means fragmentation: "free" VRAM that no large block fits in.
            """,
        ),
        Alert(
            "AllocatorOOMCaught",
            "warning",
            expr="""
            run_rank:trainguard_run_allocator_ooms:recent
            and on (${target_labels}, run, rank) ${oom_fate} == 1
            """,
            summary="""
            Run {{ $labels.run }} rank {{ $labels.rank }} hit CUDA out of memory and carried on.
            """,
            description="""
            Run {{ $labels.run }} rank {{ $labels.rank }} on ${rank_host}
            recorded a CUDA out-of-memory in the last ${oom_recent} (OOMs so far: ${ooms},
            memory snapshots dumped so far: ${snapshots}) and is still stepping (a step within
            the last
            ${oom_window}): the script caught it (a batch-size finder, a skipped batch).
            AllocatorOOM pages if it stops stepping. ${stats}
            """,
        ),
    ),
)

#: The alerts on memory pressure that builds over minutes (retries in every 10m window for 15m,
#: a leak climbing for 30m, fragmentation for 15m) and the records only they read, evaluated every
#: window_rules_interval (1m) instead of every 15 s: each fires up to one interval later. An OOM
#: pages from GROUP, at every evaluation.
WINDOW = Group(
    "trainguard-allocator.window",
    run_context=True,
    snippets=SNIPPETS,
    interval="${window_rules_interval}",
    rules=(
        Record(AVG_RESERVED, _avg("reserved_bytes")),
        Record(AVG_ALLOCATED, _avg("allocated_bytes")),
        Record(DOWN, "trainguard_run_process_up == 0"),
        Alert(
            "AllocatorRetrying",
            "warning",
            # a dead or finished rank's counters stay as they were: not judged
            expr="""
            increase(trainguard_run_allocator_alloc_retries_total[${alloc_retry_window}]) > 0
            unless on (${target_labels}, run, rank) ${down}
            """,
            for_="${alloc_retry_for}",
            keep_firing_for="${keep_firing_for}",
            summary="The CUDA allocator of run {{ $labels.run }} keeps retrying allocations.",
            description="""
            The PyTorch allocator of run {{ $labels.run }} rank {{ $labels.rank }}
            (device {{ $labels.device }}) on ${rank_host} had to free its
            cache and retry a cudaMalloc in every ${alloc_retry_window} for
            ${alloc_retry_for} ({{ $value | printf "%.0f" }} retries in the last
            ${alloc_retry_window}): memory pressure or fragmentation, slow steps, an OOM
            coming. ${stats}
            """,
        ),
        Alert(
            "AllocatorMemoryLeak",
            "warning",
            # the time to full the slow group records (TO_FULL: +Inf where no leak), judged at
            # every evaluation; the process checks again here, so that a record of a process
            # that has just ended or restarted is not read
            expr="""
            last_over_time(${to_full}[${slow_rules_lookback}]) < ${leak_horizon_s}
            and on (${target_labels}, run, rank)
            trainguard_run_process_up == 1
            and on (${target_labels}, run, rank)
            trainguard_run_start_age_seconds > ${leak_warmup_s} + ${leak_window_s}
            """,
            for_="${leak_for}",
            summary="""
            Run {{ $labels.run }} rank {{ $labels.rank }} keeps more GPU memory every step: a
            leak.
            """,
            description="""
            The memory PyTorch's allocator keeps across steps for run {{ $labels.run }} rank
            {{ $labels.rank }} (device {{ $labels.device }}) on ${rank_host} has
            climbed for ${leak_for}: ${leak_per_step} per step over the last ${leak_window}
            (${leak_steps} steps), now ${leak_floor} of ${leak_total}. At this pace the device
            is full in {{ $value | humanizeDuration }}. Not the warm-up (the process is past its
            first ${leak_warmup} + ${leak_window}), not a spike nor one step up (the minimum
            over ${leak_floor_window} rose at every evaluation, or in at least ${leak_rises}
            separate ${leak_rise_window} windows of the last ${leak_trend_window}): tensors
            kept across steps, steadily or a few GiB at a time. Take a memory snapshot now
            (trainguard snapshot '{{ $labels.run }}' --rank
            {{ $labels.rank }}) and another one later, and compare.
            """,
        ),
        Alert(
            "AllocatorFragmentation",
            "warning",
            # the value: the free cache (reserved - allocated) averaged over the window; the
            # averages are recorded above, each once per evaluation. One chain of filters on
            # the free cache, each read once: free / reserved > frag_free_ratio as free >
            # ratio x reserved, split / free > frag_split_share as free < split / share (free
            # is above frag_free_floor, so positive)
            expr="""
            (${avg_reserved} - ${avg_allocated})
              > ${frag_free_floor}
              > ${frag_free_ratio} * ${avg_reserved}
              < ${avg_split} / ${frag_split_share}
            and on (${target_labels}, run, rank, device)
            max by (${target_labels}, run, rank, device) (
              increase(trainguard_run_allocator_alloc_retries_total[${frag_window}])
            ) > 0
            unless on (${target_labels}, run, rank) ${down}
            """,
            for_="${frag_for}",
            summary="""
            The GPU memory of run {{ $labels.run }} rank {{ $labels.rank }} is fragmented.
            """,
            description="""
            The PyTorch allocator of run {{ $labels.run }} rank {{ $labels.rank }} (device
            {{ $labels.device }}) on ${rank_host} holds {{ $value | humanize1024 }}B
            it has not handed to tensors, mostly in pieces of split blocks (inactive split),
            and still had to free its cache and retry cudaMalloc, for ${frag_for}: the "out of
            memory with free VRAM" is coming. ${frag_stats} Take a memory snapshot (trainguard
            snapshot '{{ $labels.run }}' --rank {{ $labels.rank }}) before changing
            PYTORCH_CUDA_ALLOC_CONF.
            """,
        ),
    ),
)

#: What AllocatorMemoryLeak judges, recorded every slow_rules_interval (5m) instead of every 15 s:
#: the floor, the settled floor, the device's size and the time to full. A leak is a trend over
#: leak_window (30m) and leak_trend_window (2h) that must hold for leak_for (30m) towards a
#: device full within leak_horizon (24h): judged on a record up to 5m old, the warning comes up
#: to 5m later (and goes up to 5m later), and up to window_rules_interval more for its group.
#: Every 15 s, its 2h deriv and 2h:10m subquery per device made it the costliest alert of the
#: set at fleet scale (bench/RESULTS.md, "Fleet scale"). The floor, a minimum over
#: leak_floor_window (5m), recorded every 5m still covers every sample.
SLOW = Group(
    "trainguard-allocator.slow",
    snippets=SNIPPETS,
    interval="${slow_rules_interval}",
    rules=(
        Record(
            FLOOR,
            """
            min by (${target_labels}, run, rank, device) (
              min_over_time(trainguard_run_allocator_allocated_bytes[${leak_floor_window}])
            )
            """,
        ),
        Record(
            SETTLED,
            """
            ${floor}
            and on (${target_labels}, run, rank)
            max by (${target_labels}, run, rank) (
              trainguard_run_start_age_seconds > ${leak_warmup_s}
            )
            """,
        ),
        # The process's own figure (torch's total_memory: right for a MIG slice too), else its
        # GPU's through the allocator's UUID join (older reporters).
        Record(
            TOTAL,
            """
            max by (${target_labels}, run, rank, device) (
              trainguard_run_allocator_device_total_bytes
            )
            or
            max by (${target_labels}, run, rank, device) (
              trainguard_run_allocator_device_info
              * on (${target_labels}, uuid) group_left
              max by (${target_labels}, uuid) (trainguard_gpu_memory_total_bytes)
            )
            """,
        ),
        # headroom above the recent peak / the floor's pace = seconds until the device is
        # full, where the process is live, past its warm-up and stepped within leak_window;
        # the pace is the larger of: the floor's slope over leak_window where the floor is
        # above its value leak_rise_window ago (a steady climb), and the settled floor's slope
        # over leak_trend_window where it rose in at least leak_rises separate
        # leak_rise_windows of it (a leak in steps; one step up, a buffer kept for good, is
        # one rise). +Inf elsewhere, so that a leak that stops is read as stopped at once.
        Record(
            TO_FULL,
            """
            (
              ${headroom}
              / on (${target_labels}, run, rank, device)
              max by (${target_labels}, run, rank, device) (
                label_replace(
                  deriv(${floor}[${leak_window}]) > 0
                  and on (${target_labels}, run, rank, device)
                  ${floor} > ${floor} offset ${leak_rise_window},
                  "pace", "steady", "", ""
                )
                or
                label_replace(
                  deriv(${settled}[${leak_trend_window}]) > 0
                  and on (${target_labels}, run, rank, device)
                  count_over_time(
                    (${settled} > ${settled} offset ${leak_rise_window})
                    [${leak_trend_window}:${leak_rise_window}]
                  ) >= ${leak_rises},
                  "pace", "steps", "", ""
                )
              )
              and on (${target_labels}, run, rank)
              (
                max by (${target_labels}, run, rank) (trainguard_run_step)
                - max by (${target_labels}, run, rank) (trainguard_run_step offset ${leak_window})
                > 0
              )
              and on (${target_labels}, run, rank)
              trainguard_run_process_up == 1
              and on (${target_labels}, run, rank)
              trainguard_run_start_age_seconds > ${leak_warmup_s} + ${leak_window_s}
            )
            or
            ${floor} * 0 + Inf
            """,
        ),
    ),
)
