"""Every alert that reads what a training process writes leaves out dead and finished ranks.

A rank's series (``trainguard_run_step``, its scalars, its allocator's counters, ...) come from
the heartbeat file its process wrote, and the exporter keeps publishing the last of them after
the process is gone: a NaN loss, a rising retry count, a step are frozen where the rank died.
An alert that reads them without asking whether the rank still runs pages for a run that is
over, and its page never resolves (TrainingLossNonFinite did, after the user stopped the run as
its runbook said). So every alert that reads such a series, directly or through a recording
rule, either joins a liveness guard (``and on (... run, rank) trainguard_run_process_up == 1``,
the process-state record ``== 1``, ``unless on (...) trainguard_run_process_up == 0``, a
record that is itself so guarded, or a series only a live process has) or is listed in
OUTLIVES with the reason its page must outlive the rank, and its runbook section says why in a
paragraph that opens with "**Outlives its ranks.**".

A lint over the generated file, as test_rule_clocks.py is: a guard anywhere in the expression
counts (one branch of an ``or`` guarded passes the whole), which the promtool cases, not this,
must catch.
"""

from __future__ import annotations

import re

import yaml

from helpers.paths import REPO

RULES = REPO / "alerts" / "trainguard.rules.yml"
METRICS_DOC = REPO / "docs" / "metrics.md"
RUNBOOK = REPO / "alerts" / "runbook.md"

#: a rank's lifecycle as the exporter judges it, or the rank's identity: what the guards and the
#: death rules are built from, not values the process reports about its training
LIFECYCLE = frozenset(
    {
        "trainguard_run_process_up",
        "trainguard_run_finished",
        "trainguard_run_starting",
        "trainguard_run_exit_info",
        "trainguard_run_info",
        "trainguard_run_job_info",
        "trainguard_run_job_attempt",
    }
)
#: per-rank series the exporter publishes only while the process lives (docs/metrics.md): the
#: driver's memory of live processes, the stuck location of a rank that still runs
LIVE_AT_SOURCE = frozenset({"trainguard_run_gpu_memory_used_bytes", "trainguard_run_stuck_info"})

#: alerts whose page must outlive the ranks they read, and why (their runbook says it too)
OUTLIVES = {
    "TrainingProcessDied": "the page is the rank's death; its last heartbeat dates it",
    "TrainingJobRankDied": "the page is the job's death; the dead ranks' last heartbeats name "
    "the rank that died first",
    "TrainingJobTerminated": "the page is the job's ranks stopped by a signal",
    "TrainingRestartLoop": "the page is the run's deaths within the window; the step its "
    "current process reached says whether it got past them",
    "AllocatorOOM": "the page is a rank an OOM stopped or killed: its process is gone or no "
    "longer steps",
    "CheckpointTruncated": "the page is a damaged checkpoint file, which a resume would load "
    "after the run is over; the run's step says how much work it holds",
    "CheckpointHashMismatch": "as CheckpointTruncated",
}

_NAME = re.compile(r"(?<![:\w])([a-z_][a-z0-9_]*:[a-z0-9_:]+|trainguard_[a-z0-9_]+)(?![:\w])")
_UP = r"(?:last_over_time\()?trainguard_run_process_up(?:\[\w+\]\))?"
_STATE = r"run_rank:trainguard_run_process_state:max"
#: what precedes an operand that only restricts: ``and``, ``and on (...)``, open parentheses
_AND = re.compile(r"(?:^|\band (?:on \([^)]*\) )?)(?:\(\s*)*$")
_UNLESS = re.compile(r"\bunless (?:on \([^)]*\) )?(?:\(\s*)*$")


def guarded(expr: str, live: set[str], down: frozenset[str] = frozenset()) -> bool:
    """Whether ``expr`` leaves out ranks that are not alive (or runs with no live rank).

    A live operand (the process up, the process-state record at 1, a live record or series)
    joined with ``and``; or, in an expression without ``or`` (every operand then narrows the
    result), a live operand anywhere but after ``unless``; or ``unless`` the process is down
    (``process_up == 0``, or a record that opens with it: ``down``).
    """
    tokens = [_UP + r" == 1", _STATE + r" == 1"]
    tokens += [re.escape(n) + r"(?![:\w])" for n in sorted(live)]
    for m in re.finditer(r"(?<![:\w])(?:" + "|".join(tokens) + ")", expr):
        before = expr[: m.start()]
        if _AND.search(before) or (" or " not in expr and not _UNLESS.search(before)):
            return True
    downs = [_UP + r" == 0"] + [re.escape(n) + r"(?![:\w{\[])" for n in sorted(down)]
    return any(
        _UNLESS.search(expr[: m.start()])
        for m in re.finditer(r"(?<![:\w])(?:" + "|".join(downs) + ")", expr)
    )


