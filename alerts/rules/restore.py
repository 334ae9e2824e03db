"""Would the newest checkpoint load? The restore drill alerts.

CheckpointRestoreUnverified, CheckpointRestoreFailed. Both are opt-in: they need a restore
drill's result (``trainguard verify --restore`` on a schedule, deploy/), so a run without one is
never alerted on. The drill's result may be exported by another exporter than the one watching
the location (a CronJob's node, a timer on another host): the newest complete checkpoint is
joined across a run's exporters, by the target labels without ``instance``.

The drill leaves its result in the state directory of the node it ran on, and a scheduled
drill lands on any node: a location has results on several exporters, of several ages. The
newest drill result decides (``NEWEST``: the result of least age, each age measured by its own
exporter on the clock of the host whose drill wrote it, never ``time()`` minus that host's
timestamp), and a step any drill loaded is verified: an old failure left on one node does not
page once a newer drill elsewhere loaded the checkpoint.
"""

from __future__ import annotations

from alerts.kinds import DURATION, Threshold
from alerts.rules.common import Alert, Group, Record, query_value

THRESHOLDS: tuple[Threshold, ...] = (
    Threshold(
        "restore_verified_within",
        "24h",
        DURATION,
        "CheckpointRestoreUnverified: the newest complete checkpoint of this long ago (or a newer "
        "one) must have been loaded by a restore drill (trainguard verify --restore) by now. "
        "Schedule the drill well within it (the deploy/ examples run it every 6h).",
    ),
)

#: a location's series across the run's exporters (any instance)
ANY_SEL = "${target_labels_across_sel},run=%q,location=%q"
ANY_ARGS = "${target_labels_across_args} $labels.run $labels.location"
BY = "${target_labels}, run, location"
BY_ANY = "${target_labels_across}, run, location"

#: each location's newest drill result across the run's exporters (the one of least age), at
#: the exporter that has it, valued its success: 1 loaded, 0 failed or could not check
NEWEST = "run_location:trainguard_checkpoint_restore_last_check_success:newest"

SNIPPETS = {
    # a location's labels at its exporter, and across the run's exporters (for by and on)
    "by_location": BY,
    "by_location_any": BY_ANY,
    "newest": NEWEST,
    # the newest step any drill loaded, and how long ago the last drill to load it finished
    "verified_step": query_value(
        "max(trainguard_checkpoint_restore_verified_step{" + ANY_SEL + "})",
        ANY_ARGS,
        unknown="none",
    ),
    "verified_ago": query_value(
        "min(trainguard_checkpoint_restore_verified_age_seconds{" + ANY_SEL + "})",
        ANY_ARGS,
        fmt="humanizeDuration",
        suffix=" ago",
        unknown="never",
    ),
    # the newest drill's, wherever it ran
    "checked_ago": query_value(
        "min(trainguard_checkpoint_restore_last_check_age_seconds{" + ANY_SEL + "})",
        ANY_ARGS,
        fmt="humanizeDuration",
        suffix=" ago",
    ),
    "newest_step": query_value(
        "max(trainguard_checkpoint_last_step{" + ANY_SEL + "})", ANY_ARGS, unknown="none"
    ),
}

GROUP = Group(
    "trainguard-restore",
    snippets=SNIPPETS,
    rules=(
        Record(
            NEWEST,
            """
            max by (${by_location}) (trainguard_checkpoint_restore_last_check_success)
            and on (${by_location})
            bottomk by (${by_location_any}) (
              1, max by (${by_location}) (trainguard_checkpoint_restore_last_check_age_seconds)
            )
            """,
        ),
        # The checkpoint that was the newest complete one restore_verified_within ago (at any of
        # the run's exporters) is newer than the newest step any drill loaded: nothing that
        # recent has been shown to load. Named at the exporter of the newest drill result. A
        # newest drill that failed is CheckpointRestoreFailed instead.
        Alert(
            "CheckpointRestoreUnverified",
            "warning",
            expr="""
            max by (${by_location_any}) (trainguard_checkpoint_restore_verified_step)
            * on (${by_location_any}) group_right () (${newest} * 0 + 1)
            < on (${by_location_any}) group_left ()
              max by (${by_location_any}) (
                last_over_time(
                  trainguard_checkpoint_last_step[${slow_rules_lookback}]
                  offset ${restore_verified_within}
                )
              )
            unless on (${by_location}) ${newest} == 0
            """,
            keep_firing_for="${keep_firing_for}",
            summary="""
            Run {{ $labels.run }}: no checkpoint at {{ $labels.location }} as recent as
            ${restore_verified_within} ago has been shown to load.
            """,
            description="""
            The newest complete checkpoint of run {{ $labels.run }} at {{ $labels.location }}
            ${restore_verified_within} ago was at a newer step than any a restore drill has
            loaded: the newest step a drill loaded is ${verified_step} (${verified_ago}); the
            newest complete checkpoint now is step ${newest_step}. The drill's last run was
            ${checked_ago}. Is the scheduled drill (trainguard verify --restore) still running,
            and on the directory the run writes to?
            """,
        ),
        Alert(
            "CheckpointRestoreFailed",
            "warning",
            expr="${newest} == 0",
            keep_firing_for="${keep_firing_for}",
            summary="""
            Run {{ $labels.run }}: the restore drill could not load the checkpoint at
            {{ $labels.location }}.
            """,
            description="""
            The newest restore drill of run {{ $labels.run }} at {{ $labels.location }}
            (${checked_ago}, reported by {{ $labels.instance }}) did not load the checkpoint a
            resume would load, or could not check it. A resume from it may fail the same way.
            The newest step a drill loaded is ${verified_step} (${verified_ago}). Run
            trainguard verify --restore on the location to see the file and what failed.
            """,
        ),
    ),
)
