"""The runs dashboard's training health row: the loss each rank reports and its alerts' lines.

TrainingLossSpike and TrainingLossNonFinite judge the ``loss`` scalar; drawn here with the
site's own factor, baseline and streak length, so what the panel marks is what pages.
"""

from __future__ import annotations

from grafana.panels import Panel, ts
from grafana.promql import IR, Promql

PER_RANK = "{{run}} rank {{rank}}"


def panels(q: Promql) -> list[Panel]:
    """The loss each rank reports, its spike line, and how long it has not been finite."""
    site = q.site
    baseline = site.duration("loss_spike_baseline")
    factor = site.number("loss_spike_factor")
    loss = f'trainguard_run_scalar{{{IR}, name="loss"}}'
    finite = f"max {q.group_by('run, rank')} ({loss} > -Inf < +Inf)"
    return [
        ts(
            "Loss",
            'The `loss` each rank reports (trainguard_run_scalar{name="loss"}; NaN and '
            "infinities are left out: see the streak beside). Dashed: "
            f"{site.shown('loss_spike_factor')} times the rank's median loss over the last "
            f"{baseline}; above it for {site.shown('loss_spike_for')} is TrainingLossSpike.",
            "none",
            [
                (finite, PER_RANK),
                (
                    f"{factor} * quantile_over_time(0.5, (\n  {finite}\n)[{baseline}:1m])",
                    PER_RANK + f" spike line ({site.shown('loss_spike_factor')}x median)",
                ),
            ],
            dashed="/spike line/",
        ),
        ts(
            "Non-finite loss streak",
            "Consecutive observed steps, up to the latest, whose loss was NaN or infinite "
            f"(trainguard_run_loss_nonfinite_streak). {site.shown('loss_nonfinite_steps')} or "
            "more on a rank that has not finished is TrainingLossNonFinite: every step since "
            "is wasted.",
            "none",
            [(q.by("run, rank", "trainguard_run_loss_nonfinite_streak"), PER_RANK)],
            thresholds=((None, "green"), (site.number("loss_nonfinite_steps"), "red")),
            minimum=0,
        ),
    ]
