"""trainguard_run_stuck_info and ``trainguard status``: where a running rank says it is stuck.

Not for a rank that steps (no ``stuck``), a rank that ended, nor a rank whose process is gone (its
last heartbeat still says where it was; it is stuck nowhere now).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from helpers.exporter_proc import Exporter, child_env, select
from helpers.run_child import own_heartbeat, put
from trainguard.shared.heartbeat.record import Stuck

WHERE = "_BaseDataLoaderIter.__next__ <- train.py:88 load_batch"


def stuck_ranks(state: Path) -> None:
    """Ranks 0 and 1 of ``job`` stuck (in all_reduce, in load_batch), 2 stepping, 3 gone."""
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


def test_published_only_for_a_live_running_rank(tmp_path: Path) -> None:
    state = tmp_path / "state"
    stuck_ranks(state)
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


def test_status_says_where_each_stuck_rank_is(tmp_path: Path) -> None:
    state = tmp_path / "state"
    stuck_ranks(state)
    cmd = [sys.executable, "-m", "trainguard.exporter.terminal", "status", f"--state.dir={state}"]
    out = subprocess.run(
        [*cmd, "--sample=0"], env=child_env(), capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 1, out.stderr  # stalled ranks: not fine, for a script
    stuck = [line for line in out.stdout.splitlines() if line.startswith("stuck:")]
    assert stuck == [
        "stuck: run job rank 0 in all_reduce: all_reduce <- t.py:9 step",
        f"stuck: run job rank 1 at {WHERE}",
    ]
    doc = subprocess.run(
        [*cmd, "--json"], env=child_env(), capture_output=True, text=True, timeout=120
    )
    assert doc.returncode == 1, doc.stderr
    by_rank = {(r["run"], r["rank"]): r["stuck"] for r in json.loads(doc.stdout)["runs"]}
    assert by_rank == {
        ("job", "0"): "in all_reduce: all_reduce <- t.py:9 step",
        ("job", "1"): f"at {WHERE}",
        ("job", "2"): None,
        ("job", "3"): None,
        ("done", "0"): None,
    }
