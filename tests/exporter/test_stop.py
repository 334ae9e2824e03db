"""``trainguard stop``: a run stopped on purpose, told apart from one stopped by someone else.

A caught SIGTERM reads the same whoever sent it, so it warns and then pages
(TrainingProcessTerminated, TrainingProcessDied) as a preemption nobody restarts must; the
person who stops a run says so by stopping it with ``trainguard stop``, which records the very
process it stops before it signals it (issue 43, item 2b). Real training processes, a real
exporter, real signals.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from helpers.exporter_proc import Exporter, child_env, poll, value
from helpers.run_child import heartbeat_path, sigkill, start_child, wait_heartbeat
from test_terminal import status_json, tg
from trainguard.shared.stops import stop_filename

#: a run whose SIGTERM handler takes its time (a checkpoint saved on SIGTERM), or never ends
SLOW_CHILD = r"""
import signal, sys, time
import trainguard

name, state_dir, mode = sys.argv[1], sys.argv[2], sys.argv[3]
if mode == "ignore":
    signal.signal(signal.SIGTERM, lambda s, f: None)  # the guard chains it: recorded, ignored
run = trainguard.Run(name, state_dir=state_dir, interval=0.02)
for i in range(11):
    run.step(i, loss=1.0)
while True:
    time.sleep(0.05)
