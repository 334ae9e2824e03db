"""Can the run be resumed, and from where? The checkpoint alerts.

CheckpointStale, CheckpointNeverCompleted,
CheckpointTruncated, CheckpointHashMismatch, CheckpointUnknownMtime, CheckpointUnrecordedFiles,
CheckpointPartialOrphaned, CheckpointVolumeFillingUp, CheckpointWillNotFit, StepsAtRisk. A
damaged checkpoint (truncated, hash mismatch) is judged at every evaluation (``GROUP``), the rest
every window_rules_interval (``WINDOW``).

Longer than 400 lines because the group carries its own thresholds at its top, beside the
rules they tune (one group, one file: a new alert and its thresholds are one edit here, not
a rule here and a table elsewhere); split, the two halves would be one concern again.
"""

from __future__ import annotations

from alerts.kinds import DURATION, NUMBER, Threshold
from alerts.rules.checkpoint_history import (
    AVAIL_PREDICTED,
    CHANGES,
    SPREAD,
    STEP_SEEN,
    UP_MIN,
)
from alerts.rules.common import RUN_ARGS, RUN_SEL, Alert, Group, query_bytes, query_value

THRESHOLDS: tuple[Threshold, ...] = (
    Threshold(
        "checkpoint_stale",
        "3h",
        DURATION,
        "CheckpointStale: newest complete checkpoint unchanged for this long (Prometheus's "
        "clock) while the run's live process has been up this long (so a run relaunched from an "
        "old checkpoint does not fire; a run with no start age: alive now and this long ago).",
    ),
    Threshold(
        "steps_at_risk_factor",
        3,
        NUMBER,
        "StepsAtRisk: steps since the newest complete primary checkpoint above this many times "
        "the run's usual step distance between checkpoints.",
    ),
    Threshold(
        "checkpoint_cadence_window",
        "7d",
        DURATION,
        "StepsAtRisk: the window over which the usual step distance between checkpoints is "
        "estimated (recording rule run:trainguard_checkpoint_step_cadence:avg).",
    ),
    Threshold(
        "steps_at_risk_for",
        "10m",
        DURATION,
        "StepsAtRisk: how long the steps must stay at risk before the alert fires.",
    ),
    Threshold(
        "checkpoint_damage_for",
        "2m",
        DURATION,
        "CheckpointTruncated / CheckpointHashMismatch: how long the damage must be seen before "
        "paging (the exporter already ignores files still inside their write grace period).",
    ),
    Threshold(
        "partial_orphaned",
        "30m",
        DURATION,
        "CheckpointPartialOrphaned: a .part file not modified for this long.",
    ),
    Threshold(
        "checkpoint_unjudged_for",
        "30m",
        DURATION,
        "CheckpointUnknownMtime, CheckpointUnrecordedFiles: how long checkpoint files that cannot "
        "be judged (mtime 0; no record where records are expected) are seen before warning.",
    ),
    Threshold(
        "volume_fill_window",
        "6h",
        DURATION,
        "CheckpointVolumeFillingUp: the window of the linear prediction of free space.",
    ),
    Threshold(
        "volume_fill_horizon",
        "24h",
        DURATION,
        "CheckpointVolumeFillingUp: the prediction says the volume is full within this long...",
    ),
    Threshold(
        "volume_fill_min_checkpoints",
        10,
        NUMBER,
        "CheckpointVolumeFillingUp: ...and fewer than this many average-sized checkpoints still "
        "fit.",
    ),
    Threshold(
        "volume_fill_for",
        "30m",
        DURATION,
        "CheckpointVolumeFillingUp: how long both must hold before the alert fires.",
    ),
    Threshold(
        "checkpoint_fit_margin",
        1.25,
        NUMBER,
        "CheckpointWillNotFit: the location's free space below this many times the largest of "
        "its newest checkpoints (the next one is as big, plus growth and other writers)...",
    ),
    Threshold(
        "checkpoint_fit_for",
        "10m",
        DURATION,
        "CheckpointWillNotFit: ...for this long while the run is active (longer than a save "
        "and the prune after it, whose dip in free space is no alarm).",
    ),
)

