"""Recording rules: the per-run and per-rank aggregates the alerts (and dashboards) build on.

Evaluated first (promtool tests set ``group_eval_order``), so the alerts see this step's values.
"""

from __future__ import annotations

from alerts.rules.common import Group, Record

#: a rank of slow steps: its longest recent interval leaves fewer than throughput_min_steps
#: steps in throughput_window
SLOW_PACE = (
    "last_over_time(run_rank:trainguard_run_step_gap_seconds:max[${stall_max}])"
    " * ${throughput_min_steps} > ${throughput_window_s}"
)

GROUP = Group(
    "trainguard.rules",
    rules=(
        Record(
            "run:trainguard_run_active_ranks:count",
            """
            count by (${target_labels}, run) (
              trainguard_run_process_up == 1
              unless on (${target_labels}, run, rank) trainguard_run_finished == 1
            )
            """,
        ),
        Record(
            "instance:trainguard_run_active_ranks:sum",
            """
            sum by (${target_labels}) (run:trainguard_run_active_ranks:count)
            or
            max by (${target_labels}) (trainguard_exporter_build_info) * 0
            """,
        ),
        Record(
            "run:trainguard_run_step:max",
            "max by (${target_labels}, run) (trainguard_run_step)",
        ),
        # A live, unfinished rank's age of its last step, by the exporter's clock (skew-free).
        Record(
            "run_rank:trainguard_run_step_age_seconds:running",
            """
            max by (${target_labels}, run, rank) (
              trainguard_run_step_age_seconds
              and on (${target_labels}, run, rank) trainguard_run_process_up == 1
              unless on (${target_labels}, run, rank) trainguard_run_finished == 1
            )
            """,
        ),
        # An interval between two steps that just ended within one process: the highest step
        # age seen within stall_gap_lookback, recorded while the age is below it (a step came),
        # the process has been up longer than that lookback and longer than the interval. A
        # hang that ended with a kill has no such step: its ages stop with the process
        # (process_up 0), and the relaunch's first steps are within a lookback of its start or
        # shorter than its uptime, so the hang is never learned as the run's pace.
        Record(
            "run_rank:trainguard_run_step_interval_seconds:completed",
            """
            max_over_time(run_rank:trainguard_run_step_age_seconds:running[${stall_gap_lookback}])
            > run_rank:trainguard_run_step_age_seconds:running
            unless on (${target_labels}, run, rank)
              max by (${target_labels}, run, rank) (trainguard_run_start_age_seconds)
              <= ${stall_gap_lookback_s}
            unless on (${target_labels}, run, rank)
              max_over_time(run_rank:trainguard_run_step_age_seconds:running[${stall_gap_lookback}])
              >= on (${target_labels}, run, rank)
              max by (${target_labels}, run, rank) (trainguard_run_start_age_seconds)
            """,
        ),
        # The rank's longest completed interval between two steps in the window. While the rank
        # stalls nothing new is completed, and the threshold keeps the pace it had before.
        Record(
            "run_rank:trainguard_run_step_gap_seconds:max",
            """
            max_over_time(run_rank:trainguard_run_step_interval_seconds:completed[${stall_window}])
            """,
        ),
        # How long the rank may go without a step: stall_factor x its longest recent interval
        # between steps, within [stall, stall_max]; stall_max while that interval is unknown.
        Record(
            "run_rank:trainguard_run_stall_threshold_seconds:clamp",
            """
            clamp(
              ${stall_factor}
                * last_over_time(run_rank:trainguard_run_step_gap_seconds:max[${stall_max}]),
              ${stall_s},
              ${stall_max_s}
            )
            or
            run_rank:trainguard_run_step_age_seconds:running * 0 + ${stall_max_s}
            """,
        ),
        # Steps per second of a live, unfinished rank, within its current process only (the
        # process has been up for the whole window: a resume, whose step goes down, is never in
        # it). deriv() and not rate(): the step is a gauge. A rank whose longest recent interval
        # leaves fewer than throughput_min_steps steps in throughput_window (slow steps) is
        # judged over throughput_window_slow: over a window of 0-2 steps deriv() is noise.
        Record(
            "run_rank:trainguard_run_steps_per_second:deriv",
            """
            max by (${target_labels}, run, rank) (
              clamp_min(deriv(trainguard_run_step[${throughput_window}]), 0)
              and on (${target_labels}, run, rank)
                trainguard_run_start_age_seconds > ${throughput_window_s}
              and on (${target_labels}, run, rank) trainguard_run_process_up == 1
              unless on (${target_labels}, run, rank) trainguard_run_finished == 1
              unless on (${target_labels}, run, rank)
                SLOW
            )
            or
            max by (${target_labels}, run, rank) (
              clamp_min(deriv(trainguard_run_step[${throughput_window_slow}]), 0)
              and on (${target_labels}, run, rank)
                trainguard_run_start_age_seconds > ${throughput_window_slow_s}
              and on (${target_labels}, run, rank) trainguard_run_process_up == 1
              unless on (${target_labels}, run, rank) trainguard_run_finished == 1
              and on (${target_labels}, run, rank)
                SLOW
            )
            """.replace("SLOW", SLOW_PACE),
        ),
        # Prometheus' time at which the run's log file got its current mtime (first seen with
        # it): the log's quiet time by Prometheus' clock, whatever the clocks of the training
        # host or the file server, for TrainingLogStale to judge a slow run at its own pace.
        # Kept from its own previous value while the mtime is the one seen last (next rule).
        Record(
            "run:trainguard_run_log_unchanged_since_timestamp_seconds:time",
            """
            (
              last_over_time(
                run:trainguard_run_log_unchanged_since_timestamp_seconds:time[${stall_gap_lookback}]
              )
              and on (${target_labels}, run)
              (
                max by (${target_labels}, run) (trainguard_run_log_modified_timestamp_seconds)
                == on (${target_labels}, run)
                last_over_time(
                  run:trainguard_run_log_modified_timestamp_seconds:max[${stall_gap_lookback}]
                )
              )
            )
            or
            max by (${target_labels}, run) (trainguard_run_log_modified_timestamp_seconds) * 0
              + time()
            """,
        ),
        Record(
            "run:trainguard_run_log_modified_timestamp_seconds:max",
            "max by (${target_labels}, run) (trainguard_run_log_modified_timestamp_seconds)",
        ),
        Record(
            "run:trainguard_run_steps_since_checkpoint:max",
            """
            clamp_min(
              run:trainguard_run_step:max
              - on (${target_labels}, run)
              max by (${target_labels}, run) (trainguard_checkpoint_last_step{location="primary"}),
              0
            )
            """,
        ),
        # The newest step the run holds intact at any of its locations (primary or mirror).
        Record(
            "run:trainguard_checkpoint_last_step:max",
            "max by (${target_labels}, run) (trainguard_checkpoint_last_step)",
        ),
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
        # OOMs (or OOM memory snapshots) of a rank within oom_recent. increase() needs two
        # samples, so an OOM counter above 0 in a process younger than oom_recent counts too
        # (the counter resets with each process: a relaunch that OOMs in its first batch shows
        # 1 at its first sample, as the dead process's series did), and so does a counter that
        # did not exist oom_recent ago while Prometheus was scraping the exporter then (not an
        # old count seen by a Prometheus just started). Comparisons with the past match on the
        # series' identity only (on/by), never on labels of the scrape such as a Kubernetes
        # `pod`, which a rollout of the exporter changes.
        Record(
            "run_rank:trainguard_run_allocator_ooms:recent",
            """
            sum by (${target_labels}, run, rank) (
              increase(trainguard_run_allocator_ooms_total[${oom_recent}]) > 0
              or increase(trainguard_run_memory_snapshots_total[${oom_recent}]) > 0
              or (
                max by (${target_labels}, run, rank, device) (trainguard_run_allocator_ooms_total)
                  > 0
                and on (${target_labels}, run, rank)
                  max by (${target_labels}, run, rank) (trainguard_run_start_age_seconds)
                  < ${oom_recent_s}
              )
              or (
                (
                  max by (${target_labels}, run, rank, device) (trainguard_run_allocator_ooms_total)
                    > 0
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
        # Xid errors counted within the window, per GPU and code. The counter is the exporter's
        # count since it started, and a code's series appears with its first event, which
        # increase() cannot see (it needs two samples): a series that exists now and did not
        # a window ago is news too, provided Prometheus was scraping the target then (else it
        # is a count seen again after the target was unreachable, or by a new Prometheus).
        # "Exists now" is "had a sample within the window" (max_over_time): after an Xid 79 or
        # 119 NVML may hang on the GPU, the GPU collector's series (this counter's included)
        # vanish, and the critical page must stay for its window, not resolve a minute later.
        Record(
            "gpu:trainguard_gpu_xid_errors:recent",
            """
            max by (${target_labels}, gpu, uuid, xid) (
              increase(trainguard_gpu_xid_errors_total[${xid_window}]) > 0
              or
              (
                max by (${target_labels}, gpu, uuid, xid) (
                  max_over_time(trainguard_gpu_xid_errors_total[${xid_window}])
                )
                unless on (${target_labels}, gpu, uuid, xid)
                  trainguard_gpu_xid_errors_total offset ${xid_window}
              )
              and on (${target_labels}) (up offset ${xid_window} == 1)
              or
              # a count exported now by an exporter that restarted within the window (its
              # process start time changed): counted since that restart, so news, even where
              # the same code's series existed a window ago (the same Xid again after a node
              # or exporter restart)
              max by (${target_labels}, gpu, uuid, xid) (trainguard_gpu_xid_errors_total)
              and on (${target_labels})
                max by (${target_labels}) (
                  changes(process_start_time_seconds[${xid_window}])
                ) > 0
            )
            """,
        ),
    ),
)

# The long-range recording rules ([7d] changes, max_over_time, min_over_time): mixin style, in a
# group of their own evaluated every slow_rules_interval (5m), not every 15 s. Their readers look
# back three intervals (last_over_time(...[${slow_rules_lookback}])), so the gap between two
# evaluations, or a late one, is never an absent series.
SLOW = Group(
    "trainguard.rules.slow",
    interval="${slow_rules_interval}",
    rules=(
        # A rank's usual step rate: the 90th percentile over throughput_baseline (6h), which
        # TrainingThroughputDropped compares the rate now with. Recorded here, not in the
        # alert: sorting 6 hours of samples per rank every 15 s was the costliest rule of the
        # set at fleet scale (bench/RESULTS.md, "Fleet scale").
        Record(
            "run_rank:trainguard_run_steps_per_second:baseline_p90",
            """
            quantile_over_time(
              0.9, run_rank:trainguard_run_steps_per_second:deriv[${throughput_baseline}]
            )
            """,
        ),
        # The location's usual interval between successful saves (alerts/rules/saves.py).
        Record(
            "run_location:trainguard_checkpoint_save_interval_seconds:avg",
            """
            max by (${target_labels}, run, location) (
              (
                max_over_time(
                  trainguard_checkpoint_last_save_success_timestamp_seconds[${checkpoint_cadence_window}]
                )
                - min_over_time(
                  trainguard_checkpoint_last_save_success_timestamp_seconds[${checkpoint_cadence_window}]
                )
              )
              / (
                changes(
                  trainguard_checkpoint_last_save_success_timestamp_seconds[${checkpoint_cadence_window}]
                ) > 0
              )
            ) > 0
            """,
        ),
        Record(
            "run:trainguard_checkpoint_step_cadence:avg",
            """
            max by (${target_labels}, run) (
              (
                max_over_time(
                  trainguard_checkpoint_last_step{location="primary"}[${checkpoint_cadence_window}]
                )
                - min_over_time(
                  trainguard_checkpoint_last_step{location="primary"}[${checkpoint_cadence_window}]
                )
              )
              / (
                changes(
                  trainguard_checkpoint_last_step{location="primary"}[${checkpoint_cadence_window}]
                ) > 0
              )
            ) > 0
            """,
        ),
    ),
)
