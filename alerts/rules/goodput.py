"""Goodput per job: how much of a job's time went into training that was kept.

At each evaluation a job that is accounted (not finished, and some rank wrote a heartbeat
within ``goodput_gone_after``) is in exactly one state, recorded as a 0/1 series each:

- ``productive``: a live rank is stepping (its last step within its stall threshold) beyond
  the step of the job's last death;
- ``recompute``: stepping, but below the step the job had reached when it last died: redoing
  the steps lost since the newest complete checkpoint (time lost to deaths, measured as it is
  spent again, at the run's pace);
- ``restart``: no rank stepping while a rank is dead, or after a death before the restarted
  ranks' first step (restart downtime: from the death to the first step after the restart);
- ``idle``: no rank stepping otherwise (stalled, starting up again without a death, or stepping
  on a loss NaN or infinite for ``loss_nonfinite_steps``: no progress).

A job is accounted once it has begun: a rank stepped, or it died. Its start-up before the
first step (loading a checkpoint, rendezvous, compiling) is not lost goodput.

The slow group sums each state's seconds per ``slow_rules_interval`` block, then over 24h and
7d; goodput is the productive share of them (docs/metrics.md#goodput). Both sums are independent
of the groups' evaluation cadence: a block is the share of the goodput group's evaluations in
the state (``TICK``), and the sum over a window is scaled by the slow group's measured mean
interval (``SLOW_TICK``), so a ruler evaluating either group at another interval, or missing an
evaluation, records the same seconds (tests/generators/test_goodput_cadence.py). A job is judged
across its nodes: by the site's target labels without ``instance``, plus ``run`` and ``job_id``
(``JOB_OF``: each rank's job), so that two jobs under one run name (a framework's default) are
two jobs, not one whose dead ranks make the other's time lost. Ranks of no known job are one
job per run. A run's deaths (recorded per node and run) count for each of its jobs on that node:
a job resumed under a new job id from the old one's checkpoint recomputes the steps it lost.
"""

from __future__ import annotations

from alerts.kinds import DURATION, NUMBER, Threshold
from alerts.rules.common import Alert, Group, Record, query_value
from alerts.rules.jobs.slow import JOB, JOB_ARGS, JOB_SEL
from alerts.rules.recording import STATE

THRESHOLDS: tuple[Threshold, ...] = (
    Threshold(
        "goodput_min",
        0.9,
        NUMBER,
        "TrainingGoodputLow: the share of a live job's accounted time of the last 24h spent "
        "on productive steps (not recomputing lost steps, not down after a death, not stalled "
        "or starting) below which it fires.",
    ),
    Threshold(
        "goodput_min_accounted",
        "1h",
        DURATION,
        "TrainingGoodputLow: only for a job accounted at least this long in the last 24h (a "
        "job's first minutes, starting up, are not a goodput to page on).",
    ),
    Threshold(
        "goodput_gone_after",
        "1h",
        DURATION,
        "Goodput: a job whose ranks have all written no heartbeat for this long (dead, never "
        "restarted) is no longer accounted: its time is neither good nor lost until it comes "
        "back.",
    ),
)

#: the conditions, each a job's series present (value 1) while it holds
ACCOUNTED = "job:trainguard_run_accounted:max"
STEPPING = "job:trainguard_run_stepping:max"
RECOMPUTING = "job:trainguard_run_recomputing:max"
DOWN = "job:trainguard_run_down:max"
#: the jobs with a live, unfinished rank (TrainingGoodputLow reads it twice)
LIVE_JOB = "job:trainguard_run_live:present"
#: each rank's job: valued 1, with the job's ``job_id`` where its heartbeat names one, without
#: it for a rank of no known job (one job per run); every rank with a heartbeat
JOB_OF = "run_rank:trainguard_run_job:info"
#: PromQL after a rank's series (in parentheses): the same with its job's job_id
IN_JOB = "* on (${target_labels}, run, rank) group_left (job_id) " + JOB_OF
#: PromQL: a run's series on a node (deaths) as each of its jobs' there, per rank
RUN_IN_JOB = JOB_OF + " * on (${target_labels}, run) group_left ()"
#: each rank's process state (alerts/rules/recording.py: 1 live, 0 gone, 2 finished) and the
#: step of each stepping rank, with the rank's job: joined to the job once, read by every
#: condition (a join per condition doubled the group's cost at fleet scale)
STATE_JOB = "run_rank:trainguard_run_process_state:job"
STEPPING_JOB = "run_rank:trainguard_run_stepping_step:job"
#: the most deaths a job's nodes recorded for its run
JOB_DEATHS = "job:trainguard_run_deaths:max"


