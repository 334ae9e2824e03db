"""Deaths told by the restarted run.

TrainingProcessRestarted (a death a supervisor hid by restarting the run at once),
RepeatedDeathNearSameStep (does it keep dying at the same place?).
"""

from __future__ import annotations

from alerts.kinds import DURATION, NUMBER, Threshold
from alerts.rules.common import RUN_ARGS, RUN_SEL, Alert, Group, Record, query_value

THRESHOLDS: tuple[Threshold, ...] = (
    Threshold(
        "restart_window",
        "1h",
        DURATION,
        "TrainingProcessRestarted: a restarted run recorded a death whose last heartbeat is less "
        "than this old (one alert per death, firing this long).",
    ),
    Threshold(
        "repeated_death_window",
        "24h",
        DURATION,
        "RepeatedDeathNearSameStep: a death recorded within this window...",
    ),
    Threshold(
        "repeated_death_steps",
        500,
        NUMBER,
        "RepeatedDeathNearSameStep: ...whose step lies within this many steps of the previous "
        "recorded death(s).",
    ),
)

#: steps between a newly recorded death and the one before it (see the rule)
DISTANCE = "run:trainguard_run_death_step_distance:new"


def _death_number(plus: str, window: str = "${keep_firing_for}") -> dict[str, str]:
    """The ``death`` label: which of the run's deaths this is (1 for the first).

    Each death is its own alert, so a run that dies again while the page of its previous death
    still fires (keep_firing_for) is notified again. The count is the exporter's (recorded by
    the next process at its start), over keep_firing_for so a missed scrape does not change
    it (TrainingProcessDied: over exporter_down_active_lookback, so the page it holds while the
    exporter is down keeps its number).
    """
    return {
        "death": (
            "{{ with printf `max(last_over_time(trainguard_run_deaths_total{"
            + RUN_SEL
            + "}["
            + window
            + "]))"
            + plus
            + "` "
            + RUN_ARGS
            + ' | query }}{{ . | first | value | printf "%.0f" }}{{ else }}1{{ end }}'
        )
    }


#: TrainingProcessDied: the death not yet counted (the count goes up when the run restarts)
DIED_LABELS = _death_number(" + 1", "${exporter_down_active_lookback}")
#: TrainingProcessRestarted: the death the restarted run counted
RESTARTED_LABELS = _death_number("")

SNIPPETS = {
    "distance": DISTANCE,  # PromQL: the new death's distance from the previous
    # a new death shows within this lookback: the death count is above its value this long ago
    "death_lookback": "1m",
    "last_death": query_value("trainguard_run_last_death_step{" + RUN_SEL + "}", RUN_ARGS),
    "deaths": query_value("trainguard_run_deaths_total{" + RUN_SEL + "}", RUN_ARGS),
    "death_checkpoint": query_value(
        "max(trainguard_checkpoint_last_step{" + RUN_SEL + ',location="primary"})',
        RUN_ARGS,
        unknown="none known",
    ),
    # "about 22": the steps between where the relaunch resumed (its first step, minus one) and
    # the death; before the relaunch has stepped, between the newest complete primary
    # checkpoint and the death, while that checkpoint is not newer than the death (later it is
    # the relaunch's own, and the difference would be negative)
    "steps_lost": query_value(
        "clamp_min(trainguard_run_last_death_step{"
        + RUN_SEL
        + "} - on (${target_labels}, run) (min by (${target_labels}, run) "
        + "(trainguard_run_first_step) - 1), 0) or (trainguard_run_last_death_step{"
        + RUN_SEL
        + "} - on (${target_labels}, run) max by (${target_labels}, run) "
        + '(trainguard_checkpoint_last_step{location="primary"}) >= 0)',
        RUN_ARGS + " " + RUN_ARGS,  # the run's selector twice
        fmt='printf "about %.0f"',
    ),
    "cause": (
        "{{ with printf `trainguard_run_last_death_info{"
        + RUN_SEL
        + "}` "
        + RUN_ARGS
        + ' | query }}{{ . | first | label "cause" }}{{ else }}unknown{{ end }}'
    ),
}

GROUP = Group(
    "trainguard-deaths",
    run_context=True,
    snippets=SNIPPETS,
    rules=(
        # A death recorded less than restart_window ago (its age is from the dead process's
        # last heartbeat: known when Prometheus first sees the run), or one Prometheus saw the
        # run count within restart_window (a process hung for longer, then killed and
        # restarted: its last heartbeat is older than the window, its death is news).
        Alert(
            "TrainingProcessRestarted",
            "warning",
            expr="""
            (
              max by (${target_labels}, run) (
                trainguard_run_last_death_age_seconds < ${restart_window_s}
              )
              or
              (
                max by (${target_labels}, run) (trainguard_run_deaths_total)
                > max by (${target_labels}, run) (
                  trainguard_run_deaths_total offset ${restart_window}
                )
              )
            )
            unless on (${target_labels}, run) trainguard_run_job_info
            """,
            keep_firing_for="${keep_firing_for}",
            labels=RESTARTED_LABELS,
            summary="""
            Training run {{ $labels.run }} on ${run_host} died and was restarted.
            """,
            description="""
            A process of run {{ $labels.run }} on ${run_host} died without a clean
            exit less than ${restart_window} ago (cause: ${cause}), and the run was started
            again: by torchrun, systemd or Kubernetes (then the death may never have shown as
            TrainingProcessDied) or by hand. Step reached before the death: ${last_death};
            newest complete primary checkpoint: ${death_checkpoint}; steps lost:
            ${steps_lost}. Deaths recorded so far: ${deaths}.
            """,
        ),
        # At a newly recorded death (the run's death count went up within the last minute),
        # how many steps lie between it and the death recorded before it, unless that one is
        # known to be older than repeated_death_window (both dates are the dead processes'
        # last heartbeats, on the same clock). Recorded once per death, read over the window by
        # the alert: each pair of consecutive deaths is judged on its own, whatever other
        # deaths the window holds. By run (max by): labels of the scrape, such as a
        # Kubernetes pod that a rollout changes, are not part of a run's identity.
        Record(
            DISTANCE,
            """
            abs(
              max by (${target_labels}, run) (trainguard_run_last_death_step)
              - max by (${target_labels}, run) (
                trainguard_run_last_death_step offset ${death_lookback}
              )
            )
            and on (${target_labels}, run)
            (
              max by (${target_labels}, run) (trainguard_run_deaths_total)
              > (
                max by (${target_labels}, run) (
                  trainguard_run_deaths_total offset ${death_lookback}
                ) > 0
              )
            )
            unless on (${target_labels}, run)
            (
              max by (${target_labels}, run) (trainguard_run_last_death_timestamp_seconds)
              - max by (${target_labels}, run) (
                trainguard_run_last_death_timestamp_seconds offset ${death_lookback}
              )
              >= ${repeated_death_window_s}
            )
            """,
        ),
        Alert(
            "RepeatedDeathNearSameStep",
            "warning",
            expr="""
            min_over_time(${distance}[${repeated_death_window}]) <= ${repeated_death_steps}
            """,
            summary="Run {{ $labels.run }} died again near the same step.",
            description="""
            Run {{ $labels.run }} on ${run_host} died within
            {{ $value | printf "%.0f" }} steps of the death recorded before it, both in the
            last ${repeated_death_window} (threshold ${repeated_death_steps} steps); its last
            recorded death was at step ${last_death} (cause: ${cause}). Once is bad luck,
            twice at the same place is a pattern: look at what that region of training does.
            """,
        ),
    ),
)