"""


def _on(s: object, run: str, cause: str, sig: str = "SIGTERM") -> float | None:
    return value(s, "trainguard_run_exit_info", run=run, rank="0", cause=cause, signal=sig)  # type: ignore[arg-type]


def _stop_path(state: Path, run: str) -> Path:
    return state / stop_filename(run, 0)


def test_stop_says_on_purpose_where_a_plain_sigterm_says_signal(tmp_path: Path) -> None:
    state = tmp_path / "state"
    mine = start_child("mine", state, 10, "hang")
    other = start_child("other", state, 10, "hang")
    try:
        for name in ("mine", "other"):
            wait_heartbeat(heartbeat_path(state, name), lambda hb: hb.step == 10)
        with Exporter(state_dir=state) as exp:
            before = time.time()
            r = tg("stop", "mine", f"--state.dir={state}", "--timeout=60s")
            assert r.returncode == 0, (r.stdout, r.stderr)
            assert f"rank 0 (pid {mine.pid}) ended after" in r.stdout
            assert "recorded as stopped on purpose" in r.stdout
            assert mine.wait(60) == -signal.SIGTERM  # it died of the signal, as without us

            os.kill(other.pid, signal.SIGTERM)  # the same signal, from someone who says nothing
            other.wait(60)
            s = poll(
                exp, lambda s: _on(s, "other", "signal") == 1 and _on(s, "mine", "on_purpose") == 1
            )
            assert value(s, "trainguard_run_process_up", run="mine", rank="0") == 0
            assert _on(s, "mine", "on_purpose") == 1
            assert _on(s, "mine", "signal") is None
            # a SIGTERM with no such word is what it was: a stop by a signal, a warning first
            assert _on(s, "other", "signal") == 1
            assert _on(s, "other", "on_purpose") is None
            requested = value(
                s, "trainguard_run_stop_requested_timestamp_seconds", run="mine", rank="0"
            )
            assert requested is not None and before <= requested <= time.time()
            assert (
                value(s, "trainguard_run_stop_requested_timestamp_seconds", run="other", rank="0")
                is None
            )
            assert value(s, "trainguard_heartbeat_file_errors") == 0
            # trainguard status says the same: stopped on purpose, beside a dead run
            rows = {r["run"]: r for r in status_json(state, "--sample=0", rc=1)["runs"]}
            assert (rows["mine"]["state"], rows["mine"]["exit_cause"]) == ("stopped", "on_purpose")
            assert rows["mine"]["stop_requested"] == requested
            assert (rows["other"]["state"], rows["other"]["exit_cause"]) == ("dead", "signal")

            # the record names the process it stopped: a relaunch of the rank counts no death
            # for it (a plain SIGTERM's relaunch does), and if it then crashes, that is a crash,
            # whatever the record left behind says
            again = start_child("mine", state, 10, "hang")
            other_again = start_child("other", state, 10, "hang")
            try:
                hb = wait_heartbeat(heartbeat_path(state, "mine"), lambda hb: hb.pid == again.pid)
                assert (hb.deaths, hb.death_history) == (0, ())
                hb = wait_heartbeat(
                    heartbeat_path(state, "other"), lambda hb: hb.pid == other_again.pid
                )
                assert (hb.deaths, [d.cause for d in hb.death_history]) == (1, ["signal"])
                assert _stop_path(state, "mine").exists()
                s = poll(
                    exp, lambda s: value(s, "trainguard_run_process_up", run="mine", rank="0") == 1
                )
                assert (
                    value(
                        s, "trainguard_run_stop_requested_timestamp_seconds", run="mine", rank="0"
                    )
                    is None
                )
                sigkill(again.pid)
                s = poll(exp, lambda s: _on(s, "mine", "unknown", "") == 1)
                assert _on(s, "mine", "unknown", "") == 1
                assert _on(s, "mine", "on_purpose", "") is None
            finally:
                for child in (again, other_again):
                    if child.poll() is None:
                        sigkill(child.pid)
                    child.wait(60)

            # retire forgets the run, and its record with it
            r = tg("retire", "mine", f"--state.dir={state}")
            assert r.returncode == 0, (r.stdout, r.stderr)
            assert not _stop_path(state, "mine").exists()
    finally:
        for child in (mine, other):
            if child.poll() is None:
                sigkill(child.pid)
            child.wait(60)


def _slow(name: str, state: Path, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", SLOW_CHILD, name, str(state), mode],
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_a_process_that_outlives_the_deadline_is_reported_and_killed_with_kill(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    proc = _slow("stubborn", state, "ignore")
    try:
        wait_heartbeat(heartbeat_path(state, "stubborn"), lambda hb: hb.step == 10)
        r = tg("stop", "stubborn", f"--state.dir={state}", "--timeout=1s")
        assert r.returncode == 1, (r.stdout, r.stderr)
        assert f"rank 0 (pid {proc.pid}) still running after 1s" in r.stderr
        assert proc.poll() is None
        (row,) = status_json(state, "--sample=0")["runs"]  # needs nobody: exit 0
        assert (row["state"], row["exit_cause"]) == ("stopping", None)
        with Exporter(state_dir=state) as exp:
            s = exp.scrape()
            # alive: no exit yet, and the stop it was asked for shows
            assert value(s, "trainguard_run_process_up", run="stubborn", rank="0") == 1
            assert (
                value(
                    s, "trainguard_run_stop_requested_timestamp_seconds", run="stubborn", rank="0"
                )
                is not None
            )
            r = tg("stop", "stubborn", f"--state.dir={state}", "--timeout=1s", "--kill")
            assert r.returncode == 0, (r.stdout, r.stderr)
            assert proc.wait(60) == -signal.SIGKILL
            s = poll(exp, lambda s: _on(s, "stubborn", "on_purpose") == 1)
            assert _on(s, "stubborn", "on_purpose") == 1  # killed, and on purpose all the same

        # nothing alive left to stop: said, and exit status 1
        r = tg("stop", "stubborn", f"--state.dir={state}")
        assert r.returncode == 1 and "rank 0 already ended" in r.stderr
        r = tg("stop", "nosuch", f"--state.dir={state}")
        assert r.returncode == 1 and "no heartbeat of run 'nosuch'" in r.stderr
        assert tg("stop", "bad\nname", f"--state.dir={state}").returncode == 2
        assert tg("stop", "x", f"--state.dir={tmp_path / 'missing'}").returncode == 2
    finally:
        if proc.poll() is None:
            sigkill(proc.pid)
        proc.wait(60)


def test_a_record_nobody_may_write_or_nobody_can_read_is_not_honoured(tmp_path: Path) -> None:
    """Only the run's owner (or root) speaks for it; a bad record costs only itself."""
    state = tmp_path / "state"
    forged, junk = start_child("forged", state, 10, "hang"), start_child("junk", state, 10, "hang")
    fifo = start_child("fifo", state, 10, "hang")
    try:
        hbs = {}
        for name in ("forged", "junk", "fifo"):
            hbs[name] = wait_heartbeat(heartbeat_path(state, name), lambda hb: hb.step == 10)
        hb = hbs["forged"]
        record = {
            "format": 1,
            "run": "forged",
            "rank": 0,
            "pid": hb.pid,
            "create_time": hb.create_time,
            "boot_id": hb.boot_id,
            "requested": time.time(),
            "until": time.time() + 600,
            "signal": "SIGTERM",
        }
        forged_path = _stop_path(state, "forged")
        forged_path.write_text(json.dumps(record))
        if os.getuid() == 0:  # another user wrote it into the shared state dir (as root only)
            os.chown(forged_path, 12345, 12345)
        _stop_path(state, "junk").write_text("{not json")
        os.mkfifo(_stop_path(state, "fifo"))  # a FIFO in its place is refused, never waited on
        with Exporter(state_dir=state) as exp:
            for child in (forged, junk, fifo):
                os.kill(child.pid, signal.SIGTERM)
                child.wait(60)
            s = poll(
                exp, lambda s: all(_on(s, r, "signal") == 1 for r in ("forged", "junk", "fifo"))
            )
            junk_name = _stop_path(state, "junk").name
            assert _on(s, "junk", "signal") == 1
            assert value(s, "trainguard_heartbeat_file_invalid", file=junk_name) == 1
            assert _on(s, "fifo", "signal") == 1
            fifo_name = _stop_path(state, "fifo").name
            assert value(s, "trainguard_heartbeat_file_invalid", file=fifo_name) == 1
            assert value(s, "trainguard_collector_success", collector="runs") == 1
            if os.getuid() == 0:
                assert _on(s, "forged", "signal") == 1
                assert _on(s, "forged", "on_purpose") is None
                assert value(s, "trainguard_heartbeat_file_invalid", file=forged_path.name) == 1
    finally:
        for child in (forged, junk, fifo):
            if child.poll() is None:
                sigkill(child.pid)
            child.wait(60)


