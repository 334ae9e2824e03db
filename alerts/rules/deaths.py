"""Deaths told by the restarted run: TrainingProcessRestarted (a death a supervisor hid by
restarting the run at once), RepeatedDeathNearSameStep (does it keep dying at the same place?)."""

from __future__ import annotations

from alerts.rules.common import RUN_ARGS, RUN_SEL, Alert, Group, query_value

SNIPPETS = {
    "last_death": query_value("trainguard_run_last_death_step{" + RUN_SEL + "}", RUN_ARGS),
    "deaths": query_value("trainguard_run_deaths_total{" + RUN_SEL + "}", RUN_ARGS),
    "death_checkpoint": query_value(
        "max(trainguard_checkpoint_last_step{" + RUN_SEL + ',location="primary"})',
        RUN_ARGS,
        unknown="none known",
    ),
    # "about 22": the steps between the newest complete checkpoint and the death.
    "steps_lost": query_value(
        "trainguard_run_last_death_step{"
        + RUN_SEL
        + "} - on (${target_labels}, run) max by (${target_labels}, run) "
        + '(trainguard_checkpoint_last_step{location="primary"})',
        RUN_ARGS,
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
        Alert(
            "TrainingProcessRestarted",
            "warning",
            expr="""
            max by (${target_labels}, run) (
              trainguard_run_last_death_age_seconds < ${restart_window_s}
            )
            """,
            keep_firing_for="${keep_firing_for}",
            summary="""
            Training run {{ $labels.run }} on {{ $labels.instance }} died and was restarted.
            """,
            description="""
            A process of run {{ $labels.run }} on {{ $labels.instance }} died without a clean
            exit less than ${restart_window} ago (cause: ${cause}), and the run was started
            again: by torchrun, systemd or Kubernetes (then the death may never have shown as
            TrainingProcessDied) or by hand. Step reached before the death: ${last_death};
            newest complete primary checkpoint: ${death_checkpoint}; steps lost:
            ${steps_lost}. Deaths recorded so far: ${deaths}.
            """,
        ),
        Alert(
            "RepeatedDeathNearSameStep",
            "warning",
            expr="""
            (
              max_over_time(trainguard_run_last_death_step[${repeated_death_window}])
              - min_over_time(trainguard_run_last_death_step[${repeated_death_window}])
            ) <= ${repeated_death_steps}
            and on (${target_labels}, run)
              increase(trainguard_run_deaths_total[${repeated_death_window}]) > 0
            and on (${target_labels}, run)
              max_over_time(trainguard_run_deaths_total[${repeated_death_window}]) >= 2
            """,
            summary="Run {{ $labels.run }} died again near the same step.",
            description="""
            Run {{ $labels.run }} on {{ $labels.instance }} died again in the last
            ${repeated_death_window}, at step ${last_death} (cause: ${cause}), within
            {{ $value | printf "%.0f" }} steps of its previous recorded death (threshold
            ${repeated_death_steps} steps). Once is bad luck, twice at the same place is a
            pattern: look at what that region of training does.
            """,
        ),
    ),
)
