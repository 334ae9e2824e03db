"""Alerts on a run that is alive and stepping but lost all the same.

TrainingLossNonFinite (its loss went NaN or infinite and stays so), TrainingLossSpike (its loss
jumped far above its own recent level), TrainingRestartLoop (it keeps dying and restarting from
the same checkpoint, never getting past it).

The loss is the ``loss`` scalar the run reports (``trainguard_run_scalar{name="loss"}``, the
name the framework callbacks give it too); the non-finite streak is counted by the reporter
(``trainguard_run_loss_nonfinite_streak``, see docs/metrics.md for what an observed step is).
"""

from __future__ import annotations

from alerts.kinds import DURATION, NUMBER, Threshold
from alerts.rules.common import LAST_STEP, RUN_ARGS, RUN_SEL, Alert, Group, Record, query_value

THRESHOLDS: tuple[Threshold, ...] = (
    Threshold(
        "loss_nonfinite_steps",
        3,
        NUMBER,
        "TrainingLossNonFinite: a rank's loss was NaN or infinite for this many consecutive "
        "observed steps (the reporter observes the latest step once per interval, 1 s by "
        "default: about this many seconds with fast steps).",
    ),
    Threshold(
        "loss_spike_factor",
        2,
        NUMBER,
        "TrainingLossSpike: a rank's loss is above this many times its own median over "
        "loss_spike_baseline...",
    ),
    Threshold(
        "loss_spike_baseline",
        "1h",
        DURATION,
        "TrainingLossSpike: ...the window of that median; the run must have reported a loss "
        "this long ago already (warm-up)...",
    ),
    Threshold(
        "loss_spike_min_samples",
        30,
        NUMBER,
        "TrainingLossSpike: ...with at least this many finite loss samples (rule evaluations) "
        "in the window...",
    ),
    Threshold(
        "loss_spike_for",
        "5m",
        DURATION,
        "TrainingLossSpike: ...at every evaluation for this long (a single noisy batch is not a "
        "spike).",
    ),
    Threshold(
        "restart_loop_restarts",
        3,
        NUMBER,
        "TrainingRestartLoop: the run recorded this many deaths (each followed by a restart)...",
    ),
    Threshold(
        "restart_loop_window",
        "2h",
        DURATION,
        "TrainingRestartLoop: ...within this window, while its newest complete primary "
        "checkpoint did not advance (without checkpoints: while its current process has not "
        "got further than the deaths of the window).",
    ),
)

#: the run's loss, without NaN and infinities (those are TrainingLossNonFinite's): what the
#: spike's median is taken over; a NaN in a quantile would poison it
LOSS = "run_rank:trainguard_run_loss:finite"
#: the rank's loss level TrainingLossSpike compares with: the median of LOSS over
#: loss_spike_baseline (positive), once the rank has loss_spike_min_samples in it and reported a
#: loss that long ago; recorded in SLOW, read with last_over_time
BASELINE = "run_rank:trainguard_run_loss:median"
#: the run's newest complete primary checkpoint (progress that survives a restart)
CKPT = 'trainguard_checkpoint_last_step{location="primary"}'

AT_STEP = 'printf "step %.0f"'
#: the run's newest complete primary checkpoint not saved with a non-finite loss
FINITE_CKPT = "max(trainguard_checkpoint_last_finite_step{" + RUN_SEL + ',location="primary"})'

#: the ranks whose process is gone or finished, read by both loss alerts: recorded first in
#: GROUP, and empty on a fleet at work, so that neither alert reads every rank's process state
NOT_RUNNING = "run_rank:trainguard_run_process_up:not_running"

