"""The rows of the run table, and what a row means: starting, ended, stuck, dead.

Kept apart from :mod:`trainguard.exporter.runs.table`, which builds them at each scrape, because
every collector and the terminal command read rows while only the table writes them; and what a
row means is said once here, so that the runs collector's series and ``trainguard status`` never
disagree on whether a rank is starting, how its process ended, where it is stuck, or which of a
run's deaths was the last.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from trainguard.shared.heartbeat.record import Death, Heartbeat, Stuck
from trainguard.shared.stops import StopRecord, StopRecordError, read_stop, stop_filename


@dataclass(frozen=True)
class RunRow:
    """One run and rank.

    ``up`` is None when it cannot be known (no pid to check, a pid of a pid namespace this
    exporter cannot see, access denied). ``pid`` is the pid the process recorded (in its own pid
    namespace), ``pids`` the live ones as this exporter's /proc (and NVML, with the host's pid
    namespace) numbers them.
    """

    run: str
    rank: str
    host: str
    pid: int | None
    up: bool | None
    heartbeat: Heartbeat | None = None
    pids: tuple[int, ...] = ()  # the live pids of this row (several for a process_match)
    owner: int | None = None  # uid owning the heartbeat file (None: not from a heartbeat)
    #: the run ended cleanly; None when that cannot be told (a configured run)
    finished: bool | None = None
    #: ``trainguard stop``'s record naming this very process (see
    #: :mod:`trainguard.shared.stops`); None when nobody said it is stopped on purpose
    stop: StopRecord | None = None


@dataclass(frozen=True)
class LogFile:
    run: str
    path: Path
    report_errors: bool  # configured, or the run is alive: a missing log is news
    #: uid that owns the heartbeat that announced it (it must own the file too, see
    #: :func:`~trainguard.exporter.runs.targets.ownership_problem`); None for a log file from the
    #: config file
    owner: int | None = None


@dataclass(frozen=True)
class RunView:
    rows: tuple[RunRow, ...]
    log_files: tuple[LogFile, ...]
    files_ok: int
    errors: tuple[str, ...]
    #: (file name, why) of each heartbeat file (or stop record) that could not be used: its own
    #: error, never the table's (a run it held is kept from its last valid reading, if any)
    bad_files: tuple[tuple[str, str], ...] = ()
    #: the state directory exists and could be listed (False: a typo in --state.dir, or
    #: removed, or unreadable: no run can be watched)
    state_dir_present: bool = True

    @property
    def file_errors(self) -> int:
        return len(self.bad_files)


def drop_superseded(rows: list[RunRow]) -> list[RunRow]:
    """Drop the rows of old higher ranks left behind by a run restarted with fewer ranks.

    A run restarted with fewer ranks leaves the old higher ranks' heartbeats behind: drop a rank
    that is not alive, is at or above the world size of a later start of the same run, and last
    wrote before that start.
    """
    newest: dict[str, Heartbeat] = {}
    for row in rows:
        hb = row.heartbeat
        if hb is not None and hb.world_size is not None:
            best = newest.get(row.run)
            if best is None or hb.started > best.started:
                newest[row.run] = hb
    out = []
    for row in rows:
        hb, latest = row.heartbeat, newest.get(row.run)
        if (
            hb is not None
            and latest is not None
            and latest.world_size is not None
            and not row.up
            and hb.rank >= latest.world_size
            and hb.time < latest.started
        ):
            continue
        out.append(row)
    return out


def with_stops(state_dir: Path, rows: list[RunRow], bad: list[tuple[str, str]]) -> list[RunRow]:
    """``rows``, each with the stop record naming the process that wrote its heartbeat, if any.

    A record that cannot be used goes to ``bad`` (its own error series, as a heartbeat file's).
    """
    return [_with_stop(state_dir, row, bad) for row in rows]


def _with_stop(state_dir: Path, row: RunRow, bad_files: list[tuple[str, str]]) -> RunRow:
    """``row`` with the stop record naming the process that wrote its heartbeat, if any.

    Looked for at every scrape (an ``open`` that fails is about a microsecond: cheaper than
    keeping the listing in step). A record about another process of the rank (a relaunch
    since) says nothing about this one.
    """
    hb = row.heartbeat
    if hb is None or hb.state == "finished":
        return row
    name = stop_filename(hb.run, hb.rank)
    try:
        record = read_stop(state_dir / name, row.owner)
    except FileNotFoundError:
        return row  # removed since the listing (trainguard retire)
    except StopRecordError as exc:
        bad_files.append((name, str(exc)))
        return row
    return replace(row, stop=record) if record.names(hb) else row


def starting(row: RunRow) -> bool:
    """Whether the row's process is alive (or not known gone) and has not begun training.

    A framework callback reports from the framework's set-up, before a checkpoint is loaded, so
    that a relaunch that dies loading it is a process the exporter sees and, once gone without
    finishing, a death. An evaluation-only script builds the same trainer and never trains:
    while such a process is starting (heartbeat ``starting``, docs/heartbeat.md#starting) no
    rule may judge it as a run that should step. A relaunch after a death is never starting
    (the reporter judges it at once), nor is a process that has ended.
    """
    hb = row.heartbeat
    return hb is not None and hb.starting and hb.state == "running" and row.up is not False


def exit_of(row: RunRow) -> tuple[str, str] | None:
    """(cause, signal) of a rank whose process is gone without finishing, else None.

    ``on_purpose`` when ``trainguard stop`` recorded that it stopped this very process (with
    the signal the process caught, if it caught one: it may have been killed, or have died
    of something else while stopping, and was stopped on purpose all the same). Otherwise
    from its last heartbeat: the signal it caught (``signal``, or ``time_limit`` when that came
    at the job's end time; also when it was killed while that signal's handler ran), an
    exception it recorded, else ``unknown`` (SIGKILL, the OOM killer, a lost node: the next
    process of the rank tells ``oom_killer`` and ``gpu_xid`` apart from the kernel log). It is
    told per rank as soon as the process is gone, so that the rules can page a run stopped by
    its scheduler as what it is and not as a crash.
    """
    hb = row.heartbeat
    if hb is None or row.up is not False or row.finished is not False:
        return None
    if row.stop is not None:
        return "on_purpose", hb.signal or ""
    if hb.signal is not None:
        return hb.exit_cause or "signal", hb.signal
    if hb.state == "failed":
        return "exception", ""
    return "unknown", ""


def stuck_at(row: RunRow) -> Stuck | None:
    """Where a rank whose step is overdue is stuck, while it still runs; else None.

    The reporter (``trainguard.run.stack``) samples the main thread of a rank whose step is
    overdue and writes it into its heartbeat. A killed rank's last heartbeat may still say
    where it was, but it is stuck nowhere now.
    """
    hb = row.heartbeat
    if hb is None or hb.stuck is None or hb.state != "running" or row.up is False:
        return None
    return hb.stuck


#: which of several ranks' records of one death event names it: the most specific cause (a
#: GPU error before an exception: the other ranks' collectives fail because one rank's GPU
#: did). A signal comes last: torchrun's agent stops the surviving ranks with SIGTERM after one
#: rank died of something else, which names the event.
_CAUSE_ORDER = {
    "reboot": 0,
    "oom_killer": 1,
    "gpu_xid": 2,
    "exception": 3,
    "unknown": 4,
    "time_limit": 5,
    "signal": 6,
}
#: restarts of different ranks noticed within this many seconds are one death event
_SAME_EVENT_SECONDS = 60.0


def age(now: float, then: float) -> float:
    """Seconds from ``then`` to ``now``, both of this host's clock.

    A timestamp a little ahead (a heartbeat written while the scrape ran, a clock stepped back)
    is an age of 0.
    """
    return max(0.0, now - then)


def last_death(records: list[Death]) -> Death | None:
    """The run's last death from all its ranks' records.

    The records of the latest restart (noticed within a minute of each other, of the same job)
    are one event; the most specific cause among them names it (the rank the OOM killer chose
    says ``oom_killer``, the ranks torchrun then stopped say ``signal``), and its earliest
    last-heartbeat is when it died. A death of another job is never part of it: a job that
    died just before its run was relaunched under a new job id is the old job's event.
    """
    if not records:
        return None
    newest = max(records, key=lambda d: d.detected)
    event = [
        d
        for d in records
        if d.detected >= newest.detected - _SAME_EVENT_SECONDS and d.job == newest.job
    ]
    return min(event, key=lambda d: (_CAUSE_ORDER.get(d.cause, 9), d.time))
