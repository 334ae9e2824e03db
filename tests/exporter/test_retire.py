"""``trainguard retire``, with real training processes and a real exporter (issue 43, item 2b).

A run stopped on purpose and not restarted keeps paging TrainingProcessDied (it is a dead,
unfinished run, as a preempted job nobody restarts is, which must page); ``trainguard retire``
is how a person says it is over: its heartbeat files go, and the exporter no longer publishes
it. A live run is refused.
"""

from __future__ import annotations

from pathlib import Path

from helpers.exporter_proc import Exporter, poll, value
from helpers.run_child import heartbeat_path, sigkill, start_child, wait_heartbeat
from test_terminal import tg


def test_retire_forgets_a_dead_run_and_refuses_a_live_one(tmp_path: Path) -> None:
    state = tmp_path / "state"
    stopped = start_child("stopped", state, 10, "hang")
    live = start_child("live", state, 10, "hang")
    try:
        for name in ("stopped", "live"):
            wait_heartbeat(heartbeat_path(state, name), lambda hb: hb.step == 10)
        dead = {"run": "stopped", "rank": "0"}
        with Exporter(state_dir=state) as exp:
            sigkill(stopped.pid)  # stopped, and nobody will restart it
            s = poll(exp, lambda s: value(s, "trainguard_run_process_up", **dead) == 0)
            # not retired: a dead unfinished run, published as such scrape after scrape (what
            # TrainingProcessDied pages on, as for a preempted job nobody restarts)
            for _ in range(3):
                s = exp.scrape()
                assert value(s, "trainguard_run_process_up", **dead) == 0

            r = tg("retire", "live", f"--state.dir={state}")
            assert r.returncode == 1, (r.stdout, r.stderr)
            assert "rank 0 is alive" in r.stderr and "stop it first" in r.stderr
            assert heartbeat_path(state, "live").exists()

            r = tg("retire", "stopped", f"--state.dir={state}")
            assert r.returncode == 0, (r.stdout, r.stderr)
            assert f"removed {heartbeat_path(state, 'stopped')}" in r.stdout
            assert not heartbeat_path(state, "stopped").exists()
            s = exp.scrape()
            assert value(s, "trainguard_run_process_up", **dead) is None  # forgotten
            assert value(s, "trainguard_run_process_up", run="live", rank="0") == 1

            r = tg("retire", "stopped", f"--state.dir={state}")
            assert r.returncode == 1 and "no heartbeat of run 'stopped'" in r.stderr
            assert tg("retire", "bad\nname", f"--state.dir={state}").returncode == 2
    finally:
        for child in (stopped, live):
            if child.poll() is None:
                sigkill(child.pid)
            child.wait(60)