SNIPPETS = {
    "not_running": NOT_RUNNING,
    # PromQL: the finite loss, its median, the newest complete primary checkpoint
    "loss": LOSS,
    "loss_med": BASELINE,
    "ckpt": CKPT,
    # "0 (12 steps), 3 (4 steps)": the ranks whose loss is not finite, and for how long
    "nonfinite_ranks": (
        "{{ range $i, $s := printf `trainguard_run_loss_nonfinite_streak{"
        + RUN_SEL
        + "} >= ${loss_nonfinite_steps}` "
        + RUN_ARGS
        + ' | query | sortByLabel "rank" }}'
        '{{ if $i }}, {{ end }}{{ $s.Labels.rank }} ({{ $s.Value | printf "%.0f" }} steps)'
        "{{ end }}"
    ),
    # "loss 12, grad_norm 3": the run's non-finite counts by scalar, summed over its ranks
    "nonfinite_counts": (
        "{{ range $i, $s := printf `sum by (${target_labels}, name) ("
        "trainguard_run_scalar_nonfinite_total{"
        + RUN_SEL
        + "}) > 0` "
        + RUN_ARGS
        + ' | query | sortByLabel "name" }}'
        '{{ if $i }}, {{ end }}{{ $s.Labels.name }} {{ $s.Value | printf "%.0f" }}'
        "{{ else }}none{{ end }}"
    ),
    "last_step": LAST_STEP,
    "checkpoint": query_value(
        "max(trainguard_checkpoint_last_step{" + RUN_SEL + ',location="primary"})',
        RUN_ARGS,
        fmt='printf "at step %.0f"',
        unknown="none known",
    ),
    # where the loss turned non-finite, over the ranks in a streak: after the newest finite step
    # observed, at or before the first non-finite one observed (not the streak subtracted from
    # the step: the streak counts observed steps)
    "nonfinite_first_step": query_value(
        "min(trainguard_run_loss_nonfinite_first_step{" + RUN_SEL + "})",
        RUN_ARGS,
        fmt=AT_STEP,
    ),
    "last_finite_step": query_value(
        "max(trainguard_run_loss_last_finite_step{"
        + RUN_SEL
        + "} and trainguard_run_loss_nonfinite_streak > 0)",
        RUN_ARGS,
        fmt=AT_STEP,
        unknown="none",
    ),
    "finite_checkpoint": query_value(FINITE_CKPT, RUN_ARGS, fmt=AT_STEP, unknown="none"),
    "finite_checkpoint_step": query_value(FINITE_CKPT, RUN_ARGS, unknown="none"),
    "finite_steps_at_risk": query_value(
        "max(trainguard_run_step{" + RUN_SEL + "}) - " + FINITE_CKPT,
        RUN_ARGS + " " + RUN_ARGS,  # the run's selector twice
        unknown="{{ with printf `max(trainguard_run_step{"
        + RUN_SEL
        + "})` "
        + RUN_ARGS
        + " | query }}no complete checkpoint saved with a finite loss: everything since the "
        "start is at risk{{ else }}unknown{{ end }}",
    ),
    "loss_median": query_value(
        "max(quantile_over_time(0.5, " + LOSS + "{" + RUN_SEL + "}[${loss_spike_baseline}]))",
        RUN_ARGS,
        'printf "%.4g"',
    ),
    "loop_step": query_value(
        "max(max_over_time(trainguard_run_step{" + RUN_SEL + "}[${restart_loop_window}]))",
        RUN_ARGS,
    ),
    # "exception, oom_killer": the causes of the run's deaths recorded within the window (the
    # cause of each newest death Prometheus saw)
    "loop_causes": (
        "{{ range $i, $s := printf `count by (${target_labels}, cause) (max_over_time("
        "trainguard_run_last_death_info{"
        + RUN_SEL
        + "}[${restart_loop_window}]))` "
        + RUN_ARGS
        + ' | query | sortByLabel "cause" }}'
        "{{ if $i }}, {{ end }}{{ $s.Labels.cause }}{{ else }}unknown{{ end }}"
    ),
}

