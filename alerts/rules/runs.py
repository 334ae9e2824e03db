"""Is the training run alive and making progress? TrainingProcessDied, TrainingStalled,
TrainingLogStale."""

from __future__ import annotations

from alerts.rules.common import RUN_ARGS, RUN_SEL, Alert, Group, query_value

SNIPPETS = {
    # "0, 3": the ranks of the run that are gone without finishing.
    "dead_ranks": (
        "{{ range $i, $s := printf `trainguard_run_process_up{" + RUN_SEL + "} == 0 "
        "unless on (job, instance, run, rank) trainguard_run_finished == 1` "
        + RUN_ARGS
        + ' | query | sortByLabel "rank" }}'
        '{{ if $i }}, {{ end }}{{ or $s.Labels.rank "-" }}{{ end }}'
    ),
    "last_step": query_value("max(trainguard_run_step{" + RUN_SEL + "})", RUN_ARGS),
    "checkpoint_step": query_value(
        "max(trainguard_checkpoint_last_step{" + RUN_SEL + ',location="primary"})',
        RUN_ARGS,
        unknown="none known",
    ),
    # A whole sentence: whether the driver still holds VRAM of the dead ranks.
    "dead_vram": (
        "{{ with printf `sum(trainguard_run_gpu_memory_used_bytes{" + RUN_SEL + "} "
        "and on (job, instance, run, rank) trainguard_run_process_up == 0) > 0` "
        + RUN_ARGS
        + " | query }}The driver still attributes "
        "{{ . | first | value | humanize1024 }}B of VRAM to the dead rank(s): "
        "not released yet, or a defunct process holds it."
        "{{ else }}No driver-view VRAM is attributed to the dead rank(s).{{ end }}"
    ),
}

GROUP = Group(
    "trainguard-runs",
    snippets=SNIPPETS,
    rules=(
        Alert(
            "TrainingProcessDied",
            "critical",
            expr="""
            count by (job, instance, run) (
              trainguard_run_process_up == 0
              unless on (job, instance, run, rank) trainguard_run_finished == 1
            )
            """,
            keep_firing_for="${keep_firing_for}",
            summary="Training run {{ $labels.run }} died on {{ $labels.instance }}.",
            description="""
            {{ $value }} rank(s) of run {{ $labels.run }} on {{ $labels.instance }}
            are gone without a clean exit (no live process with the recorded PID and create
            time): rank(s) ${dead_ranks}. Last step ${last_step}; newest complete primary
            checkpoint at step ${checkpoint_step}. ${dead_vram}
            """,
        ),
        Alert(
            "TrainingStalled",
            "warning",
            expr="""
            max by (job, instance, run) (
              (
                (
                  time() - (trainguard_run_heartbeat_timestamp_seconds > 0) > ${stall_s}
                )
                or
                (
                  (changes(trainguard_run_step[${stall}]) == 0) + ${stall_s}
                  and min_over_time(trainguard_run_process_up[${stall}]) == 1
                  and trainguard_run_step offset ${stall}
                )
              )
              and on (job, instance, run, rank) trainguard_run_process_up == 1
              unless on (job, instance, run, rank) trainguard_run_finished == 1
            )
            """,
            for_="2m",
            summary="""
            Training run {{ $labels.run }} on {{ $labels.instance }} is alive but not
            progressing.
            """,
            description="""
            The process of run {{ $labels.run }} on {{ $labels.instance }} is alive, but
            a rank has made no progress (no new step, or no new heartbeat) for at least
            {{ $value | humanizeDuration }} (threshold ${stall}). Last step ${last_step}.
            """,
        ),
        Alert(
            "TrainingLogStale",
            "warning",
            expr="""
            (time() - (trainguard_run_log_modified_timestamp_seconds > 0)) > ${log_stale_s}
            and on (job, instance, run) run:trainguard_run_active_ranks:count > 0
            """,
            for_="2m",
            summary="The log of training run {{ $labels.run }} on {{ $labels.instance }} is stale.",
            description="""
            The log file of run {{ $labels.run }} on {{ $labels.instance }} has not been
            modified for {{ $value | humanizeDuration }} (threshold ${log_stale}) although its
            process is alive. The run may be hung, or logging to somewhere else.
            """,
        ),
    ),
)
