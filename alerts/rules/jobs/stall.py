"""A stalled job of many nodes: one alert for the job, naming where it is stuck.

TrainingJobStalled (a rank of the job is past its stall threshold: when one rank hangs, the
others soon wait for it in a collective and every rank stops stepping), TrainingJobNoFirstStep
(the job's live ranks have made no step long after they started).

The ranks of a job (``trainguard_run_job_info``) are left out of the per-node TrainingStalled
and TrainingNoFirstStep (``alerts/rules/runs.py``): a 16-node job whose rank hangs in its data
loader pages once, not sixteen times. These rules judge each rank as those do, then aggregate
by the target labels without ``instance`` (``${target_labels_across}``), the run and the job,
as TrainingJobRankDied does (``deaths.py``, whose page inhibits these in Alertmanager: a dead
rank explains a stalled job). Where the job is stuck comes from ``stuck.py``: the rank(s)
apart from the rest, with their host, and where the others wait.
"""

from __future__ import annotations

from alerts.rules.common import Alert, Group, Record, query_value
from alerts.rules.jobs.deaths import JOB_ARGS, JOB_CONTEXT, JOB_SEL, ON_RANK, RUN_ARGS, RUN_SEL
from alerts.rules.stuck import APART, APART_RANKS, STUCK_ANNOTATION

#: a job's live ranks past their stall threshold (or with no heartbeat for ``stall``), valued
#: the time without progress, with the job's ``job_id``
STALLED = "job_rank:trainguard_run_stalled:seconds"
#: a job's live ranks with no step yet, long after they started, valued their time since start
NO_FIRST_STEP = "job_rank:trainguard_run_no_first_step:seconds"
JOB = "${target_labels_across}, run, job_id"


def _count(query: str) -> str:
    return query_value(query, JOB_ARGS, unknown="0")


#: ": held up by rank 3 on node-b (node-b:9636) in `load_batch <- train.py:88`", or nothing
HELD_UP = (
    "{{ with printf `" + APART + "{" + JOB_SEL + "}` " + JOB_ARGS + " | query }}"
    ": held up by " + APART_RANKS + "{{ end }}"
)

SNIPPETS = {
    "on_rank": ON_RANK,  # PromQL: the join on a rank
    "held_up": HELD_UP,
    "job_ranks": _count("count(trainguard_run_job_info{" + JOB_SEL + "})"),
    "stalled_ranks": _count("count(" + STALLED + "{" + JOB_SEL + "})"),
    "stalled_nodes": _count(
        "count(count by (${target_labels}) (" + STALLED + "{" + JOB_SEL + "}))"
    ),
    "waiting_ranks": _count("count(" + NO_FIRST_STEP + "{" + JOB_SEL + "})"),
    "waiting_nodes": _count(
        "count(count by (${target_labels}) (" + NO_FIRST_STEP + "{" + JOB_SEL + "}))"
    ),
    "job_stall_threshold": query_value(
        "max(run_rank:trainguard_run_stall_threshold_seconds:clamp{"
        + RUN_SEL
        + "} and "
        + ON_RANK
        + " "
        + STALLED
        + "{"
        + JOB_SEL
        + "})",
        RUN_ARGS + " " + JOB_ARGS,
        "humanizeDuration",
        unknown="none: no step yet",
    ),
}

GROUP = Group(
    "trainguard-jobs-stall",
    snippets=SNIPPETS,
    rules=(
        # as TrainingStalled judges a rank (runs.py), for the ranks of a job
        Record(
            STALLED,
            """
            max by (${target_labels}, run, rank) (
              run_rank:trainguard_run_step_age_seconds:running
                > run_rank:trainguard_run_stall_threshold_seconds:clamp
              or
              (
                trainguard_run_heartbeat_age_seconds > ${stall_s}
                and ${on_rank} trainguard_run_process_up == 1
                unless ${on_rank} trainguard_run_finished == 1
              )
            )
            * ${on_rank} group_left (job_id) trainguard_run_job_info
            """,
        ),
        # as TrainingNoFirstStep judges a rank (runs.py), for the ranks of a job
        Record(
            NO_FIRST_STEP,
            """
            max by (${target_labels}, run, rank) (
              trainguard_run_start_age_seconds > ${first_step_s}
              and ${on_rank} trainguard_run_process_up == 1
              unless ${on_rank} trainguard_run_finished == 1
              unless ${on_rank} trainguard_run_step
              unless ${on_rank} trainguard_run_heartbeat_age_seconds > ${stall_s}
            )
            * ${on_rank} group_left (job_id) trainguard_run_job_info
            """,
        ),
        Alert(
            "TrainingJobStalled",
            "warning",
            expr="max by (" + JOB + ") (" + STALLED + ")",
            for_="2m",
            keep_firing_for="${keep_firing_for}",
            summary="""
            Job {{ $labels.job_id }} of run {{ $labels.run }} is alive but not
            progressing${held_up}.
            """,
            description="""
            ${stalled_ranks} of the ${job_ranks} rank(s) of job {{ $labels.job_id }} (run
            {{ $labels.run }}), on ${stalled_nodes} node(s), are alive but have made no progress
            for up to {{ $value | humanizeDuration }}: no new step within their stall threshold
            (${job_stall_threshold}), or no new heartbeat within ${stall}. The threshold is
            ${stall_factor}x the run's longest recent interval between steps, at least ${stall}
            and at most ${stall_max}. When one rank hangs, the others wait for it in a
            collective: look first at the rank(s) the `stuck` annotation names.
            """,
            annotations={**JOB_CONTEXT, "stuck": STUCK_ANNOTATION},
        ),
        Alert(
            "TrainingJobNoFirstStep",
            "warning",
            expr="max by (" + JOB + ") (" + NO_FIRST_STEP + ")",
            keep_firing_for="${keep_firing_for}",
            summary="""
            Job {{ $labels.job_id }} of run {{ $labels.run }} has made no step since it
            started${held_up}.
            """,
            description="""
            ${waiting_ranks} of the ${job_ranks} rank(s) of job {{ $labels.job_id }} (run
            {{ $labels.run }}), on ${waiting_nodes} node(s), started up to
            {{ $value | humanizeDuration }} ago (threshold ${first_step}) and are alive, their
            reporters write heartbeats, but they have not reported a single step: hung before
            training started (rendezvous or NCCL init, a data loader, loading a checkpoint).
            """,
            annotations={**JOB_CONTEXT, "stuck": STUCK_ANNOTATION},
        ),
    ),
)
