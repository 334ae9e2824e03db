"""Which rank of a job is slow: TrainingRankSlow, judged across the job's nodes.

With DDP the gradient all-reduce makes every rank wait for the slowest, so every rank steps at
the same pace and wall time per step names no one. What tells the straggler is the time a rank
spends on its own before that collective: waiting for its next batch and computing before the
backward (``trainguard_run_data_wait_seconds_total``, ``trainguard_run_compute_seconds_total``
per ``trainguard_run_timed_steps_total``; docs/metrics.md#who-is-slow). A rank whose own time
per step is ``slow_rank_factor`` times the median of its job's ranks holds all the others up.

A job spans exporters (one per node), so its ranks are compared by the site's target labels
without ``instance``, plus ``run`` and ``job_id``: the ranks of one job, never two jobs that
share a run name (two fine-tunes with a framework's default run name), whose ranks' paces say
nothing of each other. Ranks of no known job are compared by run, as one job.
"""

from __future__ import annotations

from alerts.kinds import DURATION, NUMBER, Threshold
from alerts.rules.common import Alert, Group, Record

THRESHOLDS: tuple[Threshold, ...] = (
    Threshold(
        "slow_rank_factor",
        1.5,
        NUMBER,
        "TrainingRankSlow: a rank's own time per step (waiting for data plus computing before "
        "the gradient all-reduce) at least this many times the median of its job's ranks...",
    ),
    Threshold(
        "slow_rank_for",
        "15m",
        DURATION,
        "TrainingRankSlow: ...for this long.",
    ),
    Threshold(
        "slow_rank_window",
        "5m",
        DURATION,
        "TrainingRankSlow: the window of the rates a rank's time per step is taken from.",
    ),
)

#: the job's identity in rules: the target labels but instance, plus run and the job's id
JOB = "${target_labels_across}, run, job_id"
JOB_SEL = "${target_labels_across_sel},run=%q,job_id=%q"
JOB_ARGS = "${target_labels_across_args} $labels.run $labels.job_id"
#: a live, unfinished rank (its series of a dead process would hold its last rates)
LIVE = """and on (${target_labels}, run, rank) trainguard_run_process_up == 1
unless on (${target_labels}, run, rank) trainguard_run_finished == 1"""
RATIO = "run_rank:trainguard_run_busy_seconds_per_step:ratio_to_job_median"


def _per_step(counter: str) -> str:
    return (
        "rate(" + counter + "[${slow_rank_window}])\n"
        "/ on (${target_labels}, run, rank)\n"
        "  (rate(trainguard_run_timed_steps_total[${slow_rank_window}]) > 0)\n" + LIVE
    )


#: "rank 3 on node-b (node-b:9636): 0.21s waiting for data + 0.80s computing per step"
SLOWEST = (
    "{{ with printf `topk(1, "
    + RATIO
    + "{"
    + JOB_SEL
    + "})` "
    + JOB_ARGS
    + " | query }}{{ with first . }}rank {{ .Labels.rank }}"
    "{{ with printf `trainguard_run_info{instance=%q,run=%q,rank=%q}` .Labels.instance "
    ".Labels.run .Labels.rank | query }} on {{ (first .).Labels.host }}{{ end }}"
    ' ({{ .Labels.instance }}), {{ .Value | printf "%.2f" }}x the job\'s median'
    "{{ with printf `run_rank:trainguard_run_data_wait_seconds_per_step:rate{instance=%q,"
    "run=%q,rank=%q}` .Labels.instance .Labels.run .Labels.rank | query }}: "
    "{{ first . | value | humanizeDuration }} waiting for data{{ end }}"
    "{{ with printf `run_rank:trainguard_run_compute_seconds_per_step:rate{instance=%q,"
    "run=%q,rank=%q}` .Labels.instance .Labels.run .Labels.rank | query }} and "
    "{{ first . | value | humanizeDuration }} computing per step{{ end }}"
    "{{ end }}{{ else }}unknown{{ end }}"
)

GROUP = Group(
    "trainguard-jobs-slow",
    snippets={"slowest_rank": SLOWEST, "job": JOB},
    rules=(
        Record(
            "run_rank:trainguard_run_data_wait_seconds_per_step:rate",
            _per_step("trainguard_run_data_wait_seconds_total"),
        ),
        Record(
            "run_rank:trainguard_run_compute_seconds_per_step:rate",
            _per_step("trainguard_run_compute_seconds_total"),
        ),
        # the rank's own time per step: what it spends before it can join the collective;
        # with its job's id where it names one (the ranks are compared within their job)
        Record(
            "run_rank:trainguard_run_busy_seconds_per_step:rate",
            """
            (
              run_rank:trainguard_run_data_wait_seconds_per_step:rate
              + run_rank:trainguard_run_compute_seconds_per_step:rate
            )
            * on (${target_labels}, run, rank) group_left (job_id) trainguard_run_job_info
            or
            (
              run_rank:trainguard_run_data_wait_seconds_per_step:rate
              + run_rank:trainguard_run_compute_seconds_per_step:rate
              unless on (${target_labels}, run, rank) trainguard_run_job_info
            )
            """,
        ),
        Record(
            "job:trainguard_run_busy_seconds_per_step:median",
            "quantile by (" + JOB + ") (0.5, run_rank:trainguard_run_busy_seconds_per_step:rate)",
        ),
        Record(
            RATIO,
            """
            run_rank:trainguard_run_busy_seconds_per_step:rate
            / on (${job}) group_left ()
            (job:trainguard_run_busy_seconds_per_step:median > 0)
            """,
        ),
        Alert(
            "TrainingRankSlow",
            "warning",
            expr="max by (" + JOB + ") (" + RATIO + ") >= ${slow_rank_factor}",
            for_="${slow_rank_for}",
            summary="A rank of training run {{ $labels.run }} holds the job up.",
            description="""
            The slowest rank of run {{ $labels.run }} is ${slowest_rank}, for
            ${slow_rank_for} at least ${slow_rank_factor}x the median of the job's ranks
            (waiting for data plus computing before the gradient all-reduce, per step, over
            ${slow_rank_window}). With DDP every rank waits for it in each all-reduce, so the
            whole job runs at its pace. Data wait high: its node's data loading (disk,
            network, CPU, too few workers); compute high: its GPU (clocks, throttling, a
            degraded link, a noisy neighbour).
            """,
        ),
    ),
)
