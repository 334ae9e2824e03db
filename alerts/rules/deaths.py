"""Does the run keep dying at the same place? RepeatedDeathNearSameStep."""

from __future__ import annotations

from alerts.rules.common import RUN_ARGS, RUN_SEL, Alert, Group, query_value

SNIPPETS = {
    "last_death": query_value("trainguard_run_last_death_step{" + RUN_SEL + "}", RUN_ARGS),
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
    snippets=SNIPPETS,
    rules=(
        Alert(
            "RepeatedDeathNearSameStep",
            "warning",
            expr="""
            (
              max_over_time(trainguard_run_last_death_step[${repeated_death_window}])
              - min_over_time(trainguard_run_last_death_step[${repeated_death_window}])
            ) <= ${repeated_death_steps}
            and on (job, instance, run)
              increase(trainguard_run_deaths_total[${repeated_death_window}]) > 0
            and on (job, instance, run)
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
