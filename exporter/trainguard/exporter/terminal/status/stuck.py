"""``trainguard status``: where each stuck rank is, one line per rank under the table.

From the heartbeat's ``stuck`` (``trainguard.run.stack``): a rank whose step is overdue by its
own pace and whose reporter sampled its main thread. A rank that ended or whose process is gone
is stuck nowhere, as for ``trainguard_run_stuck_info``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from trainguard.exporter.runs.rows import RunRow


class _Stuck(Protocol):
    run: str
    rank: str
    stuck: str | None


def stuck_text(row: RunRow) -> str | None:
    """``in all_reduce: all_reduce <- train.py:40 step`` for a stuck rank, else None."""
    hb = row.heartbeat
    if hb is None or hb.stuck is None or hb.state != "running" or row.up is False:
        return None
    where = hb.stuck.where or "?"
    if hb.stuck.collective:
        return f"in {hb.stuck.collective}: {where}"
    return f"at {where}"


def stuck_lines(runs: Iterable[_Stuck]) -> list[str]:
    """``stuck: run llama rank 3 at train.py:88 load_batch <- ...``, one per stuck rank."""
    return [f"stuck: run {r.run} rank {r.rank} {r.stuck}" for r in runs if r.stuck]
