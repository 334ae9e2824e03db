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

LOC_SEL = "${target_labels_sel},run=%q,location=%q"
LOC_ARGS = "${target_labels_args} $labels.run $labels.location"

SNIPPETS = {
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
            # the last save failed and none succeeded since (or ever); or none succeeded for
            # factor x the usual interval, counted from the later of the last success and the
            # current process's start (a run resumed after a long stop had no chance yet). The
            # failure and success timestamps compare with each other (one host's clock); how
            # long ago they were is the exporter's age, never time() minus a host timestamp.
            expr="""
            (
              max by (${target_labels}, run, location) (
                trainguard_checkpoint_last_save_failure_timestamp_seconds
              )
              > (
                max by (${target_labels}, run, location) (
                  trainguard_checkpoint_last_save_success_timestamp_seconds
                )
                or max by (${target_labels}, run, location) (
                  trainguard_checkpoint_last_save_failure_timestamp_seconds
                ) * 0
              )
            or
              (
                  min by (${target_labels}, run, location) (
                    trainguard_checkpoint_last_save_success_age_seconds
                  )
                  < on (${target_labels}, run) group_left ()
                    min by (${target_labels}, run) (trainguard_run_start_age_seconds)
                or
                  min by (${target_labels}, run, location) (
                    trainguard_checkpoint_last_save_success_age_seconds
                  ) * 0
                  + on (${target_labels}, run) group_left ()
                    min by (${target_labels}, run) (trainguard_run_start_age_seconds)
              )
              > clamp_min(
                ${saves_overdue_factor}
                * last_over_time(
                  run_location:trainguard_checkpoint_save_interval_seconds:avg[${slow_rules_lookback}]
                ),
                ${saves_overdue_min_s}
              )
            )
            and on (${target_labels}, run)
              changes(run:trainguard_run_step:max[${saves_stepping_window}]) > 0
            and on (${target_labels}, run) run:trainguard_run_active_ranks:count
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
