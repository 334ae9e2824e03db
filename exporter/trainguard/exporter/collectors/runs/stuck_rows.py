"""``trainguard_run_stuck_info``: where a rank whose step is overdue is stuck, per run and rank.

The reporter (``trainguard.run.stack``) samples the main thread of a rank whose step is overdue
and writes a short, bounded description into its heartbeat (``stuck``). Published only for a
running rank whose process is not known to be gone: a killed rank's last heartbeat may still say
where it was, but it is stuck nowhere now.
"""

from __future__ import annotations

from typing import Any

from trainguard.exporter.runs.rows import RunRow
from trainguard.exporter.scrape.collector import MetricSpec

STUCK_INFO = MetricSpec(
    "trainguard_run_stuck_info",
    "gauge",
    ("run", "rank", "where", "collective"),
    "1 while a rank's step is overdue and its reporter sampled where its main thread is: "
    "where is the user's innermost frames, collective the torch.distributed function it "
    "waits in (empty when none).",
)


def add_stuck(fam: dict[str, Any], row: RunRow) -> None:
    """Add the row's stuck location, if its heartbeat has one and it still runs."""
    hb = row.heartbeat
    if hb is None or hb.stuck is None or hb.state != "running" or row.up is False:
        return
    fam[STUCK_INFO.name].add_metric(
        [row.run, row.rank, hb.stuck.where, hb.stuck.collective or ""], 1
    )
