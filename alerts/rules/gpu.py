"""Alerts on VRAM held by something that no longer trains, and on GPUs that failed.

GPUXidError (``GROUP``, every evaluation: an Xid is news at once); GPUGhostMemory,
GPUUnattributedMemory, DuplicateHostProcess (``WINDOW``: judged over minutes, so evaluated
every window_rules_interval).
"""

from __future__ import annotations

from alerts.kinds import BYTES, DURATION, NUMBER, XIDS, Threshold
from alerts.rules.common import (
    RANK_ARGS,
    RANK_SEL,
    Alert,
    Group,
    Record,
    query_bytes,
    query_value,
)
from alerts.rules.memory import GPU_RECORDS, RANK_GHOST_RECORDS

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

GPU_SEL = "${target_labels_sel},gpu=%q,uuid=%q"
GPU_ARGS = "${target_labels_args} $labels.gpu $labels.uuid"
#: how far back the GPU alerts look for the runs that used the GPU
RECENT_RUNS_WINDOW = "1h"
#: the GPUs where NVML lists no process, recorded once for the group's four reads of it: on a
#: fleet at work the record is empty, so each read costs nothing where reading the per-GPU
#: count costs a pass over every GPU (bench/RESULTS.md, "Fleet scale")
NO_PROCESS = "gpu:trainguard_gpu_processes:zero"

SNIPPETS = {
    "driver": query_bytes(
        "run_rank:trainguard_run_gpu_memory_used_bytes:sum{" + RANK_SEL + "}", RANK_ARGS
    ),
    "reserved": query_bytes(
        "run_rank:trainguard_run_allocator_reserved_bytes:sum{" + RANK_SEL + "}", RANK_ARGS
    ),
    "ratio": query_value(
        "run_rank:trainguard_run_gpu_memory_used_over_reserved:ratio{" + RANK_SEL + "}",
        RANK_ARGS,
        'printf "%.2f"',
    ),
    # " (NVIDIA H100 80GB HBM3)", or nothing when the GPU's info is missing.
    "gpu_name": (
        "{{ with printf `trainguard_gpu_info{" + GPU_SEL + "}` " + GPU_ARGS + " | query }}"
        ' ({{ . | first | label "name" }}){{ end }}'
    ),
    "gpu_total": query_bytes("trainguard_gpu_memory_total_bytes{" + GPU_SEL + "}", GPU_ARGS),
    "gpu_used": query_bytes("trainguard_gpu_memory_used_bytes{" + GPU_SEL + "}", GPU_ARGS),
    "gpu_reserved": query_bytes(
        "uuid:trainguard_run_allocator_reserved_bytes:sum{${target_labels_sel},uuid=%q}",
        "${target_labels_args} $labels.uuid",
    ),
    # "llama-ft rank 0, llama-ft rank 1", or "none": the runs whose processes held memory on
    # the GPU (driver view, Linux) or whose allocator used it (by UUID: WDDM/WSL too) lately,
    # dead ones included; where ghost memory comes from, most of the time.
    "recent_runs": (
        "{{ range $i, $s := printf `max by (${target_labels}, run, rank) ("
        "max_over_time(trainguard_run_allocator_device_info{${target_labels_sel},uuid=%q}"
        "[" + RECENT_RUNS_WINDOW + "])"
        " or max_over_time(trainguard_run_gpu_memory_used_bytes{${target_labels_sel},gpu=%q}"
        "[" + RECENT_RUNS_WINDOW + "])"
        ")` ${target_labels_args} $labels.uuid ${target_labels_args} $labels.gpu"
        ' | query | sortByLabel "run" }}{{ if $i }}, {{ end }}{{ $s.Labels.run }} rank'
        " {{ $s.Labels.rank }}{{ else }}none{{ end }}"
    ),
    "recent_runs_window": RECENT_RUNS_WINDOW,
    "no_process": NO_PROCESS,
    "xid_count": query_value(
        "trainguard_gpu_xid_errors_total{" + GPU_SEL + ",xid=%q}",
        GPU_ARGS + " $labels.xid",
        unknown="an unknown number of",
    ),
}

