"""Alerts on whether the training run is alive and making progress.

TrainingProcessDied, TrainingStalled, TrainingNoFirstStep, TrainingLogStale;
TrainingThroughputDropped is evaluated with the step rate it reads, in ``pace.py``.

The ranks of a job of many nodes (``trainguard_run_job_info``) are judged per job, not per node,
for deaths and stalls: ``jobs/deaths.py`` and ``jobs/stall.py`` page once for the whole job.

Progress is judged by ages the exporter measures on the trainer's own clock and by changes()
of scraped series (Prometheus's clock), never by time() minus a timestamp the trainer wrote: a
trainer clock off by an hour must not page a healthy run.
"""

from __future__ import annotations

from alerts.kinds import DURATION, NUMBER, Threshold
from alerts.rules.common import LAST_STEP, RUN_ARGS, RUN_SEL, Alert, Group, promql, query_value
from alerts.rules.deaths import DIED_LABELS
from alerts.rules.gpu_health import GPU_CAUSE
from alerts.rules.recording import LIVE, ON_PURPOSE, STATE, TARGET_DOWN, last_seen
from alerts.rules.signals import STOPPED
from alerts.rules.stuck import STUCK_ANNOTATION

THRESHOLDS: tuple[Threshold, ...] = (
    Threshold(
        "stall",
        "10m",
        DURATION,
        "TrainingStalled: the least time without a new step (or without a heartbeat) that is a "
        "stall, however fast the run steps.",
    ),
    Threshold(
        "stall_factor",
        3,
        NUMBER,
        "TrainingStalled: a run is stalled after this many times its longest recent interval "
        "between two steps (its own pace: slow steps are not a stall)...",
    ),
    Threshold(
        "stall_window",
        "6h",
        DURATION,
        "TrainingStalled: ...the longest interval between steps seen within this window "
        "(recording rule run_rank:trainguard_run_step_gap_seconds:max)...",
    ),
    Threshold(
        "stall_gap_lookback",
        "5m",
        DURATION,
        "TrainingStalled: ...an interval counts once it ended with a step of the same process, "
        "seen within this long (more than twice pace_rules_interval, whose group records it) "
        "by a process up "
        "longer than this and longer than the interval: a hang that ended with a kill and a "
        "relaunch never teaches the pace...",
    ),
    Threshold(
        "stall_max",
        "4h",
        DURATION,
        "TrainingStalled: ...but never more than this, which is also the threshold while the "
        "run's pace is not known yet (before it completed an interval between two steps).",
    ),
    Threshold(
        "first_step",
        "1h",
        DURATION,
        "TrainingNoFirstStep: a live process that has reported no step this long after it "
        "started (NCCL rendezvous, data loader, checkpoint loading hung).",
    ),
    Threshold(
        "throughput_ratio",
        0.5,
        NUMBER,
        "TrainingThroughputDropped: a live run stepping at less than this fraction of its usual "
        "rate...",
    ),
    Threshold(
        "throughput_window",
        "10m",
        DURATION,
        "TrainingThroughputDropped: ...its rate now being deriv(step) over this window, within "
        "the current process (a just started or resumed process has no rate for this long)...",
    ),
    Threshold(
        "throughput_min_steps",
        10,
        NUMBER,
        "TrainingThroughputDropped: ...unless the rank's longest recent interval between steps "
        "leaves fewer than this many steps in throughput_window (slow steps: a window holding "
        "0-2 steps is no rate)...",
    ),
    Threshold(
        "throughput_window_slow",
        "1h",
        DURATION,
        "TrainingThroughputDropped: ...then its rate is deriv(step) over this window instead, "
        "within the current process...",
    ),
    Threshold(
        "throughput_baseline",
        "6h",
        DURATION,
        "TrainingThroughputDropped: ...its usual rate the 90th percentile of that rate over "
        "this window (earlier processes of the run included: a slower relaunch counts)...",
    ),
    Threshold(
        "throughput_for",
        "15m",
        DURATION,
        "TrainingThroughputDropped: ...for this long.",
    ),
    Threshold(
        "log_stale",
        "30m",
        DURATION,
        "TrainingLogStale: the run's log file not modified for this long (by Prometheus's "
        "clock: no change of its mtime) while the run is alive, and was alive this long ago; "
        "a run whose learned stall threshold is longer (slow steps, logging once per step) "
        "is judged on that threshold instead.",
    ),
)

