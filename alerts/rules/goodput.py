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
- ``idle``: no rank stepping otherwise (starting up before the first step, stalled).

The slow group sums each state's seconds per ``slow_rules_interval`` block, then over 24h and
7d; goodput is the productive share of them (docs/metrics.md#goodput). A job is judged across
its nodes: by the site's target labels without ``instance``, plus ``run``.
"""

from __future__ import annotations

from alerts.kinds import DURATION, NUMBER, Threshold
from alerts.rules.common import Alert, Group, Record, query_value
from alerts.rules.jobs.slow import JOB, JOB_ARGS, JOB_SEL

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


#: a live rank that stepped within its stall threshold
STEPPING_RANK = (
    "run_rank:trainguard_run_step_age_seconds:running"
    " <= run_rank:trainguard_run_stall_threshold_seconds:clamp"
)
CONDITIONS = (
    # unfinished, and some rank wrote a heartbeat within goodput_gone_after
    Record(
        ACCOUNTED,
        """
        max by (${job}) (trainguard_run_finished == 0) * 0 + 1
        and on (${job})
        min by (${job}) (trainguard_run_heartbeat_age_seconds) < ${goodput_gone_after_s}
        """,
    ),
    Record(STEPPING, "max by (${job}) (${stepping_rank}) * 0 + 1"),
    # stepping below the step the job had reached when it last died
    Record(
        RECOMPUTING,
        """
        max by (${job}) (
          trainguard_run_step
          and on (${target_labels}, run, rank) (${stepping_rank})
        )
        < on (${job}) max by (${job}) (trainguard_run_last_death_step)
        """,
    ),
    # a rank dead (gone, unfinished), or a restarted rank without a step in a job that died
    Record(
        DOWN,
        """
        max by (${job}) (
          trainguard_run_process_up == 0
          unless on (${target_labels}, run, rank) trainguard_run_finished == 1
        ) * 0 + 1
        or
        max by (${job}) (
          trainguard_run_process_up == 1
          unless on (${target_labels}, run, rank) trainguard_run_finished == 1
          unless on (${target_labels}, run, rank) trainguard_run_step
        ) * 0 + 1
        and on (${job}) max by (${job}) (trainguard_run_deaths_total) > 0
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
    "stepping_rank": STEPPING_RANK,
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
        *CONDITIONS,
        *(_state_record(name) for name in STATES),
        # a job with a live rank now: an abandoned job's goodput is history, not a page
        Alert(
            "TrainingGoodputLow",
            "warning",
            # ...that has been accounted for goodput_min_accounted at least: a job's first
            # minutes (starting up) are not a goodput to page on
            expr="""
            last_over_time(job:trainguard_run_goodput:ratio_24h[${slow_rules_lookback}])
              < ${goodput_min}
            and on (${job})
            max by (${job}) (
              trainguard_run_process_up == 1
              unless on (${target_labels}, run, rank) trainguard_run_finished == 1
            )
            and on (${job})
            (${accounted_24h}) >= ${goodput_min_accounted_s}
            """,
            keep_firing_for="${keep_firing_for}",  # a lasting state: not lost to one failed scrape
            summary="""
            Training run {{ $labels.run }} kept {{ $value | humanizePercentage }} of its
            time in productive steps over 24h.
            """,
            description="""
            Over its accounted time of the last 24h run {{ $labels.run }} trained
            productively {{ $value | humanizePercentage }} of the time (threshold
            ${goodput_min}; 7 days: ${goodput_7d}). Lost in 24h: ${lost_24h} (recompute:
            redoing steps lost since the last complete checkpoint; restart: from a death to
            the first step after the restart; idle: starting up or stalled). Checkpoint more
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
        *(
            Record(
                seconds(name, "block"),
                "avg_over_time(" + state(name) + "[${slow_rules_interval}]) "
                "* ${slow_rules_interval_s}",
            )
            for name in STATES
        ),
        *(
            Record(
                seconds(name, window),
                "sum_over_time(" + seconds(name, "block") + "[" + window + "])",
            )
            for window in ("24h", "7d")
            for name in STATES
        ),
        _goodput("24h"),
        _goodput("7d"),
    ),
)