#: a live rank that stepped within its stall threshold, on a finite loss: steps on a loss that
#: has been NaN or infinite for loss_nonfinite_steps are no progress (TrainingLossNonFinite
#: pages them), so that time is lost goodput (idle), not productive
STEPPING_RANK = (
    "(\n"
    "  run_rank:trainguard_run_step_age_seconds:running\n"
    "  <= run_rank:trainguard_run_stall_threshold_seconds:clamp\n"
    "  unless on (${target_labels}, run, rank)\n"
    "  trainguard_run_loss_nonfinite_streak >= ${loss_nonfinite_steps}\n"
    ")"
)
CONDITIONS = (
    Record(
        JOB_OF,
        """
        max by (${target_labels}, run, rank, job_id) (trainguard_run_job_info) * 0 + 1
        or on (${target_labels}, run, rank)
        max by (${target_labels}, run, rank) (trainguard_run_heartbeat_age_seconds) * 0 + 1
        """,
    ),
    Record(STATE_JOB, "${state} ${in_job}"),
    Record(
        STEPPING_JOB,
        """
        (
          trainguard_run_step
          and on (${target_labels}, run, rank) ${stepping_rank}
        )
        ${in_job}
        """,
    ),
    Record(JOB_DEATHS, "max by (${job}) (${run_in_job} trainguard_run_deaths_total)"),
    # unfinished, and some rank wrote a heartbeat within goodput_gone_after
    # ...that has begun: a rank has stepped, or the job has died (then the time to its
    # first step after the restart is restart downtime). Start-up before a job's first step
    # (loading a checkpoint, rendezvous, compiling) is no lost goodput, and a job hung there
    # is TrainingNoFirstStep's.
    Record(
        ACCOUNTED,
        """
        max by (${job}) (${state_job} < 2) * 0 + 1
        and on (${job})
        min by (${job}) (trainguard_run_heartbeat_age_seconds ${in_job})
          < ${goodput_gone_after_s}
        and on (${job})
        (
          max by (${job}) (trainguard_run_step ${in_job})
          or
          ${job_deaths} > 0
        )
        """,
    ),
    Record(STEPPING, "max by (${job}) (${stepping_job}) * 0 + 1"),
    # stepping below the step the job had reached when it last died
    Record(
        RECOMPUTING,
        """
        max by (${job}) (${stepping_job})
        < on (${job})
        max by (${job}) (${run_in_job} trainguard_run_last_death_step)
        """,
    ),
    # a rank dead (gone, unfinished), or a restarted rank without a step in a job that died
    Record(
        DOWN,
        """
        max by (${job}) (${state_job} == 0) * 0 + 1
        or
        max by (${job}) (
          ${state_job} == 1 unless on (${target_labels}, run, rank) trainguard_run_step
        ) * 0 + 1
        and on (${job}) ${job_deaths} > 0
        """,
    ),
)

STATES = {
    "productive": ACCOUNTED + " and " + STEPPING + " unless " + RECOMPUTING,
    "recompute": ACCOUNTED + " and " + RECOMPUTING,
    "restart": ACCOUNTED + " and " + DOWN + " unless " + STEPPING,
    "idle": ACCOUNTED + " unless " + STEPPING + " unless " + DOWN,
}


def state(name: str) -> str:
    """The 0/1 series of one state: 1 in it, 0 in another, absent when not accounted."""
    return "job:trainguard_run_" + name + ":bool"


def seconds(name: str, window: str) -> str:
    return "job:trainguard_run_" + name + "_seconds:" + window


#: one sample per evaluation of the goodput group (no labels): a block's samples of a state
#: divided by the group's evaluations within the block is the share of the block spent in it,
#: whatever the group's cadence and however late in the block the job appeared
TICK = "trainguard:goodput_evaluation:tick"
#: Prometheus' time at each evaluation of the slow group (no labels): its average interval
#: over a window, by which the sum of the blocks over the window is scaled back to seconds
SLOW_TICK = "trainguard:goodput_slow_evaluation:time"


def cadence(window: str) -> str:
    """The slow group's mean interval between evaluations over ``window``, in seconds."""
    return "trainguard:goodput_slow_cadence_seconds:" + window


def _cadence(window: str) -> Record:
    # blocks of slow_rules_interval recorded every c seconds overlap (c shorter: a ruler
    # evaluating the group more often, promtool) or leave gaps (missed evaluations): the sum
    # of the blocks over the window is slow_rules_interval / c times the time in the state
    tick = SLOW_TICK + "[" + window + "]"
    return Record(
        cadence(window),
        "(max_over_time(" + tick + ") - min_over_time(" + tick + "))\n"
        "/ (count_over_time(" + tick + ") - 1 > 0)\n"
        "or vector(${slow_rules_interval_s})",
    )


def _state_record(name: str) -> Record:
    return Record(state(name), "(" + STATES[name] + ") * 0 + 1 or " + ACCOUNTED + " * 0")


def _sum_of_states(window: str) -> str:
    return "\n+ ".join(seconds(name, window) for name in STATES)


