"""Training runs: is each run alive, progressing, checkpointed? Deaths and firing alerts."""

from __future__ import annotations

from collections.abc import Sequence

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.models.dashboard import DynamicConfigValue

from alerts.site import Site
from grafana.boards import exporters, loss, runs_jobs, stuck
from grafana.dashboard import dashboard
from grafana.panels import (
    NONZERO_IS_BAD,
    Panel,
    stat_panel,
    state_timeline,
    table_panel,
    ts,
    value_mappings,
)
from grafana.promql import IR, Promql

UID = "trainguard-runs"

RUN_STATE_MAPPINGS = value_mappings(("dead", "red"), ("alive", "green"), ("finished", "blue"))


def run_state(q: Promql) -> str:
    """Each rank's state: 2 exited cleanly, 1 alive, 0 gone without a clean exit (a death).

    Alive is the exporter's judgement: the PID exists with the create time it recorded.
    """
    return (
        f"max {q.group_by('run, rank')} (\n"
        f"  2 * (trainguard_run_finished{{{IR}}} == 1)\n"
        f"  or {q.join_on('instance, run, rank')}\n"
        f"  trainguard_run_process_up{{{IR}}}\n"
        ")"
    )


def steps_per_min(q: Promql) -> str:
    """Each rank's steps per minute.

    deriv() rather than rate(): the step is a gauge that goes *down* when a run resumes from an
    older checkpoint, and rate() would read that as a counter reset and draw a spike of (new
    step / window). clamp_min hides the brief negative slope of a resume.
    """
    return (
        f"clamp_min(max {q.group_by('run, rank')} (deriv(trainguard_run_step{{{IR}}}[5m])), 0) * 60"
    )


def steps_per_min_usual(q: Promql) -> str:
    """Each rank's usual steps per minute, as TrainingThroughputDropped compares against it.

    The 90th percentile of its steps per minute over the site's ``throughput_baseline``.
    """
    return (
        "quantile_over_time(0.9, (\n"
        f"  {steps_per_min(q)}\n"
        f")[{q.site.duration('throughput_baseline')}:1m])"
    )


# Ages measured by the exporter on the training host: right even when that host's clock and
# Prometheus's disagree, unlike time() - a timestamp the trainer wrote.
HEARTBEAT_AGE = "trainguard_run_heartbeat_age_seconds"
STEP_AGE = "trainguard_run_step_age_seconds"
PER_RANK = "{{run}} rank {{rank}}"
PER_LOCATION = "{{run}} {{location}}"


def status(q: Promql, alert_names: Sequence[str]) -> list[Panel]:
    """Firing alerts, the state of every rank, and one table of every run now."""
    # Exact names, sorted: the panel shows the rules' alerts and nothing else.
    alerts = "|".join(sorted(set(alert_names)))
    return [
        table_panel(
            "Firing trainguard alerts",
            "Alerts from alerts/trainguard.rules.yml that are firing now (Prometheus' ALERTS "
            "series). Alerts that are not tied to one run or one exporter (no run / instance "
            "label) are always shown. Empty table = nothing firing.",
            [
                f'ALERTS{{alertstate="firing", alertname=~"{alerts}", '
                'cluster=~"$cluster|", instance=~"$instance|", run=~"$run|"}'
            ],
            columns={"alertname": ("Alert", ""), "severity": ("Severity", "")},
            hide=("Value", "alertstate"),
            h=6,
        ),
        state_timeline(
            "Run state per rank",
            "alive = the rank's PID exists with the recorded create time; finished = the run "
            "wrote its clean-exit marker; dead = the process is gone without a clean exit "
            "(kill -9, OOM killer, reboot) or the PID was reused by another process.",
            (run_state(q), PER_RANK),
            RUN_STATE_MAPPINGS,
        ),
        stat_panel(
            "Ranks alive",
            "Ranks whose training process is alive (PID + create time match).",
            "none",
            (f"count(trainguard_run_process_up{{{IR}}} == 1) or vector(0)", "alive"),
        ),
        stat_panel(
            "Ranks dead",
            "Ranks whose process is gone without a clean exit. Anything above 0 is a death "
            "(TrainingProcessDied).",
            "none",
            (
                f"count(\n  trainguard_run_process_up{{{IR}}} == 0\n"
                f"  unless {q.join_on('instance, run, rank')}"
                f" trainguard_run_finished{{{IR}}} == 1\n"
                ") or vector(0)",
                "dead",
            ),
            thresholds=NONZERO_IS_BAD,
        ),
        stat_panel(
            "Ranks finished",
            "Ranks that exited cleanly (their absence is not a death).",
            "none",
            (f"count(trainguard_run_finished{{{IR}}} == 1) or vector(0)", "finished"),
            thresholds=((None, "blue"),),
        ),
        stat_panel(
            "Deaths (all time)",
            "Deaths recorded by the reporter when a run restarted under the same name, summed "
            "over the selected runs.",
            "none",
            (f"sum({q.by('run', 'trainguard_run_deaths_total')}) or vector(0)", "deaths"),
            thresholds=NONZERO_IS_BAD,
        ),
        table_panel(
            "Runs now",
            "One row per run and rank: where it runs, its state, step, throughput, how old "
            "its heartbeat is and when its process started. State: 0 dead, 1 alive, 2 finished.",
            [
                q.by("run, rank, host, pid", "trainguard_run_info"),
                run_state(q),
                q.by("run, rank", "trainguard_run_step"),
                steps_per_min(q),
                q.by("run, rank", HEARTBEAT_AGE),
                q.by("run, rank", "trainguard_run_heartbeat_timestamp_seconds") + " * 1000",
                q.by("run, rank", "trainguard_run_start_timestamp_seconds") + " * 1000",
                q.by("run, rank", "trainguard_run_start_age_seconds"),
            ],
            columns={
                "run": ("Run", ""),
                "rank": ("Rank", ""),
                "host": ("Host", ""),
                "pid": ("PID", ""),
                "Value #B": ("State", "none"),
                "Value #C": ("Step", "none"),
                "Value #D": ("Steps/min", "none"),
                "Value #E": ("Heartbeat age", "s"),
                "Value #F": ("Last heartbeat", "dateTimeAsIso"),
                "Value #G": ("Started", "dateTimeAsIso"),
                "Value #H": ("Up for", "s"),
            },
            hide=("Value #A",),
            extra={
                "Value #B": [
                    DynamicConfigValue(id_val="mappings", value=RUN_STATE_MAPPINGS),
                    DynamicConfigValue(id_val="custom.cellOptions", value={"type": "color-text"}),
                ]
            },
        ),
    ]


