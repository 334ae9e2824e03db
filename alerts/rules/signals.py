"""Runs stopped by a signal: TrainingProcessTerminated.

A rank whose process caught the signal that ended it (``trainguard_run_exit_info`` with cause
``signal`` or ``time_limit``: a preemption, a time limit, scancel, a pod deleted, torchrun
stopping the surviving ranks) was stopped, not crashed: a warning while it may be restarted.
TrainingProcessDied (``alerts/rules/runs.py``) leaves such a rank out for the same window
(``STOPPED``), then pages for it: a run stopped and not restarted is down. A run with a
rank that died otherwise pages as that death alone (torchrun stops the other ranks with
SIGTERM after one crashed). The ranks of a job (``trainguard_run_job_info``) are left out: a
preempted job of 16 nodes warns once, TrainingJobTerminated (``jobs/deaths.py``), not 16 times.
"""

from __future__ import annotations

from alerts.kinds import DURATION, Threshold
from alerts.rules.common import RUN_ARGS, RUN_SEL, Alert, Group, Record
from alerts.rules.deaths import DIED_LABELS

THRESHOLDS: tuple[Threshold, ...] = (
    Threshold(
        "terminated_restart_window",
        "30m",
        DURATION,
        "TrainingProcessTerminated (per node) and TrainingJobTerminated (per job): a rank "
        "stopped by a signal (or its time limit) is a warning for this long after its last "
        "heartbeat; not restarted by then, TrainingProcessDied or TrainingJobRankDied "
        "(critical) pages for it.",
    ),
)

_STOPPED = (
    'trainguard_run_exit_info{cause=~"signal|time_limit"}',
    "  and on (${target_labels}, run, rank)",
    "  trainguard_run_heartbeat_age_seconds < ${terminated_restart_window_s}",
)


#: PromQL (the ``${stopped}`` snippet): the ranks stopped by a signal within
#: ``terminated_restart_window``, not yet a death; by their last heartbeat's age, on the
#: trainer's clock
STOPPED = "\n".join(_STOPPED)


#: the ranks whose process is gone, neither finished, stopped by a signal nor on purpose, read
#: twice by TrainingProcessTerminated: recorded first in GROUP, and empty on a fleet at work, so
#: that the alert reads no rank's process state itself
DIED_OTHERWISE = "run_rank:trainguard_run_process_up:died_otherwise"

SNIPPETS = {
    "stopped": STOPPED,
    "died_otherwise": DIED_OTHERWISE,
    # "0 (SIGTERM, signal), 1 (SIGTERM, time_limit)"
    "stopped_ranks": (
        "{{ range $i, $s := printf `trainguard_run_exit_info{"
        + RUN_SEL
        + ',cause=~"signal|time_limit"}` '
        + RUN_ARGS
        + ' | query | sortByLabel "rank" }}'
        "{{ if $i }}, {{ end }}{{ $s.Labels.rank }} ({{ $s.Labels.signal }}, "
        "{{ $s.Labels.cause }}){{ end }}"
    ),
}

GROUP = Group(
    "trainguard-signals",
    run_context=True,
    snippets=SNIPPETS,
    rules=(
        Record(
            DIED_OTHERWISE,
            """
            trainguard_run_process_up == 0
            unless on (${target_labels}, run, rank) trainguard_run_finished == 1
            unless on (${target_labels}, run, rank)
              trainguard_run_exit_info{cause=~"signal|time_limit|on_purpose"}
            """,
        ),
        Alert(
            "TrainingProcessTerminated",
            "warning",
            expr="""
            count by (${target_labels}, run) (
              ${stopped}
              # a job's ranks: TrainingJobTerminated warns once for the job (jobs/deaths.py)
              unless on (${target_labels}, run, rank) trainguard_run_job_info
            )
            unless on (${target_labels}, run) ${died_otherwise}
            # a job's rank that died otherwise, on any node: TrainingJobRankDied pages alone
            unless on (${target_labels_across}, run) (
              ${died_otherwise}
              and on (${target_labels}, run, rank) trainguard_run_job_info
            )
            """,
            keep_firing_for="${keep_firing_for}",
            labels=DIED_LABELS,
            summary="""
            Training run {{ $labels.run }} on ${run_host} was stopped by a signal.
            """,
            description="""
            {{ $value }} rank(s) of run {{ $labels.run }} on ${run_host} ended
            on a signal they caught: rank (signal, cause) ${stopped_ranks}. A scheduler's
            stop (time_limit: at the job's end time; signal: scancel, a preemption, a pod
            deleted or evicted, torchrun stopping the ranks after another one died) rather
            than a crash. Not restarted within ${terminated_restart_window} of its last
            heartbeat, TrainingProcessDied pages for it.
            """,
        ),
    ),
)
