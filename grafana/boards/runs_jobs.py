"""The runs board's job panels: which rank holds a job up, and how much of its time was kept.

Who is slow: each rank's own time per step (waiting for data, computing before the gradient
all-reduce), from the raw counters. Goodput: the recording rules of ``alerts/rules/goodput.py``
(they need the rules file loaded; without it the panels are empty).
"""

from __future__ import annotations

from grafana.panels import Panel, ts
from grafana.promql import IR, Promql

PER_RANK = "{{run}} rank {{rank}}"
#: the goodput states, as the recording rules name them (alerts/rules/goodput.py)
STATES = ("productive", "recompute", "restart", "idle")


def per_step(q: Promql, counter: str) -> str:
    """Each rank's seconds per timed step of ``counter``, over Grafana's rate interval."""
    return (
        f"max {q.group_by('run, rank')} (\n"
        f"  rate({counter}{{{IR}}}[$__rate_interval])\n"
        f"  / rate(trainguard_run_timed_steps_total{{{IR}}}[$__rate_interval])\n"
        ")"
    )


def _job(q: Promql, metric: str) -> str:
    """A job's recorded series, by run and job id: two jobs may share a run name.

    Recorded every slow_rules_interval: looked back over 3.
    """
    lookback = q.site.duration("slow_rules_lookback")
    return f"max {q.group_by('run, job_id')} (last_over_time({metric}{{{IR}}}[{lookback}]))"


#: a job's legend: its run, and its job id where it has one
JOB = "{{run}} {{job_id}}"


def panels(q: Promql) -> list[Panel]:
    """The per-rank data/compute split, goodput over 24h and 7d, and where a job's time went."""
    site = q.site
    goodput_min = site.number("goodput_min")
    return [
        ts(
            "Time per step per rank: data wait and compute",
            "Each rank's own time per step: waiting for its next batch (dashed) and computing "
            "before the gradient all-reduce (solid), from run.step(data_seconds=, "
            "compute_seconds=) or the framework callbacks. With DDP every rank steps at the "
            "slowest one's pace, so steps per minute are equal; the rank whose own time is "
            f"highest is the straggler (TrainingRankSlow: {site.shown('slow_rank_factor')}x "
            "the job's median for "
            f"{site.shown('slow_rank_for')}).",
            "s",
            [
                (per_step(q, "trainguard_run_compute_seconds_total"), PER_RANK + " compute"),
                (per_step(q, "trainguard_run_data_wait_seconds_total"), PER_RANK + " data"),
            ],
            minimum=0,
            dashed="/data$/",
        ),
        ts(
            "Job attempt per rank",
            "The attempt each rank's process belongs to (trainguard_run_job_attempt: Slurm's "
            "SLURM_RESTART_COUNT, torchrun's TORCHELASTIC_RESTART_COUNT), per job across its "
            "nodes. A requeue or an elastic restart starts a newer attempt, often on other "
            "nodes; the heartbeats an older attempt left behind are history, never a death of "
            "the job (TrainingJobRankDied judges the newest attempt only).",
            "none",
            [
                (
                    f"max {q.group_by('run, rank, job_id')} (\n"
                    f"  trainguard_run_job_attempt{{{IR}}}\n"
                    f"  * {q.join_on('job, instance, run, rank')} group_left (job_id)\n"
                    f"  trainguard_run_job_info{{{IR}}}\n"
                    ")",
                    "{{run}} job {{job_id}} rank {{rank}}",
                )
            ],
            minimum=0,
        ),
        ts(
            "Goodput per job",
            "Share of the job's accounted time spent on productive steps, over the last 24h "
            "and 7d (recording rules job:trainguard_run_goodput:ratio_24h and _7d). Lost: "
            "recomputing steps lost at a death, down from a death to the first step after the "
            f"restart, idle (starting, stalled). Below {goodput_min} over 24h with a live rank "
            "is TrainingGoodputLow.",
            "percentunit",
            [
                (_job(q, "job:trainguard_run_goodput:ratio_24h"), JOB + " 24h"),
                (_job(q, "job:trainguard_run_goodput:ratio_7d"), JOB + " 7d"),
            ],
            thresholds=((None, "red"), (goodput_min, "green")),
            minimum=0,
            dashed="/7d$/",
        ),
        ts(
            "Job time by state (last 24h)",
            "Seconds of the last 24h each job spent productive, recomputing lost steps, down "
            "after a death (restart) and idle (docs/metrics.md#goodput).",
            "s",
            [(_job(q, f"job:trainguard_run_{s}_seconds:24h"), f"{JOB} {s}") for s in STATES],
            stacked=True,
            minimum=0,
        ),
    ]