GROUP = Group(
    "trainguard-training-health",
    run_context=True,
    snippets=SNIPPETS,
    rules=(
        Record(NOT_RUNNING, "trainguard_run_process_up == 0 or trainguard_run_finished == 1"),
        Record(
            LOSS,
            """
            trainguard_run_scalar{name="loss"} > -Inf < +Inf
            """,
        ),
        # The reporter counts the streak over the steps it observes (one per interval): a NaN
        # on one step that the next step forgets never reaches the threshold.
        Alert(
            "TrainingLossNonFinite",
            "critical",
            expr="""
            max by (${target_labels}, run) (
              trainguard_run_loss_nonfinite_streak >= ${loss_nonfinite_steps}
              unless on (${target_labels}, run, rank) ${not_running}
            )
            """,
            keep_firing_for="${keep_firing_for}",
            summary="""
            The loss of training run {{ $labels.run }} on ${run_host} is NaN or
            infinite.
            """,
            description="""
            Run {{ $labels.run }} on ${run_host} has reported a NaN or infinite loss
            for {{ $value | printf "%.0f" }} consecutive observed steps (threshold
            ${loss_nonfinite_steps}) on rank(s) ${nonfinite_ranks}: every step since is
            likely wasted. Non-finite values so far by scalar: ${nonfinite_counts}. Last step
            ${last_step}; last finite loss seen: ${last_finite_step}; first non-finite loss
            seen: ${nonfinite_first_step}. Newest complete primary checkpoint saved with a
            finite loss (the one to resume from): ${finite_checkpoint}; newest complete one
            ${checkpoint}.
            """,
            # the checkpoint to resume from, and what is lost resuming from it, in place of
            # every run alert's newest complete checkpoint (deploy/trainguard.tmpl)
            annotations={
                "checkpoint_step": "${finite_checkpoint_step}",
                "checkpoint_kind": "saved with a finite loss",
                "steps_at_risk": "${finite_steps_at_risk}",
            },
        ),
        # Against the run's own median over the baseline window, after a warm-up: a loss
        # reported that long ago already and enough samples since. Only a positive median is
        # judged: k times a negative or zero loss is no level to compare with. The median is
        # recorded every slow_rules_interval (SLOW): a 1h quantile per rank every 15 s was the
        # set's second costliest alert at fleet scale. It is up to 5m older than when taken
        # at each evaluation (a level over an hour, which a spike must exceed twice for
        # loss_spike_for), and the warm-up ends up to 5m later; a spike is still judged at
        # every evaluation.
        Alert(
            "TrainingLossSpike",
            "warning",
            expr="""
            max by (${target_labels}, run) (
              ${loss} > ${loss_spike_factor} * last_over_time(${loss_med}[${slow_rules_lookback}])
              unless on (${target_labels}, run, rank) ${not_running}
            )
            """,
            for_="${loss_spike_for}",
            keep_firing_for="${keep_firing_for}",  # a lasting state: not lost to one failed scrape
            summary="""
            The loss of training run {{ $labels.run }} on ${run_host} spiked.
            """,
            description="""
            Run {{ $labels.run }} on ${run_host} has reported a loss of
            {{ $value | printf "%.4g" }} for ${loss_spike_for}, above ${loss_spike_factor}x
            its median over the last ${loss_spike_baseline} (${loss_median}). A spike that
            does not come back down is a diverging run (or corrupted data, or a silent
            hardware error); last step ${last_step}; newest complete primary checkpoint
            ${checkpoint}.
            """,
        ),
        # Deaths the restarted processes recorded (whether the supervisor restarted them at
        # once or not) within the window, while no newer complete primary checkpoint came, nor
        # a first one. A run without any: unless its current process got further than every
        # process that died within the window.
        Alert(
            "TrainingRestartLoop",
            "critical",
            expr="""
            (
              max by (${target_labels}, run) (
                max_over_time(trainguard_run_deaths_total[${restart_loop_window}])
              )
              - max by (${target_labels}, run) (
                min_over_time(trainguard_run_deaths_total[${restart_loop_window}])
              )
              >= ${restart_loop_restarts}
            )
            unless on (${target_labels}, run)
            (
              max by (${target_labels}, run) (max_over_time(${ckpt}[${restart_loop_window}]))
              > max by (${target_labels}, run) (min_over_time(${ckpt}[${restart_loop_window}]))
            )
            unless on (${target_labels}, run)
            (
              max by (${target_labels}, run) (${ckpt})
              unless on (${target_labels}, run)
              max by (${target_labels}, run) (${ckpt} offset ${restart_loop_window})
            )
            unless on (${target_labels}, run)
            (
              max by (${target_labels}, run) (trainguard_run_step)
              > max by (${target_labels}, run) (
                max_over_time(trainguard_run_last_death_step[${restart_loop_window}])
              )
              unless on (${target_labels}, run)
              max by (${target_labels}, run) (max_over_time(${ckpt}[${restart_loop_window}]))
            )
            """,
            keep_firing_for="${keep_firing_for}",
            summary="""
            Training run {{ $labels.run }} on ${run_host} is restarting without
            progress.
            """,
            description="""
            Run {{ $labels.run }} on ${run_host} died and was restarted
            {{ $value | printf "%.0f" }} times in the last ${restart_loop_window} (threshold
            ${restart_loop_restarts}) without progress: no newer complete primary checkpoint
            than before (${checkpoint}); highest step reached in the window ${loop_step}.
            Every restart repeats the same work and dies again. Causes of the deaths:
            ${loop_causes}. Restarting again will not help: look at why it dies.
            """,
        ),
    ),
)

SLOW = Group(
    "trainguard-training-health.slow",
    snippets={"loss": LOSS},
    interval="${slow_rules_interval}",
    rules=(
        Record(
            BASELINE,
            """
            quantile_over_time(0.5, ${loss}[${loss_spike_baseline}]) > 0
            and count_over_time(${loss}[${loss_spike_baseline}]) >= ${loss_spike_min_samples}
            and last_over_time(${loss}[10m] offset ${loss_spike_baseline})
            """,
        ),
    ),
)
