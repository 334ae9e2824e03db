"""trainguard_run_stuck_info: published for a running rank whose heartbeat says where it is stuck.

Not for a rank that steps (no ``stuck``), a rank that ended, nor a rank whose process is gone (its
last heartbeat still says where it was; it is stuck nowhere now).
"""

from __future__ import annotations

import time
from pathlib import Path

from helpers.exporter_proc import Exporter, select
from helpers.run_child import own_heartbeat, put
from trainguard.shared.heartbeat import Stuck

WHERE = "_BaseDataLoaderIter.__next__ <- train.py:88 load_batch"


def test_published_only_for_a_live_running_rank(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    since = time.time() - 60
    put(
        state,
        own_heartbeat("job", rank=0, stuck=Stuck(since, "all_reduce <- t.py:9 step", "all_reduce")),
    )
    put(state, own_heartbeat("job", rank=1, stuck=Stuck(since, WHERE)))
    put(state, own_heartbeat("job", rank=2))  # stepping
    # the same location in a heartbeat whose process is gone (a pid of no live process here)
    put(state, own_heartbeat("job", rank=3, pid=2**22 + 7, stuck=Stuck(since, WHERE)))
    put(state, own_heartbeat("done", state="finished", stuck=Stuck(since, WHERE)))
    with Exporter(state_dir=state) as exp:
        samples = exp.scrape()
    rows = {
        (d["run"], d["rank"]): (d["where"], d["collective"], v)
        for labels, v in select(samples, "trainguard_run_stuck_info").items()
        for d in [dict(labels)]
    }
    assert rows == {
        ("job", "0"): ("all_reduce <- t.py:9 step", "all_reduce", 1.0),
        ("job", "1"): (WHERE, "", 1.0),
    }