LOC_SEL = "${target_labels_sel},run=%q,location=%q"

LOC_ARGS = "${target_labels_args} $labels.run $labels.location"

SNIPPETS = {
    # PromQL: the slow group's records (checkpoint_history.py)
    "spread": SPREAD,
    "up_min": UP_MIN,
    "step_seen": STEP_SEEN,
    "changes": CHANGES,
    "avail_predicted": AVAIL_PREDICTED,
    # "step 800 holds 50%, step 900 holds 10%": the truncated checkpoints at the location.
    "truncated_steps": (
        "{{ range $i, $s := printf `trainguard_checkpoint_size_bytes{" + LOC_SEL + "} / "
        "trainguard_checkpoint_expected_size_bytes < 1` "
        + LOC_ARGS
        + ' | query | sortByLabel "step" }}{{ if $i }}, {{ end }}step {{ $s.Labels.step }} '
        "holds {{ $s.Value | humanizePercentage }}{{ end }}"
    ),
    "files": query_value("trainguard_checkpoint_files{" + LOC_SEL + "}", LOC_ARGS),
    "unrecorded": query_value("trainguard_checkpoint_unrecorded_files{" + LOC_SEL + "}", LOC_ARGS),
    "partials": query_value("trainguard_checkpoint_partial_files{" + LOC_SEL + "}", LOC_ARGS),
    "newest_intact": query_value(
        "run:trainguard_checkpoint_last_step:max{" + RUN_SEL + "}", RUN_ARGS, unknown="none"
    ),
    "damaged_step_truncated": query_value(
        "trainguard_checkpoint_newest_damaged_step{" + LOC_SEL + ',damage="truncated"}',
        LOC_ARGS,
    ),
    "damaged_step_hash_mismatch": query_value(
        "trainguard_checkpoint_newest_damaged_step{" + LOC_SEL + ',damage="hash_mismatch"}',
        LOC_ARGS,
    ),
    "cadence": query_value(
        "last_over_time(run:trainguard_checkpoint_step_cadence:avg{"
        + RUN_SEL
        + "}[${slow_rules_lookback}])",
        RUN_ARGS,
    ),
    "avail": query_bytes("trainguard_checkpoint_filesystem_avail_bytes{" + LOC_SEL + "}", LOC_ARGS),
    "largest": query_bytes("max(trainguard_checkpoint_size_bytes{" + LOC_SEL + "})", LOC_ARGS),
    "largest_primary": query_bytes(
        "max(trainguard_checkpoint_size_bytes{" + RUN_SEL + ',location="primary"})', RUN_ARGS
    ),
    "avg_size": query_bytes(
        "trainguard_checkpoint_bytes{" + LOC_SEL + "} / trainguard_checkpoint_files", LOC_ARGS
    ),
}


def _covered(damage: str) -> str:
    """PromQL for the damaged locations whose damage a newer intact step covers.

    An indented block for the locations whose newest file with ``damage`` is of a
    step the run still holds intact, at any location, or a newer one, while that newest intact
    step is no more than steps_at_risk_factor x the usual cadence behind the run: then the
    damage is a warning (fix the copy), otherwise it pages.
    """
    newest = 'trainguard_checkpoint_newest_damaged_step{damage="' + damage + '"}'
    return (
        """
            (
              """
        + newest
        + """
              <= on (${target_labels}, run) group_left ()
                run:trainguard_checkpoint_last_step:max
            )
            unless on (${target_labels}, run) (
              run:trainguard_run_step:max - run:trainguard_checkpoint_last_step:max
              > ${steps_at_risk_factor}
                * last_over_time(run:trainguard_checkpoint_step_cadence:avg[${slow_rules_lookback}])
            )
    """
    )