GROUP = Group(
    "trainguard-gpu",
    snippets=SNIPPETS,
    rules=(
        Alert(
            "GPUXidError",
            "critical",
            expr='gpu:trainguard_gpu_xid_errors:recent{xid=~"${xid_critical}"}',
            summary="""
            GPU {{ $labels.gpu }} on {{ $labels.instance }} reported critical Xid
            {{ $labels.xid }}.
            """,
            description="""
            GPU {{ $labels.gpu }}${gpu_name} on {{ $labels.instance }} reported Xid
            {{ $labels.xid }} (${xid_count} time(s) since the exporter started) within the last
            ${xid_window}. Xid {{ $labels.xid }} is in the critical list (${xid_critical_list}):
            the GPU needs a reset, a reboot or service before it can train again, and the runs
            on it have most likely died. See the runbook's table for this code.
            """,
        ),
        Alert(
            "GPUXidError",
            "warning",
            expr="""
            gpu:trainguard_gpu_xid_errors:recent{xid=~"${xid_warning}",xid!~"${xid_critical}"}
            """,
            summary="""
            GPU {{ $labels.gpu }} on {{ $labels.instance }} reported Xid {{ $labels.xid }}.
            """,
            description="""
            GPU {{ $labels.gpu }}${gpu_name} on {{ $labels.instance }} reported Xid
            {{ $labels.xid }} (${xid_count} time(s) since the exporter started) within the last
            ${xid_window}. Xid {{ $labels.xid }} is in the warning list (${xid_warning_list}):
            the application that hit it was most likely killed, the GPU stays usable; a GPU
            that keeps reporting it needs a reset or service. See the runbook's table for this
            code.
            """,
        ),
    ),
)