#: TrainingProcessDied while its exporter is down (failing its scrapes, or gone from service
#: discovery): the ranks last seen dead and not finished (the process state's last value), not
#: stopped by a signal, not a job's (TrainingJobRankDied's), once it has been down for
#: exporter_down_for (a shorter gap is keep_firing_for's). Their series went stale with the
#: exporter, so the death page would resolve though nothing new is known; it stays until the
#: exporter is back and says. The last values over exporter_down_active_lookback (1d) come from
#: recording.last_seen().
DEAD_WHEN_LAST_SEEN = promql(
    """
    (
      (${state_last_seen}) == 0
      unless on (${target_labels}, run, rank)
        last_over_time(
          trainguard_run_exit_info{cause=~"signal|time_limit"}[${exporter_down_active_lookback}]
        )
      unless on (${target_labels}, run, rank)
        ${job_info_last_seen}
      and on (${target_labels})
      ${target_down}
    )
    """
)

SNIPPETS = {
    # PromQL: what TrainingProcessDied reads of an exporter that has been down, a live rank
    "dead_when_last_seen": DEAD_WHEN_LAST_SEEN,
    "state_last_seen": last_seen(STATE),
    "job_info_last_seen": last_seen("trainguard_run_job_info"),
    "target_down": TARGET_DOWN,
    "live": LIVE,
    "stopped": STOPPED,
    "on_purpose": ON_PURPOSE,
    # "0, 3": the ranks of the run that are gone without finishing.
    "dead_ranks": (
        "{{ range $i, $s := printf `trainguard_run_process_up{" + RUN_SEL + "} == 0 "
        "unless on (${target_labels}, run, rank) trainguard_run_finished == 1 "
        "unless on (${target_labels}, run, rank) ${on_purpose} "
        "unless on (${target_labels}, run, rank) trainguard_run_job_info` "
        + RUN_ARGS
        + ' | query | sortByLabel "rank" }}'
        '{{ if $i }}, {{ end }}{{ or $s.Labels.rank "-" }}{{ end }}'
    ),
    "last_step": LAST_STEP,
    # "newest complete primary checkpoint at step 400", or that there is none
    "checkpoint_at": query_value(
        "max(trainguard_checkpoint_last_step{" + RUN_SEL + ',location="primary"})',
        RUN_ARGS,
        fmt='printf "newest complete primary checkpoint at step %.0f"',
        unknown="no complete primary checkpoint known",
    ),
    "stall_threshold": query_value(
        "max(run_rank:trainguard_run_stall_threshold_seconds:clamp{" + RUN_SEL + "})",
        RUN_ARGS,
        "humanizeDuration",
        unknown="none: no step yet",
    ),
    "step_gap": query_value(
        "max(last_over_time(run_rank:trainguard_run_step_gap_seconds:max{"
        + RUN_SEL
        + "}[${stall_max}]))",
        RUN_ARGS,
        "humanizeDuration",
        unknown="not known yet",
    ),
    # A whole sentence, only while the exporter is down: the page is what it last saw.
    "unreachable": (
        "{{ with printf `up{${target_labels_sel}} == 0` ${target_labels_args} | query }} The "
        "exporter has failed its scrapes since: the rank(s) were dead when last seen, and the "
        "page holds until it is back.{{ end }}"
    ),
    # A whole sentence: whether the driver still holds VRAM of the dead ranks.
    "dead_vram": (
        "{{ with printf `sum(trainguard_run_gpu_memory_used_bytes{" + RUN_SEL + "} "
        "and on (${target_labels}, run, rank) trainguard_run_process_up == 0) > 0` "
        + RUN_ARGS
        + " | query }}The driver still attributes "
        "{{ . | first | value | humanize1024 }}B of VRAM to the dead rank(s): "
        "not released yet, or a defunct process holds it."
        "{{ else }}No driver-view VRAM is attributed to the dead rank(s).{{ end }}"
    ),
}

