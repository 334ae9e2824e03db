"""The rows of the run table: one run and rank each, with the log files they announce.

Kept apart from :mod:`trainguard.exporter.runs.table`, which builds them at each scrape, because
every collector and the terminal command read rows while only the table writes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trainguard.shared.heartbeat import Heartbeat


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
    file_errors: int
    errors: tuple[str, ...]


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
