"""The run's pace: its completed intervals between steps, its step rate, and a drop in it.

Judged over minutes (a 10-minute deriv, a 5-minute peak of the step age), so evaluated every
pace_rules_interval (1m), not every 15 s: the two records were the costliest rules of
trainguard.rules at fleet scale, each reading every rank's series several times (bench/RESULTS.md,
"Fleet scale, fifth pass"). They read the 15 s group's records (the running step age, the
process state) and feed the slow group's (the longest interval, the usual rate). A completed
interval is recorded up to one interval later, a rate change seen up to one interval later: both
are minutes-scale judgements (the stall threshold is at least ``stall``, TrainingThroughputDropped
waits ``throughput_for``).
"""

from __future__ import annotations

from alerts.rules.common import RUN_ARGS, RUN_SEL, Alert, Group, Record, query_value
from alerts.rules.gpu_health import GPU_CAUSE
from alerts.rules.recording import LIVE, SLOW_PACE, SLOW_RATE

SNIPPETS = {
    # PromQL: a rank of slow steps, its rate over the longer window, a live unfinished rank
    "slow_pace": SLOW_PACE,
    "slow_rate": SLOW_RATE,
    "live": LIVE,
    "rate_now": query_value(
        "min(run_rank:trainguard_run_steps_per_second:deriv{" + RUN_SEL + "}) * 60",
        RUN_ARGS,
        'printf "%.3g"',
    ),
    "rate_usual": query_value(
        "max(last_over_time(run_rank:trainguard_run_steps_per_second:baseline_p90{"
        + RUN_SEL
        + "}[${slow_rules_lookback}])) * 60",
        RUN_ARGS,
        'printf "%.3g"',
    ),
}

GROUP = Group(
    "trainguard.rules.pace",
    interval="${pace_rules_interval}",
    run_context=True,
    snippets=SNIPPETS,
    rules=(
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
        # Steps per second of a live, unfinished rank, within its current process only (the
        # process has been up for the whole window: a resume, whose step goes down, is never in
        # it). deriv() and not rate(): the step is a gauge. A rank whose longest recent interval
        # leaves fewer than throughput_min_steps steps in throughput_window (slow steps) is
        # judged over throughput_window_slow: over a window of 0-2 steps deriv() is noise.
        Record(
            "run_rank:trainguard_run_steps_per_second:deriv",
            """
            max by (${target_labels}, run, rank) (
              (
                clamp_min(deriv(trainguard_run_step[${throughput_window}]), 0)
                and on (${target_labels}, run, rank)
                  trainguard_run_start_age_seconds > ${throughput_window_s}
                unless on (${target_labels}, run, rank)
                  ${slow_pace}
                or
                last_over_time(${slow_rate}[${slow_rules_lookback}])
                and on (${target_labels}, run, rank)
                  trainguard_run_start_age_seconds > ${throughput_window_slow_s}
                and on (${target_labels}, run, rank)
                  ${slow_pace}
              )
              # the gates both paces share, once
              and on (${target_labels}, run, rank) ${live}
            )
            """,
        ),
        Alert(
            "TrainingThroughputDropped",
            "warning",
            expr="""
            min by (${target_labels}, run) (
              (run_rank:trainguard_run_steps_per_second:deriv > 0)
              / on (${target_labels}, run, rank)
              last_over_time(
                run_rank:trainguard_run_steps_per_second:baseline_p90[${slow_rules_lookback}]
              )
            ) < ${throughput_ratio}
            """,
            for_="${throughput_for}",
            keep_firing_for="${keep_firing_for}",
            summary="""
            Training run {{ $labels.run }} on ${run_host} steps at
            {{ $value | humanizePercentage }} of its usual rate.
            """,
            description="""
            Run {{ $labels.run }} on ${run_host} has stepped at less than
            ${throughput_ratio}x its usual rate for ${throughput_for}: now ${rate_now} steps/min,
            usually ${rate_usual} (the 90th percentile over ${throughput_baseline}, earlier
            processes of the run included). The field reports' symptom of ghost GPU memory after
            crashes (a relaunched run at a fraction of its speed); also a straggler rank,
            thermal or power throttling, a slow data source or swapping.
            """,
            annotations={"gpu_cause": GPU_CAUSE},  # what its GPUs say (gpu_health.py)
        ),
    ),
)
