"""How each rank's current process ended, when it ended without finishing.

``trainguard_run_last_death_info`` tells why a run died once a restarted process recorded it;
this tells it per rank as soon as the process is gone, from what its last heartbeat says, so
that the rules can page a run stopped by its scheduler (``signal``, ``time_limit``) as what it
is and not as a crash. Published by the runs collector.
"""

from __future__ import annotations

from typing import Any

from trainguard.exporter.runs.rows import RunRow
from trainguard.exporter.scrape.collector import MetricSpec

EXIT_INFO = MetricSpec(
    "trainguard_run_exit_info",
    "gauge",
    ("run", "rank", "cause", "signal"),
    "Always 1 for a rank whose process ended without finishing; cause: signal, time_limit, "
    "exception or unknown; signal: the signal's name, or empty.",
)


def exit_of(row: RunRow) -> tuple[str, str] | None:
    """(cause, signal) of a rank whose process is gone without finishing, else None.

    From its last heartbeat: the signal it caught (``signal``, or ``time_limit`` when that came
    at the job's end time; also when it was killed while that signal's handler ran), an
    exception it recorded, else ``unknown`` (SIGKILL, the OOM killer, a lost node: the next
    process of the rank tells ``oom_killer`` and ``gpu_xid`` apart from the kernel log).
    """
    hb = row.heartbeat
    if hb is None or row.up is not False or row.finished is not False:
        return None
    if hb.signal is not None:
        return hb.exit_cause or "signal", hb.signal
    if hb.state == "failed":
        return "exception", ""
    return "unknown", ""


def add_exit(fam: dict[str, Any], row: RunRow) -> None:
    """Add the row's ``trainguard_run_exit_info`` series, when it has one."""
    ended = exit_of(row)
    if ended is not None:
        fam[EXIT_INFO.name].add_metric([row.run, row.rank, *ended], 1)