def test_no_signal_records_for_a_stop_sent_otherwise_and_a_deadline_passed_covers_nothing(
    tmp_path: Path,
) -> None:
    """``--no-signal``: the person stops the run another way (scancel) after recording; a
    process still running at ``--within`` is no longer covered, so a record never hides a
    later crash."""
    state = tmp_path / "state"
    later, late = start_child("later", state, 10, "hang"), start_child("late", state, 10, "hang")
    try:
        for name in ("later", "late"):
            wait_heartbeat(heartbeat_path(state, name), lambda hb: hb.step == 10)
        r = tg("stop", "later", f"--state.dir={state}", "--no-signal")
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert f"rank 0 (pid {later.pid}): recorded as stopped on purpose" in r.stdout
        assert "now stop run 'later'" in r.stdout
        assert later.poll() is None  # nothing sent
        r = tg("stop", "late", f"--state.dir={state}", "--no-signal", "--within=1s", "--timeout=1s")
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert tg("stop", "late", f"--state.dir={state}", "--within=1s").returncode == 2
        # the deadline passes while it runs on (its reporter writes every 20 ms)
        until = json.loads(_stop_path(state, "late").read_text())["until"]
        wait_heartbeat(heartbeat_path(state, "late"), lambda hb: hb.time > until)
        with Exporter(state_dir=state) as exp:
            s = exp.scrape()
            assert (
                value(s, "trainguard_run_stop_requested_timestamp_seconds", run="later", rank="0")
                is not None
            )
            assert (
                value(s, "trainguard_run_stop_requested_timestamp_seconds", run="late", rank="0")
                is None
            )
            os.kill(later.pid, signal.SIGTERM)  # scancel, say: the same signal, said before
            os.kill(late.pid, signal.SIGTERM)
            later.wait(60)
            late.wait(60)
            s = poll(
                exp, lambda s: _on(s, "later", "on_purpose") == 1 and _on(s, "late", "signal") == 1
            )
            assert _on(s, "later", "on_purpose") == 1
            assert _on(s, "late", "signal") == 1  # as if nothing had been said
            assert _on(s, "late", "on_purpose") is None
    finally:
        for child in (later, late):
            if child.poll() is None:
                sigkill(child.pid)
            child.wait(60)


#: one torchrun worker reporting through trainguard.Run (its job identity from torchrun's
#: environment), stepping until stopped
WORKER = r"""
import sys, time
import trainguard
run = trainguard.Run(sys.argv[1], state_dir=sys.argv[2], interval=0.05)
step = 0
while True:
    step += 1
    run.step(step, loss=1.0)
    time.sleep(0.02)
"""


def test_under_torchrun_the_launcher_is_stopped_after_the_record(tmp_path: Path) -> None:
    """A worker stopped alone is restarted by torchrun (--max-restarts), as a new process the
    record does not cover (the command says so); recorded with --no-signal and then torchrun
    itself stopped, the run is over on purpose."""
    state = tmp_path / "state"
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=1",
            "--max-restarts=1",
            "--monitor-interval=0.1",
            str(worker),
            "elastic",
            str(state),
        ],
        env=child_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        first = wait_heartbeat(heartbeat_path(state, "elastic"), lambda hb: (hb.step or 0) > 3)
        assert first.job is not None and first.job.launcher == "torchrun"
        r = tg("stop", "elastic", f"--state.dir={state}", "--timeout=60s")
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert "these are torchrun's workers" in r.stderr
        # restarted: a new process, stepping; the stop it came from is no death
        again = wait_heartbeat(
            heartbeat_path(state, "elastic"), lambda hb: hb.pid != first.pid and (hb.step or 0) > 3
        )
        assert again.deaths == 0 and again.job is not None and again.job.restart_count == 1
        assert agent.poll() is None

        r = tg("stop", "elastic", f"--state.dir={state}", "--no-signal")
        assert r.returncode == 0, (r.stdout, r.stderr)
        with Exporter(state_dir=state) as exp:
            agent.send_signal(signal.SIGTERM)  # torchrun stops its worker and exits
            agent.wait(60)
            s = poll(
                exp, lambda s: value(s, "trainguard_run_process_up", run="elastic", rank="0") == 0
            )
            assert value(s, "trainguard_run_process_up", run="elastic", rank="0") == 0
            assert _on(s, "elastic", "on_purpose") == 1
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
        agent.wait(60)