def _damage_alerts(
    name: str, series: str, damage: str, what: str, summary: str, described: str
) -> tuple[Alert, Alert]:
    """The critical and the warning rule of one kind of damage.

    Exactly one of them holds for a damaged location.
    """
    condition = series + " > 0\n"
    covered = _covered(damage)
    newest = "${damaged_step_" + damage + "}"
    critical = Alert(
        name,
        "critical",
        expr=condition + "unless on (${target_labels}, run, location) (" + covered + ")",
        for_="${checkpoint_damage_for}",
        keep_firing_for="${keep_firing_for}",
        summary=summary + ".",
        description=described
        + """
            No location of the run holds an intact copy of step """
        + newest
        + """ or newer (newest intact: step ${newest_intact}), or that copy is more than
            ${steps_at_risk_factor}x the usual steps between checkpoints behind the run. """
        + what,
    )
    warning = Alert(
        name,
        "warning",
        expr=condition + "and on (${target_labels}, run, location) (" + covered + ")",
        for_="${checkpoint_damage_for}",
        keep_firing_for="${keep_firing_for}",
        summary=summary + "; an intact copy remains.",
        description=described.rstrip().removesuffix(".")
        + """, the newest damaged one of step """
        + newest
        + """. The run still has an intact checkpoint of that step or a newer one
            (newest intact: step ${newest_intact}), so it can resume; do not resume from the
            damaged copy, and fix the copy at {{ $labels.location }} before it is needed.
            """,
    )
    return critical, warning


GROUP = Group(
    "trainguard-checkpoints",
    run_context=True,
    snippets=SNIPPETS,
    rules=(
        *_damage_alerts(
            "CheckpointTruncated",
            "trainguard_checkpoint_truncated_files",
            "truncated",
            "They load and then produce garbage; do not resume from them.",
            "Truncated checkpoint(s) of run {{ $labels.run }} at {{ $labels.location }}",
            """
            {{ $value }} checkpoint file(s) of run {{ $labels.run }} at location
            {{ $labels.location }} on ${run_host} are smaller than the size
            recorded when they were written (${truncated_steps}).
            """,
        ),
        *_damage_alerts(
            "CheckpointHashMismatch",
            "trainguard_checkpoint_hash_mismatch_files",
            "hash_mismatch",
            "Do not resume from them.",
            "Corrupt checkpoint(s) of run {{ $labels.run }} at {{ $labels.location }}",
            """
            {{ $value }} checkpoint file(s) of run {{ $labels.run }} at location
            {{ $labels.location }} on ${run_host} no longer match the sha256
            recorded when they were written.
            """,
        ),
    ),
)

