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

#: PromQL: a rank that ``trainguard stop`` stopped on purpose (its stop record names the very
#: process that ended, docs/metrics.md#stopped-on-purpose): ended, as a finished rank, never a
#: death; a SIGTERM nobody vouched for reads ``cause="signal"`` instead
ON_PURPOSE = 'trainguard_run_exit_info{cause="on_purpose"}'

#: a rank's process in one series: 1 alive and not finished, 0 gone without finishing, 2
#: ended: finished, or stopped on purpose (absent while starting, as process_up is). Recorded
#: early in GROUP, so that the rules asking "live and unfinished?" read one series instead of
#: joining process_up and finished each time: at 100 nodes each read of an 800-series metric
#: costs ~10 ms of Prometheus' CPU (bench/RESULTS.md, "Fleet scale, fifth pass").
STATE = "run_rank:trainguard_run_process_state:max"
#: the live, unfinished ranks, to join on (target labels, run, rank)
LIVE = STATE + " == 1"

#: series whose last value TrainingProcessDied and TrainguardExporterDown read over
#: exporter_down_active_lookback (1d) for an exporter that has been down (alerts/rules/runs.py,
#: exporter.py), and the slow group's records of that value (:func:`last_seen`)
LAST_SEEN = {
    STATE: "run_rank:trainguard_run_process_state:last_seen",
    "trainguard_run_job_info": "run_rank:trainguard_run_job_info:last_seen",
    # whether a target that vanished from discovery was up, and the ranks it watched when last
    # seen: TrainguardExporterDown's and TrainingProcessDied's day of samples per target
    "up{${job_selector}}": "instance:trainguard_up:last_seen",
    "instance:trainguard_run_active_ranks:sum": "instance:trainguard_run_active_ranks:last_seen",
}


def last_seen(series: str) -> str:
    """The last value of ``series`` within exporter_down_active_lookback, cheaply.

    The series itself over slow_rules_lookback, else the slow group's record of its last value
    over the whole lookback (LAST_SEEN). A series absent for longer than slow_rules_lookback
    does not change, so the slow group's newest record of it (at most one interval old, and
    evaluated after the series ended) is its last value. The exact ``last_over_time(x[1d])``
    read a day of samples of every rank every 15 s: 110 ms of TrainingProcessDied's 150 ms at
    100 nodes (bench/RESULTS.md, "Fleet scale"). Only where a series ended more than
    exporter_down_active_lookback ago does this differ: it is seen up to slow_rules_lookback
    longer.
    """
    return (
        "(last_over_time(" + series + "[${slow_rules_lookback}])"
        " or last_over_time(" + LAST_SEEN[series] + "[${slow_rules_lookback}]))"
    )


#: PromQL, one series per target (its ``${target_labels}``): the targets whose exporter has been
#: down for exporter_down_for, failing its scrapes or gone from service discovery (its last
#: ``up`` within exporter_down_active_lookback): where the series of its ranks went stale with it
#: and their last values are all that is known
TARGET_DOWN = (
    """(
  (
    max by (${target_labels}) (up{${job_selector}} == 0)
    or
    (
      max by (${target_labels}) ("""
    + last_seen("up{${job_selector}}")
    + """)
      unless on (${target_labels}) up{${job_selector}}
    )
  )
  unless on (${target_labels})
  max by (${target_labels}) (
    max_over_time(up{${job_selector}}[${exporter_down_for}])
  ) == 1
)"""
)


#: the rank's steps per second over throughput_window_slow (1h), within its process: the rate of
#: a rank of slow steps, recorded in SLOW (a 1h deriv of every rank every 15 s for the few of
#: slow steps); read with last_over_time, it is up to 5m older, on a window of an hour
SLOW_RATE = "run_rank:trainguard_run_steps_per_second:deriv_slow"
#: a GPU's least unattributed memory over released_lookback (1h): GPUMemoryNotReleased's level
#: of the GPU while its runs trained (alerts/rules/gpu_health.py), recorded in SLOW
UNATTRIBUTED_MIN = "gpu:trainguard_gpu_memory_unattributed_bytes:min"

#: the finished ranks, read twice by STATE: recorded just before it, and empty on a fleet at
#: work, so that STATE reads every rank's ``finished`` once instead of twice
FINISHED = "run_rank:trainguard_run_finished:one"

GROUP = Group(
    "trainguard.rules",
    snippets={"live": LIVE, "on_purpose": ON_PURPOSE, "finished": FINISHED},
    rules=(
        Record(FINISHED, "trainguard_run_finished == 1"),
        Record(
            STATE,
            """
            max by (${target_labels}, run, rank) (
              trainguard_run_process_up
              unless on (${target_labels}, run, rank) ${finished}
              unless on (${target_labels}, run, rank) ${on_purpose}
              or
              ${finished} + 1
              or
              ${on_purpose} + 1
            )
            """,
        ),
        Record(
            "run:trainguard_run_active_ranks:count",
            "count by (${target_labels}, run) (" + LIVE + ")",
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
              trainguard_run_step_age_seconds and on (${target_labels}, run, rank) ${live}
            )
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
        # The rank's longest completed interval between two steps in the window. While the rank
        # stalls nothing new is completed, and the threshold keeps the pace it had before.
        # Recorded here, every slow_rules_interval (5m), not every 15 s (a max_over_time over
        # 6h per rank): its readers look back stall_max (4h) anyway. A newly completed longer
        # interval raises the stall threshold up to 5m later; the threshold is at least stall
        # (10m), so the next interval cannot be judged on the old pace before it is known.
        Record(
            "run_rank:trainguard_run_step_gap_seconds:max",
            """
            max_over_time(run_rank:trainguard_run_step_interval_seconds:completed[${stall_window}])
            """,
        ),
        Record(
            SLOW_RATE,
            """
            clamp_min(deriv(trainguard_run_step[${throughput_window_slow}]), 0)
            and on (${target_labels}, run, rank)
              trainguard_run_start_age_seconds > ${throughput_window_slow_s}
            """,
        ),
        Record(
            UNATTRIBUTED_MIN,
            """
            min by (${target_labels}, gpu, uuid) (
              min_over_time(trainguard_gpu_memory_unattributed_bytes[${released_lookback}])
            )
            """,
        ),
        # TrainingProcessDied's and TrainguardExporterDown's last values of their series, for an
        # exporter that has been down (last_seen()): read once every slow_rules_interval
        # instead of every 15 s.
        *(
            Record(record, "last_over_time(" + series + "[${exporter_down_active_lookback}])")
            for series, record in LAST_SEEN.items()
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
