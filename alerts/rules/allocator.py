"""Is the PyTorch CUDA allocator short of memory? AllocatorRetrying, AllocatorOOM (the run died
or stopped after it), AllocatorOOMCaught (it caught the OOM and carries on)."""

from __future__ import annotations

from alerts.rules.common import RANK_ARGS, RANK_SEL, Alert, Group, query_bytes, query_value

SNIPPETS = {
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
        Alert(
            "AllocatorRetrying",
            "warning",
            expr="""
            increase(trainguard_run_allocator_alloc_retries_total[${alloc_retry_window}]) > 0
            """,
            for_="${alloc_retry_for}",
            summary="The CUDA allocator of run {{ $labels.run }} keeps retrying allocations.",
            description="""
            The PyTorch allocator of run {{ $labels.run }} rank {{ $labels.rank }}
            (device {{ $labels.device }}) on {{ $labels.instance }} had to free its
            cache and retry a cudaMalloc in every ${alloc_retry_window} for
            ${alloc_retry_for} ({{ $value | printf "%.0f" }} retries in the last
            ${alloc_retry_window}): memory pressure or fragmentation, slow steps, an OOM
            coming. ${stats}
            """,
        ),
        Alert(
            "AllocatorOOM",
            "critical",
            expr="""
            run_rank:trainguard_run_allocator_ooms:recent
            unless on (${target_labels}, run, rank) (
              trainguard_run_process_up == 1
              and on (${target_labels}, run, rank) changes(trainguard_run_step[${oom_window}]) > 0
            )
            """,
            summary="Run {{ $labels.run }} rank {{ $labels.rank }} hit CUDA out of memory.",
            description="""
            Run {{ $labels.run }} rank {{ $labels.rank }} on {{ $labels.instance }}
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
            and on (${target_labels}, run, rank) (
              trainguard_run_process_up == 1
              and on (${target_labels}, run, rank) changes(trainguard_run_step[${oom_window}]) > 0
            )
            """,
            summary="""
            Run {{ $labels.run }} rank {{ $labels.rank }} hit CUDA out of memory and carried on.
            """,
            description="""
            Run {{ $labels.run }} rank {{ $labels.rank }} on {{ $labels.instance }}
            recorded a CUDA out-of-memory in the last ${oom_recent} (OOMs so far: ${ooms},
            memory snapshots dumped so far: ${snapshots}) and is still stepping (a step within
            the last
            ${oom_window}): the script caught it (a batch-size finder, a skipped batch).
            AllocatorOOM pages if it stops stepping. ${stats}
            """,
        ),
    ),
)