#: The alerts on a state judged over minutes to hours (a checkpoint unchanged for
#: checkpoint_stale, files unjudged for 30m, a volume filling up or too small for 10-30m, steps
#: at risk for 10m), evaluated every window_rules_interval (1m) instead of every 15 s: each fires
#: up to one interval later. Damaged checkpoints page from GROUP, at every evaluation.
WINDOW = Group(
    "trainguard-checkpoints.window",
    run_context=True,
    snippets=SNIPPETS,
    interval="${window_rules_interval}",
    rules=(
        Alert(
            "CheckpointStale",
            "warning",
            expr="""
            max by (${target_labels}, run, location) (
              trainguard_checkpoint_last_timestamp_seconds
            )
            and on (${target_labels}, run, location)
              last_over_time(${spread}[${slow_rules_lookback}]) == 0
            and max by (${target_labels}, run, location) (
              trainguard_checkpoint_last_timestamp_seconds
            ) > 0
            and on (${target_labels}, run, location)
              max by (${target_labels}, run, location) (
                trainguard_checkpoint_last_timestamp_seconds offset ${checkpoint_stale}
              )
            and on (${target_labels}, run) run:trainguard_run_active_ranks:count
            and on (${target_labels}, run)
            (
              # the live process has run that long (a relaunch from an old checkpoint has not,
              # even when the process before it was alive checkpoint_stale ago)...
              max by (${target_labels}, run) (
                trainguard_run_start_age_seconds
                and on (${target_labels}, run, rank) trainguard_run_process_up == 1
              ) >= ${checkpoint_stale_s}
              or
              # ...or, for a run with no start age (configured runs), was alive then too
              (
                run:trainguard_run_active_ranks:count offset ${checkpoint_stale}
                unless on (${target_labels}, run) trainguard_run_start_age_seconds
              )
            )
            or
            # a mirror that has been readable for the whole window without ever holding a
            # complete checkpoint, while the primary completed one within it (value 0: none)
            (
              (
                last_over_time(${up_min}{location!="primary"}[${slow_rules_lookback}]) == 1
              ) * 0
              unless on (${target_labels}, run, location)
                last_over_time(${step_seen}[${slow_rules_lookback}])
            )
            and on (${target_labels}, run, location)
              trainguard_checkpoint_location_up offset ${checkpoint_stale}
            and on (${target_labels}, run)
              max by (${target_labels}, run) (
                last_over_time(${changes}{location="primary"}[${slow_rules_lookback}])
              ) > 0
            and on (${target_labels}, run) run:trainguard_run_active_ranks:count
            """,
            for_="5m",
            keep_firing_for="${keep_firing_for}",
            summary="""
            No new checkpoint of run {{ $labels.run }} at {{ $labels.location }} for
            ${checkpoint_stale}.
            """,
            description="""
            {{ if eq $value 0.0 }}Location {{ $labels.location }} of run {{ $labels.run }} on
            ${run_host} has not held one complete checkpoint for at least
            ${checkpoint_stale} (threshold), while the primary location completed at least one
            in that time: the copies to it fail, or never finish (look for .part files, a full
            volume or a copy job that stopped). If the primary's volume is lost, nothing is
            left.{{ else }}The newest complete checkpoint of run {{ $labels.run }} at location
            {{ $labels.location }} on ${run_host} has not changed for at least
            ${checkpoint_stale} (threshold) while the run has been alive for at least that
            long. Everything trained since then is lost if the run dies now.{{ end }}
            """,
        ),
        Alert(
            "CheckpointNeverCompleted",
            "critical",
            expr="""
            (
              min by (${target_labels}, run, location) (
                min_over_time(
                  trainguard_checkpoint_location_up{location="primary"}[${checkpoint_stale}]
                )
              ) == 1
              unless on (${target_labels}, run, location)
                last_over_time(trainguard_checkpoint_last_step[${checkpoint_stale}])
            )
            and on (${target_labels}, run)
              changes(run:trainguard_run_step:max[${checkpoint_stale}]) > 0
            and on (${target_labels}, run) run:trainguard_run_active_ranks:count
            and on (${target_labels}, run)
              run:trainguard_run_active_ranks:count offset ${checkpoint_stale}
            """,
            for_="5m",
            keep_firing_for="${keep_firing_for}",
            summary="""
            Run {{ $labels.run }} has stepped for ${checkpoint_stale} without one complete
            checkpoint.
            """,
            description="""
            Run {{ $labels.run }} on ${run_host} has been alive and stepping for at
            least ${checkpoint_stale} (threshold) and its primary checkpoint location is
            readable, but it holds no complete checkpoint (files matching the pattern:
            ${files}, of which without a record: ${unrecorded}; .part files: ${partials}).
            Every save fails, or the pattern matches nothing the script writes. If the run
            dies now, everything is lost.
            """,
        ),
        Alert(
            "CheckpointUnknownMtime",
            "warning",
            expr="trainguard_checkpoint_unknown_mtime_files > 0",
            for_="${checkpoint_unjudged_for}",
            summary="""
            Checkpoint files of run {{ $labels.run }} at {{ $labels.location }} have no
            modification time.
            """,
            description="""
            {{ $value }} checkpoint or .part file(s) of run {{ $labels.run }} at location
            {{ $labels.location }} on ${run_host} report an mtime of 0 (a network or
            FUSE bridge that does not pass it on), for ${checkpoint_unjudged_for}. Such files
            are never judged settled: never complete, never truncated, never pruned.
            """,
        ),
        Alert(
            "CheckpointUnrecordedFiles",
            "warning",
            expr="""
            trainguard_checkpoint_unrecorded_files > 0
            and on (${target_labels}, run, location)
              trainguard_checkpoint_location_info{trust_unrecorded="false"}
            """,
            for_="${checkpoint_unjudged_for}",
            summary="""
            Checkpoint files of run {{ $labels.run }} at {{ $labels.location }} have no record.
            """,
            description="""
            {{ $value }} checkpoint file(s) of run {{ $labels.run }} at location
            {{ $labels.location }} on ${run_host} have had no recorded size for
            ${checkpoint_unjudged_for} (no manifest record, and for a mirror none on the
            primary), and the location does not trust unrecorded files: they are never
            complete. Saved without trainguard.checkpoint, or their records were lost.
            """,
        ),
        Alert(
            "CheckpointPartialOrphaned",
            "warning",
            expr="trainguard_checkpoint_oldest_partial_age_seconds > ${partial_orphaned_s}",
            for_="5m",
            summary="""
            Orphaned partial checkpoint of run {{ $labels.run }} at {{ $labels.location }}.
            """,
            description="""
            A .part file of run {{ $labels.run }} at location {{ $labels.location }} on
            ${run_host} has not been written to for {{ $value | humanizeDuration }}
            (threshold ${partial_orphaned}): a save or copy died half-way. It takes space and
            the checkpoint it was meant to become does not exist.
            """,
        ),
        Alert(
            "CheckpointVolumeFillingUp",
            "warning",
            expr="""
            last_over_time(${avail_predicted}[${slow_rules_lookback}]) < 0
            and on (${target_labels}, run, location)
            trainguard_checkpoint_filesystem_avail_bytes
              < ${volume_fill_min_checkpoints}
                * (trainguard_checkpoint_bytes / (trainguard_checkpoint_files > 0))
            """,
            for_="${volume_fill_for}",
            summary="""
            Checkpoint volume of run {{ $labels.run }} at {{ $labels.location }} is filling up.
            """,
            description="""
            The volume holding checkpoints of run {{ $labels.run }} at location
            {{ $labels.location }} on ${run_host} has ${avail} free and, at
            the rate of the last ${volume_fill_window}, is full within
            ${volume_fill_horizon}; that is fewer than ${volume_fill_min_checkpoints}
            checkpoints of the average size (${avg_size}).
            """,
        ),
        Alert(
            "CheckpointWillNotFit",
            "critical",
            # the largest of the location's own newest checkpoints, or of the primary's: a
            # mirror too small for even one copy holds no checkpoint to compare with
            expr="""
            (
              trainguard_checkpoint_filesystem_avail_bytes
                < on (${target_labels}, run, location) ${checkpoint_fit_margin}
                  * max by (${target_labels}, run, location) (trainguard_checkpoint_size_bytes)
              or
              trainguard_checkpoint_filesystem_avail_bytes
                < on (${target_labels}, run) group_left () ${checkpoint_fit_margin}
                  * max by (${target_labels}, run) (
                    trainguard_checkpoint_size_bytes{location="primary"}
                  )
            )
            and on (${target_labels}, run) run:trainguard_run_active_ranks:count
            """,
            for_="${checkpoint_fit_for}",
            keep_firing_for="${keep_firing_for}",
            summary="""
            The next checkpoint of run {{ $labels.run }} will not fit at {{ $labels.location }}.
            """,
            description="""
            The volume holding checkpoints of run {{ $labels.run }} at location
            {{ $labels.location }} on ${run_host} has ${avail} free, less than
            ${checkpoint_fit_margin}x the largest of its newest checkpoints (${largest}) or of
            the primary's (${largest_primary}): the next save or copy fails there, or leaves a
            .part file behind. Free space now (prune, move
            old checkpoints) or point the run elsewhere.
            """,
        ),
        Alert(
            "StepsAtRisk",
            "warning",
            expr="""
            run:trainguard_run_steps_since_checkpoint:max
              > ${steps_at_risk_factor}
                * last_over_time(run:trainguard_checkpoint_step_cadence:avg[${slow_rules_lookback}])
            and on (${target_labels}, run) run:trainguard_run_active_ranks:count
            """,
            for_="${steps_at_risk_for}",
            keep_firing_for="${keep_firing_for}",
            summary="""
            Run {{ $labels.run }} is {{ $value }} steps past its newest complete checkpoint.
            """,
            description="""
            Run {{ $labels.run }} on ${run_host} is {{ $value }} steps
            past its newest complete primary checkpoint, more than ${steps_at_risk_factor}x its
            usual ${cadence} steps between checkpoints. If it dies now, those steps are lost.
            """,
        ),
    ),
)
