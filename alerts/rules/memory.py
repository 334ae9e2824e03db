"""Recording rules of memory: per rank and per GPU (ghost memory, recent OOMs).

Per rank: the driver's view, the allocator's reserve, ghost memory (``RANK_GHOST_RECORDS``),
recent OOMs (``RANK``); per GPU: what the live runs' allocators account for on each device
(``GPU_RECORDS``). The ghost records are evaluated in the GPU alerts' window group, the OOMs at
every evaluation.

Their readers are the allocator and GPU alerts (``allocator.py``, ``gpu.py``). They were part
of ``trainguard.rules`` (``recording.py``), a group of 23 rules whose evaluation at 1000 nodes
took about a third of its 15 s interval in CPU (bench/RESULTS.md, "Fleet scale"), and are
evaluated apart from it. Groups are evaluated independently, so their readers see
them as they saw trainguard.rules': the values of the latest evaluation.
"""

from __future__ import annotations

from alerts.rules.common import Group, Record

#: The rank's driver-view memory, its allocator's reserve and the ghost between them: read only
#: by GPUGhostMemory, so evaluated with it in its group (``gpu.WINDOW``, every
#: window_rules_interval), as ``GPU_RECORDS`` are.
RANK_GHOST_RECORDS: tuple[Record, ...] = (
    Record(
        "run_rank:trainguard_run_gpu_memory_used_bytes:sum",
        "sum by (${target_labels}, run, rank) (trainguard_run_gpu_memory_used_bytes)",
    ),
    Record(
        "run_rank:trainguard_run_allocator_reserved_bytes:sum",
        "sum by (${target_labels}, run, rank) (trainguard_run_allocator_reserved_bytes)",
    ),
    Record(
        "run_rank:trainguard_run_gpu_memory_ghost_bytes:sum",
        """
        run_rank:trainguard_run_gpu_memory_used_bytes:sum
        - run_rank:trainguard_run_allocator_reserved_bytes:sum
        """,
    ),
    Record(
        "run_rank:trainguard_run_gpu_memory_used_over_reserved:ratio",
        """
        run_rank:trainguard_run_gpu_memory_used_bytes:sum
        / run_rank:trainguard_run_allocator_reserved_bytes:sum
        """,
    ),
)

RANK = Group(
    "trainguard-memory.rules",
    rules=(
        # OOMs (or OOM memory snapshots) of a rank within oom_recent. increase() needs two
        # samples, so an OOM counter above 0 in a process younger than oom_recent counts too
        # (the counter resets with each process: a relaunch that OOMs in its first batch shows
        # 1 at its first sample, as the dead process's series did), and so does a counter that
        # did not exist oom_recent ago while Prometheus was scraping the exporter then (not an
        # old count seen by a Prometheus just started). Comparisons with the past match on the
        # series' identity only (on/by), never on labels of the scrape such as a Kubernetes
        # `pod`, which a rollout of the exporter changes.
        # The devices whose OOM counter is above 0, for the two branches below that read it:
        # recorded once, and empty on a fleet without OOMs, so that each read costs nothing
        # where reading the counter again costs a pass over every rank's devices.
        Record(
            "run_rank_device:trainguard_run_allocator_ooms:nonzero",
            """
            max by (${target_labels}, run, rank, device) (trainguard_run_allocator_ooms_total)
            > 0
            """,
        ),
        Record(
            "run_rank:trainguard_run_allocator_ooms:recent",
            """
            sum by (${target_labels}, run, rank) (
              increase(trainguard_run_allocator_ooms_total[${oom_recent}]) > 0
              or increase(trainguard_run_memory_snapshots_total[${oom_recent}]) > 0
              or (
                run_rank_device:trainguard_run_allocator_ooms:nonzero
                and on (${target_labels}, run, rank)
                  max by (${target_labels}, run, rank) (trainguard_run_start_age_seconds)
                  < ${oom_recent_s}
              )
              or (
                (
                  run_rank_device:trainguard_run_allocator_ooms:nonzero
                  unless on (${target_labels}, run, rank, device)
                    trainguard_run_allocator_ooms_total offset ${oom_recent}
                )
                and on (${target_labels}) (up offset ${oom_recent} == 1)
              )
              or (
                (
                  max by (${target_labels}, run, rank) (trainguard_run_memory_snapshots_total) > 0
                  unless on (${target_labels}, run, rank)
                    trainguard_run_memory_snapshots_total offset ${oom_recent}
                )
                and on (${target_labels}) (up offset ${oom_recent} == 1)
              )
            )
            """,
        ),
    ),
)

#: Read only by GPUGhostMemory and GPUUnattributedMemory, so evaluated with them in their
#: group (``gpu.WINDOW``, every window_rules_interval): in a group of their own, at that
#: interval, an alert could read them up to one interval old, on top of its own interval.
GPU_RECORDS: tuple[Record, ...] = (
    # The device-level view of ghost memory, for GPUs whose memory NVML cannot attribute
    # to processes (WDDM/WSL): what the live runs' allocators reserved on each GPU (joined
    # by UUID, whatever CUDA_VISIBLE_DEVICES did to the index), how many processes that
    # is, and the GPU's used memory beyond it and a CUDA context per process.
    Record(
        "uuid:trainguard_run_allocator_reserved_bytes:sum",
        """
        sum by (${target_labels}, uuid) (
          trainguard_run_allocator_reserved_bytes
          * on (${target_labels}, run, rank, device) group_left (uuid)
          trainguard_run_allocator_device_info
          and on (${target_labels}, run, rank) trainguard_run_process_up == 1
        )
        """,
    ),
    Record(
        "uuid:trainguard_run_allocator_devices:count",
        """
        count by (${target_labels}, uuid) (
          trainguard_run_allocator_device_info
          and on (${target_labels}, run, rank) trainguard_run_process_up == 1
        )
        """,
    ),
    Record(
        "gpu:trainguard_gpu_memory_ghost_bytes:sum",
        """
        trainguard_gpu_memory_used_bytes
        - on (${target_labels}, uuid) group_left ()
        (
          uuid:trainguard_run_allocator_reserved_bytes:sum
          + uuid:trainguard_run_allocator_devices:count * ${ghost_context_allowance}
        )
        """,
    ),
    Record(
        "gpu:trainguard_gpu_memory_used_over_accounted:ratio",
        """
        trainguard_gpu_memory_used_bytes
        / on (${target_labels}, uuid) group_left ()
        (
          uuid:trainguard_run_allocator_reserved_bytes:sum
          + uuid:trainguard_run_allocator_devices:count * ${ghost_context_allowance}
        )
        """,
    ),
    # Live allocator devices that cannot be put on a GPU of their host (no uuid: an older
    # reporter; a uuid no GPU has: a MIG instance): their memory is somewhere unknown, so
    # no GPU of that host is judged per device.
    Record(
        "instance:trainguard_run_allocator_devices_unplaced:count",
        """
        count by (${target_labels}) (
          trainguard_run_allocator_reserved_bytes
          and on (${target_labels}, run, rank) trainguard_run_process_up == 1
          unless on (${target_labels}, run, rank, device)
          (
            trainguard_run_allocator_device_info
            and on (${target_labels}, uuid) trainguard_gpu_info
          )
        )
        """,
    ),
)