#: The alerts on memory held for minutes (GPUGhostMemory: a window and a `for` of 5-10m;
#: GPUUnattributedMemory: 15m; DuplicateHostProcess: 5m) and the records only they read,
#: evaluated every window_rules_interval (1m) instead of every 15 s: each fires up to one
#: interval later. Memory left behind by a run's death pages from the GPU health group
#: (GPUMemoryNotReleased), at the global interval.
WINDOW = Group(
    "trainguard-gpu.window",
    snippets=SNIPPETS,
    interval="${window_rules_interval}",
    rules=(
        *RANK_GHOST_RECORDS,
        *GPU_RECORDS,
        Record(NO_PROCESS, "trainguard_gpu_processes == 0"),
        Alert(
            "GPUGhostMemory",
            "warning",
            expr="""
            min_over_time(
              run_rank:trainguard_run_gpu_memory_ghost_bytes:sum[${ghost_window}]
            ) > ${ghost_floor}
            and
            min_over_time(
              run_rank:trainguard_run_gpu_memory_used_over_reserved:ratio[${ghost_window}]
            ) > ${ghost_ratio}
            """,
            for_="${ghost_for}",
            keep_firing_for="${keep_firing_for}",
            labels={"scope": "rank"},
            summary="""
            GPU driver holds far more VRAM for run {{ $labels.run }} than its allocator reserved.
            """,
            description="""
            For at least ${ghost_window} the driver has attributed
            {{ $value | humanize1024 }}B or more VRAM to run {{ $labels.run }} rank
            {{ $labels.rank }} on ${rank_host} than its PyTorch allocator has
            reserved (now: driver ${driver}, reserved ${reserved}, ratio ${ratio}; thresholds:
            ratio > ${ghost_ratio} and gap > ${ghost_floor_h}). Typical of ghost memory left
            by crashed runs under WDDM/WSL: throughput drops until the VM or driver session is
            restarted.
            """,
        ),
        # Where NVML cannot attribute memory to processes (Windows WDDM: listed, memory not
        # available; WSL: not listed at all) the rule above has no input: compare per GPU,
        # the driver's used memory against what the live runs on that GPU reserved. Hosts
        # where a live run's memory cannot be placed on a GPU are not judged.
        Alert(
            "GPUGhostMemory",
            "warning",
            expr="""
            min_over_time(gpu:trainguard_gpu_memory_ghost_bytes:sum[${ghost_window}])
              > ${ghost_device_floor}
            and
            min_over_time(gpu:trainguard_gpu_memory_used_over_accounted:ratio[${ghost_window}])
              > ${ghost_ratio}
            and on (${target_labels}, gpu, uuid)
            (
              trainguard_gpu_processes_memory_unknown > 0
              or ${no_process}
            )
            unless on (${target_labels})
            instance:trainguard_run_allocator_devices_unplaced:count > 0
            """,
            for_="${ghost_for}",
            keep_firing_for="${keep_firing_for}",
            labels={"scope": "gpu"},
            summary="""
            GPU {{ $labels.gpu }} on {{ $labels.instance }} has far more VRAM in use than the
            live runs on it reserved.
            """,
            description="""
            For at least ${ghost_window} GPU {{ $labels.gpu }}${gpu_name} on
            {{ $labels.instance }} has had {{ $value | humanize1024 }}B or more in use beyond
            what the live training runs on it account for (now: used ${gpu_used} of
            ${gpu_total}, their allocator reserved ${gpu_reserved}, plus
            ${ghost_context_allowance_h} of CUDA context per process; thresholds: ratio >
            ${ghost_ratio} and gap > ${ghost_device_floor_h}). NVML cannot attribute memory to
            processes here (WDDM/WSL), so this is judged per GPU. Typical of ghost memory left
            by crashed runs: throughput drops until the driver session is restarted (wsl
            --shutdown). Runs on this GPU in the last ${recent_runs_window}:
            ${recent_runs}.
            """,
        ),
        Alert(
            "GPUUnattributedMemory",
            "warning",
            # Not where NVML cannot tell: a process's memory unknown (WDDM), or no process
            # listed while live runs report allocator memory on this GPU or on one of this
            # host's that cannot be placed (WSL lists none): "unattributed" is then just
            # "used", and GPUGhostMemory judges the GPU against the runs' allocators instead.
            # With no process listed on a GPU whose driver gives no Xid events (WDDM/WSL: the
            # Windows desktop's 2-2.5 GiB are "used" there, with no run live or none ever),
            # only more than GPUGhostMemory's per-GPU allowance (ghost_device_floor) counts.
            expr="""
            trainguard_gpu_memory_unattributed_bytes > ${unattributed_floor}
            unless on (${target_labels}, gpu, uuid) trainguard_gpu_processes_memory_unknown > 0
            unless on (${target_labels}, gpu, uuid)
            (
              ${no_process}
              and on (${target_labels}, uuid) uuid:trainguard_run_allocator_reserved_bytes:sum
            )
            unless on (${target_labels}, gpu, uuid)
            (
              ${no_process}
              and on (${target_labels}) instance:trainguard_run_allocator_devices_unplaced:count > 0
            )
            unless on (${target_labels}, gpu, uuid)
            (
              ${no_process}
              and on (${target_labels}, gpu, uuid) trainguard_gpu_xid_events_supported == 0
              and on (${target_labels}, gpu, uuid)
                trainguard_gpu_memory_unattributed_bytes <= ${ghost_device_floor}
            )
            """,
            for_="${unattributed_for}",
            keep_firing_for="${keep_firing_for}",
            summary="""
            GPU {{ $labels.gpu }} on {{ $labels.instance }} has VRAM in use that no live
            process accounts for.
            """,
            description="""
            GPU {{ $labels.gpu }}${gpu_name} on {{ $labels.instance }} has
            {{ $value | humanize1024 }}B of its ${gpu_total} in use that no live process
            accounts for (threshold ${unattributed_floor_h}, sustained ${unattributed_for}).
            Memory of crashed processes the driver never released; it stays lost until the
            driver session (the VM, under WSL) is restarted. Runs on this GPU in the last
            ${recent_runs_window}: ${recent_runs}.
            """,
        ),
        Alert(
            "DuplicateHostProcess",
            "warning",
            expr="trainguard_process_count > 1",
            for_="${duplicate_process_for}",
            summary="""
            {{ $value }} instances of host process {{ $labels.name }} on {{ $labels.instance }}.
            """,
            description="""
            {{ $value }} processes on {{ $labels.instance }} match the configured name
            {{ $labels.name }}, which should run once, for more than ${duplicate_process_for}.
            For the WSL VM host process (vmmem) this means an old VM session was never
            released, and with it the GPU memory it held.
            """,
        ),
    ),
)