def progress(q: Promql) -> list[Panel]:
    """Step, throughput, heartbeat and log age per rank: stalls and stragglers.

    The site's stall thresholds and throughput baseline are drawn and named.
    """
    site = q.site
    baseline = site.duration("throughput_baseline")
    stall_s = site.seconds("stall")
    log_stale_s = site.seconds("log_stale")
    first_step_s = site.seconds("first_step")
    return [
        ts(
            "Step",
            "Current training step per rank, from the heartbeat. A flat line while the rank is "
            "alive is a stall (TrainingStalled).",
            "none",
            [(q.by("run, rank", "trainguard_run_step"), PER_RANK)],
        ),
        ts(
            "Steps per minute",
            "Training throughput per rank: clamp_min(deriv(step[5m]), 0) * 60. deriv, not rate: "
            "the step is a gauge that drops when a run resumes from an older checkpoint. A rank "
            "below its peers is a straggler; 0 while alive is a stall. Dashed: its usual rate, "
            f"the 90th percentile over the last {baseline}; well below it for a while is "
            "TrainingThroughputDropped (ghost memory after a crash, throttling, a slow source).",
            "none",
            [
                (steps_per_min(q), PER_RANK),
                (steps_per_min_usual(q), PER_RANK + f" usual (p90 {baseline})"),
            ],
            minimum=0,
            dashed="/usual/",
        ),
        ts(
            "Time since last step",
            "Seconds since each rank's last step (trainguard_run_step_age_seconds, measured by "
            "the exporter on the training host, so clock skew does not show). A sawtooth whose "
            f"teeth are the run's step interval; a tooth {site.shown('stall_factor')} times taller "
            f"than the usual ones (at least {site.shown('stall')}) is TrainingStalled.",
            "s",
            [(q.by("run, rank", STEP_AGE), PER_RANK)],
            minimum=0,
        ),
        ts(
            "Heartbeat age",
            "Seconds since each rank last wrote its heartbeat (trainguard_run_heartbeat_age_"
            "seconds, measured by the exporter on the training host). The reporter writes at "
            "least every 10 s while the process runs; growing without bound: the rank hangs or "
            "died.",
            "s",
            [(q.by("run, rank", HEARTBEAT_AGE), PER_RANK)],
            # red where TrainingStalled judges a missing heartbeat, orange half way
            thresholds=((None, "green"), (stall_s // 2, "orange"), (stall_s, "red")),
            minimum=0,
        ),
        ts(
            "Log age",
            "Seconds since the run's configured log file was last modified (runs with a "
            f"log_file only). Unchanged for {site.shown('log_stale')} while the run is alive "
            "is TrainingLogStale (longer for a run whose usual step interval is longer).",
            "s",
            [
                (
                    "time() - " + q.by("run", "trainguard_run_log_modified_timestamp_seconds"),
                    "{{run}}",
                )
            ],
            # red where TrainingLogStale judges, orange half way
            thresholds=((None, "green"), (log_stale_s // 2, "orange"), (log_stale_s, "red")),
            minimum=0,
        ),
        ts(
            "Up without a first step",
            "Seconds since each rank's process started (trainguard_run_start_age_seconds), for "
            "ranks that have not reported a step yet: data loading, compilation, a hang before "
            f"training. Longer than {site.shown('first_step')} while alive is "
            "TrainingNoFirstStep (TrainingJobNoFirstStep for a job's ranks).",
            "s",
            [
                (
                    f"{q.by('run, rank', 'trainguard_run_start_age_seconds')}\n"
                    f"unless {q.join_on('run, rank')} {q.by('run, rank', 'trainguard_run_step')}",
                    PER_RANK,
                )
            ],
            thresholds=((None, "green"), (first_step_s, "red")),
            minimum=0,
        ),
    ]


def checkpoints(q: Promql) -> list[Panel]:
    """How old each run's newest checkpoint is, and how many steps a death would lose."""
    return [
        ts(
            "Last checkpoint age per location",
            "Seconds since the newest COMPLETE checkpoint of each run at each location (primary "
            "or a mirror). Max over exporters that see the same (shared) directory. Older than "
            f"{q.site.shown('checkpoint_stale')} while the run trains is CheckpointStale.",
            "s",
            [
                (
                    "time() - "
                    + q.by("run, location", "trainguard_checkpoint_last_timestamp_seconds"),
                    PER_LOCATION,
                )
            ],
            thresholds=((None, "green"), (q.site.seconds("checkpoint_stale"), "red")),
            minimum=0,
        ),
        ts(
            "Steps since last complete checkpoint",
            "Training steps that would be lost if the run died now: the run's current step minus "
            "the newest complete checkpoint's step, per location (StepsAtRisk).",
            "none",
            [
                (
                    f"{q.by('run', 'trainguard_run_step')}\n"
                    f"- {q.join_on('run')} group_right\n"
                    f"{q.by('run, location', 'trainguard_checkpoint_last_step')}",
                    PER_LOCATION,
                )
            ],
            minimum=0,
        ),
    ]


def deaths(q: Promql) -> list[Panel]:
    """Deaths the reporter recorded when a run restarted under the same name."""
    return [
        table_panel(
            "Deaths per run",
            "Death history recorded by the reporter when a run restarts under the same name: "
            "how many times it died, at which step, when, how long ago, and the inferred cause "
            "(reboot, oom_killer, exception, unknown). A death under an hour old is "
            "TrainingProcessRestarted (also when a supervisor restarted the run before any "
            "scrape saw it dead); the same step twice is RepeatedDeathNearSameStep.",
            [
                q.by("run", "trainguard_run_deaths_total"),
                q.by("run", "trainguard_run_last_death_step"),
                q.by("run", "trainguard_run_last_death_timestamp_seconds") + " * 1000",
                q.by("run, cause", "trainguard_run_last_death_info"),
                q.by("run", "trainguard_run_last_death_age_seconds", "min"),
            ],
            columns={
                "run": ("Run", ""),
                "cause": ("Last cause", ""),
                "Value #A": ("Deaths", "none"),
                "Value #B": ("Last death step", "none"),
                "Value #C": ("Last death", "dateTimeAsIso"),
                "Value #E": ("Since last death", "s"),
            },
            hide=("Value #D",),
            w=12,
        ),
        ts(
            "Deaths in window",
            "Deaths recorded per run within each interval (increase of "
            "trainguard_run_deaths_total).",
            "none",
            [
                (
                    f"max {q.group_by('run')} (increase(trainguard_run_deaths_total{{{IR}}}"
                    "[$__rate_interval]))",
                    "{{run}}",
                )
            ],
            bars=True,
            minimum=0,
        ),
    ]


def build(site: Site, alert_names: Sequence[str]) -> db.Dashboard:
    """The dashboard for the site's thresholds and target labels.

    ``alert_names`` are the alerts its "Firing" table shows.
    """
    q = Promql(site)
    return dashboard(
        UID,
        "Training runs",
        "Is each training run alive, progressing, checkpointed? Deaths and firing alerts.",
        [
            ("Status", [*status(q, alert_names), *stuck.panels(q)]),
            ("Progress", progress(q)),
            ("Training health", loss.panels(q)),
            ("Checkpoints", checkpoints(q)),
            ("Deaths", deaths(q)),
            ("Jobs: who is slow, goodput", runs_jobs.panels(q)),
            ("Exporter", exporters.panels(q)),
        ],
    )