GROUP = Group(
    "trainguard-runs",
    run_context=True,
    snippets=SNIPPETS,
    rules=(
        Alert(
            "TrainingProcessDied",
            "critical",
            expr="""
            count by (${target_labels}, run) (
              trainguard_run_process_up == 0
              unless on (${target_labels}, run, rank) trainguard_run_finished == 1
              # stopped on purpose (trainguard stop): ended, no page
              unless on (${target_labels}, run, rank) ${on_purpose}
              unless on (${target_labels}, run, rank) (
                ${stopped}
              )
              unless on (${target_labels}, run, rank) trainguard_run_job_info
              or
              ${dead_when_last_seen}
            )
            """,
            # STOPPED: stopped by a signal, a warning for a while
            keep_firing_for="${keep_firing_for}",
            labels=DIED_LABELS,
            summary="Training run {{ $labels.run }} died on ${run_host}.",
            description="""
            {{ $value }} rank(s) of run {{ $labels.run }} on ${run_host}
            are gone without a clean exit (no live process with the recorded PID and create
            time): rank(s) ${dead_ranks}. Last step ${last_step}; ${checkpoint_at}.
            ${dead_vram}${unreachable}
            """,
        ),
        Alert(
            "TrainingStalled",
            "warning",
            expr="""
            max by (${target_labels}, run) (
              (
                run_rank:trainguard_run_step_age_seconds:running
                  > run_rank:trainguard_run_stall_threshold_seconds:clamp
                or
                (
                  trainguard_run_heartbeat_age_seconds > ${stall_s}
                  and on (${target_labels}, run, rank) ${live}
                )
              )
              # a job's ranks: one alert for the job (TrainingJobStalled, jobs/stall.py)
              unless on (${target_labels}, run, rank) trainguard_run_job_info
            )
            """,
            for_="2m",
            keep_firing_for="${keep_firing_for}",
            summary="""
            Training run {{ $labels.run }} on ${run_host} is alive but not
            progressing.
            """,
            description="""
            The process of run {{ $labels.run }} on ${run_host} is alive, but
            a rank has made no progress for {{ $value | humanizeDuration }}: no new step
            within its stall threshold (${stall_threshold}), or no new heartbeat within
            ${stall}. The threshold is ${stall_factor}x the run's longest recent interval
            between steps (${step_gap}), at least ${stall} and at most ${stall_max}
            (${stall_max} until that interval is known). Last step ${last_step}.
            """,
            # what its GPUs say (gpu_health.py); where its ranks are, on every node (stuck.py)
            annotations={"gpu_cause": GPU_CAUSE, "stuck": STUCK_ANNOTATION},
        ),
        Alert(
            "TrainingNoFirstStep",
            "warning",
            expr="""
            max by (${target_labels}, run) (
              trainguard_run_start_age_seconds > ${first_step_s}
              and on (${target_labels}, run, rank) ${live}
              unless on (${target_labels}, run, rank) trainguard_run_step
              unless on (${target_labels}, run, rank)
                trainguard_run_heartbeat_age_seconds > ${stall_s}
              # a job's ranks: one alert for the job (TrainingJobNoFirstStep, jobs/stall.py)
              unless on (${target_labels}, run, rank) trainguard_run_job_info
            )
            """,
            keep_firing_for="${keep_firing_for}",
            summary="""
            Training run {{ $labels.run }} on ${run_host} has made no step since it
            started.
            """,
            description="""
            A process of run {{ $labels.run }} on ${run_host} started
            {{ $value | humanizeDuration }} ago (threshold ${first_step}) and is alive, its
            reporter writes heartbeats, but it has not reported a single step: hung before
            training started (NCCL rendezvous or init, a data loader, loading a checkpoint).
            """,
            annotations={"stuck": STUCK_ANNOTATION},  # where its ranks are (stuck.py)
        ),
        Alert(
            "TrainingLogStale",
            "warning",
            expr="""
            max by (${target_labels}, run) (
              max_over_time(trainguard_run_log_modified_timestamp_seconds[${log_stale}])
            )
            == max by (${target_labels}, run) (
              min_over_time(trainguard_run_log_modified_timestamp_seconds[${log_stale}])
            )
            and max by (${target_labels}, run) (trainguard_run_log_modified_timestamp_seconds) > 0
            and on (${target_labels}, run)
              max by (${target_labels}, run) (
                trainguard_run_log_modified_timestamp_seconds offset ${log_stale}
              )
            and on (${target_labels}, run) run:trainguard_run_active_ranks:count > 0
            and on (${target_labels}, run) run:trainguard_run_active_ranks:count offset ${log_stale}
            unless on (${target_labels}, run) (
              time() - run:trainguard_run_log_unchanged_since_timestamp_seconds:time
              <= on (${target_labels}, run) (
                max by (${target_labels}, run) (
                  run_rank:trainguard_run_stall_threshold_seconds:clamp
                ) > ${log_stale_s}
              )
            )
            """,
            keep_firing_for="${keep_firing_for}",
            summary="The log of training run {{ $labels.run }} on ${run_host} is stale.",
            description="""
            The log file of run {{ $labels.run }} on ${run_host} has not been
            modified for at least ${log_stale} although the run is alive (and was alive
            ${log_stale} ago). The run may be hung, or logging to somewhere else.
            """,
        ),
    ),
)