def process_series() -> frozenset[str]:
    """The per-rank series a training process writes (docs/metrics.md: a ``rank`` label)."""
    found = set()
    for line in METRICS_DOC.read_text(encoding="utf-8").splitlines():
        m = re.match(r"\| `(trainguard_run_[a-z0-9_]+)` \| \w+ \| ([^|]*)\|", line)
        if m and "`rank`" in m.group(2):
            found.add(m.group(1))
    return frozenset(found - LIFECYCLE - LIVE_AT_SOURCE)


def unguarded_reads(rules_text: str, written: frozenset[str]) -> dict[str, set[str]]:
    """Each alert that reads ``written`` series (or records of them) with no liveness guard."""
    records: dict[str, list[str]] = {}
    alerts: list[tuple[str, str]] = []
    for group in yaml.safe_load(rules_text)["groups"]:
        for rule in group["rules"]:
            expr = " ".join(str(rule["expr"]).split())
            if "record" in rule:
                records.setdefault(rule["record"], []).append(expr)
            else:
                alerts.append((rule["alert"], expr))

    # records that open with the down processes (read by several rules of their group at
    # once): ``unless`` one is what ``unless (process_up == 0 ...)`` written out would be
    down = frozenset(
        name
        for name, exprs in records.items()
        if all(re.match(_UP + r" == 0(?![\w.])", e.strip()) for e in exprs)
    )
    live: set[str] = set(LIVE_AT_SOURCE)
    tainted: set[str] = set()
    changed = True
    while changed:  # to a fixed point: records read records
        changed = False
        for name, exprs in records.items():
            for expr in exprs:
                names = set(_NAME.findall(expr))
                if name not in live and guarded(expr, live, down):
                    live.add(name)
                    changed = True
                if (
                    name not in tainted
                    and names & (written | tainted)
                    and not guarded(expr, live, down)
                ):
                    tainted.add(name)
                    changed = True
    found: dict[str, set[str]] = {}
    for alert, expr in alerts:
        reads = set(_NAME.findall(expr)) & (written | tainted)
        if reads and not guarded(expr, live, down):
            found.setdefault(alert, set()).update(reads)
    return found


def _runbook_section(alert: str) -> str:
    text = RUNBOOK.read_text(encoding="utf-8")
    m = re.search(r"^## " + alert + r"\n(.*?)(?=^## )", text, re.S | re.M)
    assert m, f"no runbook section for {alert}"
    return m.group(1)


def test_alerts_on_what_a_process_writes_leave_out_dead_and_finished_ranks() -> None:
    found = unguarded_reads(RULES.read_text(encoding="utf-8"), process_series())
    unexplained = {a: sorted(r) for a, r in found.items() if a not in OUTLIVES}
    assert unexplained == {}, (
        "these alerts read what a process writes without leaving out dead and finished ranks: "
        "guard them, or list them in OUTLIVES and say why in their runbook section"
    )


def test_each_exception_is_needed_and_its_runbook_says_why() -> None:
    found = unguarded_reads(RULES.read_text(encoding="utf-8"), process_series())
    assert sorted(set(OUTLIVES) - set(found)) == [], "guarded now: drop them from OUTLIVES"
    for alert in OUTLIVES:
        assert "**Outlives its ranks.**" in _runbook_section(alert), alert


def test_the_check_sees_the_shapes_it_looks_for() -> None:
    """The unguarded shape TrainingLossNonFinite had (fixed in issue 41), through a record too,
    and the guards that pass."""
    rules = [
        {"record": "run_rank:loss:last", "expr": "max by (run, rank) (trainguard_run_loss_x)"},
        {
            "record": "run_rank:up:live",
            "expr": "trainguard_run_step_x and on (run, rank) trainguard_run_process_up == 1",
        },
        {"alert": "Bare", "expr": "trainguard_run_loss_x >= 3"},
        {"alert": "ThroughRecord", "expr": "run_rank:loss:last > 2"},
        {
            "alert": "Unless",
            "expr": "trainguard_run_loss_x >= 3\n unless on (run, rank)\n"
            " last_over_time(trainguard_run_process_up[5m]) == 0",
        },
        {"alert": "LiveRecord", "expr": "run_rank:loss:last and on (run, rank) run_rank:up:live"},
        {"alert": "NotAGuard", "expr": "trainguard_run_loss_x unless on (run) run_rank:up:live"},
        {"record": "run_rank:up:zero", "expr": "trainguard_run_process_up == 0"},
        {"record": "run_rank:up:mixed", "expr": "x == 1 or trainguard_run_process_up == 0"},
        {"alert": "UnlessDown", "expr": "trainguard_run_loss_x unless on (run) run_rank:up:zero"},
        {"alert": "AndDown", "expr": "trainguard_run_loss_x and on (run, rank) run_rank:up:zero"},
        {"alert": "NotOnlyDown", "expr": "trainguard_run_loss_x unless run_rank:up:mixed"},
    ]
    text = yaml.safe_dump({"groups": [{"name": "g", "rules": rules}]})
    found = unguarded_reads(text, frozenset({"trainguard_run_loss_x", "trainguard_run_step_x"}))
    assert sorted(found) == ["AndDown", "Bare", "NotAGuard", "NotOnlyDown", "ThroughRecord"], found
