"""Saves that fail while the run trains on: CheckpointSavesFailing.

A script that catches a failed save (``except OSError: log.warning(...)``) keeps training on
the promise of a checkpoint that is not there. The checkpoint library and the framework
integrations count every save's outcome (``trainguard.checkpoint.outcomes``); this pages when
a location's last save failed and none succeeded since, or when none has succeeded for
``saves_overdue_factor`` x its usual interval between successful saves, while the run steps.
"""

from __future__ import annotations

from alerts.kinds import DURATION, NUMBER, Threshold
from alerts.rules.common import Alert, Group, query_value

THRESHOLDS: tuple[Threshold, ...] = (
    Threshold(
        "saves_failing_for",
        "5m",
        DURATION,
        "CheckpointSavesFailing: how long the last save must stay failed (no success since) "
        "before it pages; a retry that succeeds within it pages nothing.",
    ),
    Threshold(
        "saves_stepping_window",
        "15m",
        DURATION,
        "CheckpointSavesFailing: the run counts as training when its step advanced within this "
        "window (a run that stopped is the death and stall alerts' business).",
    ),
    Threshold(
        "saves_overdue_factor",
        2,
        NUMBER,
        "CheckpointSavesFailing: no save succeeded for this many times the location's usual "
        "interval between successful saves (learned over checkpoint_cadence_window), counted "
        "from the later of the last success and the current process's start.",
    ),
    Threshold(
        "saves_overdue_min",
        "10m",
        DURATION,
        "CheckpointSavesFailing: ...and for at least this long, however often the run saves.",
    ),
)

#: an annotation query's selector of the alert's location: on the alert's node, or on every node
#: of the job for a job's alert (which has no instance)
LOC_SEL = "${target_labels_across_sel},instance=~%q,run=%q,location=%q"
LOC_ARGS = '${target_labels_across_args} (or $labels.instance ".*") $labels.run $labels.location'

#: the runs that are jobs (a rank names its job): their saves are judged across the job's nodes
JOB_RUNS = "group by (${target_labels_across}, run) (trainguard_run_job_info)"


def failing(by: str) -> str:
    """PromQL: the locations whose saves fail while the run trains, by ``by``, run and location.

    The last save failed and none succeeded since (or ever), or none succeeded for
    ``saves_overdue_factor`` x the usual interval, counted from the later of the last success
    and the current process's start (a run resumed after a long stop had no chance yet). Both
    on the exporters' ages, each measured on its own host: which outcome is newer, and how long
    ago, whatever the hosts' clocks, on one node or across a job's nodes (every rank records a
    failure, only the one that writes records the success: a success on any node of the job
    clears an older failure on any other).
    """
    g = by + ", run, location"
    failure_age = "min by (" + g + ") (trainguard_checkpoint_last_save_failure_age_seconds)"
    success_age = "min by (" + g + ") (trainguard_checkpoint_last_save_success_age_seconds)"
    start_age = "min by (" + by + ", run) (trainguard_run_start_age_seconds)"
    interval = (
        "max by (" + g + ") (last_over_time("
        "run_location:trainguard_checkpoint_save_interval_seconds:avg[${slow_rules_lookback}]))"
    )
    on_run = "on (" + by + ", run)"
    return (
        "(\n"
        # the newest outcome a failure (on this node, or on any node of the job)
        "  " + failure_age + "\n"
        "  < (" + success_age + " or " + failure_age + " + 1)\n"
        "or\n"
        # none succeeded for factor x the usual interval, from the later of success and start
        "  (\n"
        "    " + success_age + " < " + on_run + " group_left () " + start_age + "\n"
        "    or " + success_age + " * 0 + " + on_run + " group_left () " + start_age + "\n"
        "  )\n"
        "  > clamp_min(${saves_overdue_factor} * " + interval + ", ${saves_overdue_min_s})\n"
        ")\n"
        # the run steps and has a live rank (on any of the job's nodes: ``and`` keeps a
        # location wherever one of its run's series matches)
        "and " + on_run + " changes(run:trainguard_run_step:max[${saves_stepping_window}]) > 0\n"
        "and " + on_run + " run:trainguard_run_active_ranks:count"
    )


SNIPPETS = {
    "failing_on_node": failing("${target_labels}"),
    "failing_in_job": failing("${target_labels_across}"),
    "job_runs": JOB_RUNS,
    # "enospc 3, other 1": the failures of the last hour by reason
    "reasons": (
        "{{ range $i, $s := printf `sum by (${target_labels}, reason) (increase("
        "trainguard_checkpoint_save_failures_total{"
        + LOC_SEL
        + "}[1h])) > 0` "
        + LOC_ARGS
        + ' | query | sortByLabel "reason" }}{{ if $i }}, {{ end }}{{ $s.Labels.reason }} '
        '{{ $s.Value | printf "%.0f" }}{{ else }}none counted in the last hour{{ end }}'
    ),
    "since_success": query_value(
        "min(trainguard_checkpoint_last_save_success_age_seconds{" + LOC_SEL + "})",
        LOC_ARGS,
        "humanizeDuration",
        suffix=" ago",
        unknown="never (no save has succeeded)",
    ),
    "interval": query_value(
        "last_over_time(run_location:trainguard_checkpoint_save_interval_seconds:avg{"
        + LOC_SEL
        + "}[${slow_rules_lookback}])",
        LOC_ARGS,
        "humanizeDuration",
        unknown="not learned yet",
    ),
}

GROUP = Group(
    "trainguard-saves",
    run_context=True,
    snippets=SNIPPETS,
    rules=(
        Alert(
            "CheckpointSavesFailing",
            "critical",
            # a lone run on its node; a job's run across its nodes (one alert for the job)
            expr="""
            (
              ${failing_on_node}
            )
            unless on (${target_labels_across}, run) ${job_runs}
            or
            (
              ${failing_in_job}
            )
            and on (${target_labels_across}, run) ${job_runs}
            """,
            for_="${saves_failing_for}",
            keep_firing_for="${keep_firing_for}",
            summary="""
            Checkpoint saves of run {{ $labels.run }} at {{ $labels.location }} are failing
            while it trains on.
            """,
            description="""
            Run {{ $labels.run }} on ${run_host} keeps stepping, but its saves at
            location {{ $labels.location }} do not complete: the last one failed with no
            success since, or none has succeeded for ${saves_overdue_factor}x its usual
            interval (${interval}). Last success: ${since_success}. Failures in the last
            hour by reason: ${reasons}. Everything trained since the last complete checkpoint
            is lost if the run dies now.
            """,
        ),
    ),
)