def _goodput(window: str) -> Record:
    return Record(
        "job:trainguard_run_goodput:ratio_" + window,
        seconds("productive", window) + "\n/ ((" + _sum_of_states(window) + ") > 0)",
    )


#: PromQL of both groups: a job's labels, a stepping rank, a job's accounted time over 24h
PROMQL = {
    "job": JOB,
    "in_job": IN_JOB,
    "run_in_job": RUN_IN_JOB,
    "state_job": STATE_JOB,
    "stepping_job": STEPPING_JOB,
    "job_deaths": JOB_DEATHS,
    "stepping_rank": STEPPING_RANK,
    # a rank's process in one series (alerts/rules/recording.py), instead of joining
    # process_up and finished at each use
    "state": STATE,
    "live_job": LIVE_JOB,
    "accounted_24h": " + ".join(
        "last_over_time(" + seconds(n, "24h") + "[${slow_rules_lookback}])" for n in STATES
    ),
}

GROUP = Group(
    "trainguard-goodput",
    snippets={
        **PROMQL,
        "goodput_7d": query_value(
            "last_over_time(job:trainguard_run_goodput:ratio_7d{"
            + JOB_SEL
            + "}[${slow_rules_lookback}]) * 100",
            JOB_ARGS,
            'printf "%.1f%%"',
        ),
        "lost_24h": " ".join(
            name
            + " "
            + query_value(
                "last_over_time(" + seconds(name, "24h") + "{" + JOB_SEL + "}"
                "[${slow_rules_lookback}])",
                JOB_ARGS,
                "humanizeDuration",
            )
            + sep
            for name, sep in (("recompute", ","), ("restart", ","), ("idle", ""))
        ),
    },
    rules=(
        Record(TICK, "vector(1)"),
        *CONDITIONS,
        *(_state_record(name) for name in STATES),
        Record(LIVE_JOB, "max by (${job}) (${state_job} == 1) * 0 + 1"),
        # a job with a live rank now: an abandoned job's goodput is history, not a page
        Alert(
            "TrainingGoodputLow",
            "warning",
            # ...that has been accounted for goodput_min_accounted at least: a job's first
            # minutes are not a goodput to page on; and not while no live rank has stepped yet
            # (a restart's start-up, hung or not: TrainingNoFirstStep's, one page for it)
            expr="""
            last_over_time(job:trainguard_run_goodput:ratio_24h[${slow_rules_lookback}])
              < ${goodput_min}
            and on (${job}) ${live_job}
            and on (${job})
            (${accounted_24h}) >= ${goodput_min_accounted_s}
            unless on (${job})
            (
              ${live_job}
              unless on (${job})
              max by (${job}) (
                ${state_job} == 1 and on (${target_labels}, run, rank) trainguard_run_step
              )
            )
            """,
            keep_firing_for="${keep_firing_for}",  # a lasting state: not lost to one failed scrape
            summary="""
            Training run {{ $labels.run }}{{ with $labels.job_id }} (job {{ . }}){{ end }} kept
            {{ $value | humanizePercentage }} of its time in productive steps over 24h.
            """,
            description="""
            Over its accounted time of the last 24h run {{ $labels.run }}{{ with
            $labels.job_id }} (job {{ . }}){{ end }} trained
            productively {{ $value | humanizePercentage }} of the time (threshold
            ${goodput_min}; 7 days: ${goodput_7d}). Lost in 24h: ${lost_24h} (recompute:
            redoing steps lost since the last complete checkpoint; restart: from a death to
            the first step after the restart; idle: starting up, stalled or stepping on a NaN
            loss). Checkpoint more
            often, restart faster, or fix what keeps killing it.
            """,
        ),
    ),
)

SLOW = Group(
    "trainguard-goodput.slow",
    snippets=PROMQL,
    interval="${slow_rules_interval}",
    rules=(
        Record(SLOW_TICK, "time()"),
        *(
            Record(
                seconds(name, "block"),
                "(\n"
                "  sum_over_time(" + state(name) + "[${slow_rules_interval}])\n"
                "  / scalar(count_over_time(" + TICK + "[${slow_rules_interval}]))\n"
                "  * ${slow_rules_interval_s}\n"
                # no evaluation of the goodput group in the block (a restart, a ruler late
                # under load) makes the scalar NaN: no block then, never a NaN one that would
                # poison the 24h and 7d sums for a day
                ") >= 0",
            )
            for name in STATES
        ),
        _cadence("24h"),
        _cadence("7d"),
        *(
            Record(
                seconds(name, window),
                "sum_over_time(" + seconds(name, "block") + "[" + window + "])\n"
                "* scalar(" + cadence(window) + ")\n"
                "/ ${slow_rules_interval_s}",
            )
            for window in ("24h", "7d")
            for name in STATES
        ),
        _goodput("24h"),
        _goodput("7d"),
    ),
)
