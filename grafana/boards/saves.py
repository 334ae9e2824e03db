"""The checkpoints dashboard's saves row: save outcomes, the restore drill, reachability.

What CheckpointSavesFailing, CheckpointRestoreFailed, CheckpointRestoreUnverified and the
location alerts judge, with the site's own overdue factor, floor and windows.
"""

from __future__ import annotations

from grafana_foundation_sdk.models.dashboard import DynamicConfigValue

from grafana.panels import Panel, state_timeline, table_panel, ts, value_mappings
from grafana.promql import IR, Promql

PER_LOCATION = "{{run}} {{location}}"
REACHABLE_MAPPINGS = value_mappings(("unreachable", "red"), ("reachable", "green"))
RESTORE_MAPPINGS = value_mappings(("failed", "red"), ("loaded", "green"))


def by_loc(q: Promql, metric: str) -> str:
    """One value per run and location: several exporters may see the same shared directory."""
    return q.by("run, location", metric)


def reachable(q: Promql) -> str:
    """1 where every exporter that watches the location could read it, 0 where one could not."""
    return q.by("run, location", "trainguard_checkpoint_location_up", "min")


def newest_drill(q: Promql) -> str:
    """The newest restore drill's outcome per run and location, wherever it ran.

    1 loaded, 0 failed: the result of least age across the exporters, as the restore alerts
    judge it.
    """
    age = "trainguard_checkpoint_restore_last_check_age_seconds"
    return (
        f"max {q.group_by('run, location')} (\n"
        f"  trainguard_checkpoint_restore_last_check_success{{{IR}}}\n"
        f"  and {q.join_on('instance, run, location')}\n"
        f"  bottomk {q.group_by('run, location')} (1, {age}{{{IR}}})\n"
        ")"
    )


def panels(q: Promql) -> list[Panel]:
    """Whether saves succeed, how long since the last one, and what the restore drill loaded.

    The overdue line is CheckpointSavesFailing's: ``saves_overdue_factor`` times the usual
    interval between successful saves (over ``checkpoint_cadence_window``), at least
    ``saves_overdue_min``.
    """
    site = q.site
    success = q.by("run, location", "trainguard_checkpoint_last_save_success_timestamp_seconds")
    failure = q.by("run, location", "trainguard_checkpoint_last_save_failure_timestamp_seconds")
    cadence = site.duration("checkpoint_cadence_window")
    ts_success = f"trainguard_checkpoint_last_save_success_timestamp_seconds{{{IR}}}[{cadence}]"
    interval = (
        f"max {q.group_by('run, location')} (\n"
        f"  (max_over_time({ts_success}) - min_over_time({ts_success}))\n"
        f"  / (changes({ts_success}) > 0)\n"
        ")"
    )
    factor, floor = site.number("saves_overdue_factor"), site.seconds("saves_overdue_min")
    return [
        table_panel(
            "Saves and restore drills per location",
            "Per run and location: when the last save completed and when the last one failed "
            "(as the training processes recorded them; a failure newer than the success is "
            "CheckpointSavesFailing once it lasts "
            f"{site.shown('saves_failing_for')}), and the restore drill's results (trainguard "
            "verify --restore): whether the newest drill, on whichever node it ran, loaded the "
            "checkpoint (CheckpointRestoreFailed when not), how long ago it ran (by its node's "
            "clock) and the newest step a drill ever loaded, beside "
            "the newest complete step. The newest complete checkpoint of "
            f"{site.shown('restore_verified_within')} ago not loaded by a drill is "
            "CheckpointRestoreUnverified.",
            [
                success + " * 1000",
                failure + " * 1000",
                newest_drill(q),
                q.by("run, location", "trainguard_checkpoint_restore_verified_step"),
                by_loc(q, "trainguard_checkpoint_last_step"),
                q.by(
                    "run, location", "trainguard_checkpoint_restore_last_check_age_seconds", "min"
                ),
            ],
            columns={
                "run": ("Run", ""),
                "location": ("Location", ""),
                "Value #A": ("Last save", "dateTimeAsIso"),
                "Value #B": ("Last failed save", "dateTimeAsIso"),
                "Value #C": ("Last restore drill", "none"),
                "Value #D": ("Restore-verified step", "none"),
                "Value #E": ("Newest complete step", "none"),
                "Value #F": ("Last restore drill, age", "s"),
            },
            extra={
                "Value #C": [
                    DynamicConfigValue(id_val="mappings", value=RESTORE_MAPPINGS),
                    DynamicConfigValue(id_val="custom.cellOptions", value={"type": "color-text"}),
                ]
            },
            w=12,
        ),
        ts(
            "Time since last successful save",
            "Seconds since the last save into each location completed (and since the last one "
            "failed: a failure newer than the success on any node of a job is "
            "CheckpointSavesFailing), by the training host's "
            "clock (the exporter's age: never thrown off by skew between that host and "
            "Prometheus). Dashed: when it is "
            f"overdue, {site.shown('saves_overdue_factor')} times the location's usual "
            f"interval between successful saves over {cadence}, at least "
            f"{site.shown('saves_overdue_min')}; past it while the run steps is "
            "CheckpointSavesFailing (counted from the current process's start when that is "
            "later).",
            "s",
            [
                (
                    q.by("run, location", "trainguard_checkpoint_last_save_success_age_seconds"),
                    PER_LOCATION,
                ),
                (
                    q.by("run, location", "trainguard_checkpoint_last_save_failure_age_seconds"),
                    f"{PER_LOCATION} since the last failed save",
                ),
                (f"clamp_min({factor} * {interval}, {floor})", f"{PER_LOCATION} overdue after"),
            ],
            dashed="/overdue after/",
            minimum=0,
            w=12,
        ),
        state_timeline(
            "Location reachable",
            "Whether the exporters could read each location's directory and manifest "
            "(trainguard_checkpoint_location_up). Unreachable is neither stale nor complete: "
            "the alerts that judge a location wait for it to be readable again.",
            (reachable(q), PER_LOCATION),
            REACHABLE_MAPPINGS,
        ),
    ]
