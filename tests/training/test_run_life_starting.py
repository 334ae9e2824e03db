"""A framework callback's run before training begins (``RunLife.prepare``): starting, then begun.

What the heartbeat says in each case, with no framework: the callbacks only call these
(docs/heartbeat.md#starting). The processes whose end is judged are real children that exit,
raise or are killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from helpers.exporter_proc import child_env
from helpers.wait import wait_for
from trainguard.integrations._common import RunLife
from trainguard.shared.heartbeat.read import read_heartbeat
from trainguard.shared.heartbeat.record import heartbeat_filename

PREPARE = (
    "import sys\n"
    "from trainguard.integrations._common import RunLife\n"
    "life = RunLife({{'state_dir': sys.argv[1], 'interval': 0.02}})\n"
    "life.prepare('r', 0, None, None)\n"
    "{then}\n"
)


def child(state: Path, then: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PREPARE.format(then=then), str(state)],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def heartbeat(state: Path, run: str = "r") -> Path:
    return state / heartbeat_filename(run, 0)


def test_a_prepared_run_is_starting_reports_no_step_and_begins_at_start(tmp_path: Path) -> None:
    life = RunLife({"state_dir": tmp_path, "interval": 0.02})
    run = life.prepare("r", 0, tmp_path / "ckpt", "checkpoint-{step}", "huggingface")
    path = heartbeat(tmp_path)
    wait_for(lambda: path.exists(), 60, what="the first heartbeat")
    first = read_heartbeat(path)
    assert first.starting and first.step is None
    assert first.checkpoint_dir == str(tmp_path / "ckpt")  # watched from the start
    life.step(0)  # an evaluation's log before training: no step of training
    assert life.start("r", 0, tmp_path / "ckpt", "checkpoint-{step}", "huggingface") is run
    life.step(1)
    wait_for(lambda: read_heartbeat(path).step == 1, 60, what="step 1 written")
    begun = read_heartbeat(path)
    assert not begun.starting
    assert begun.started > first.started  # the start is when training began
    life.finish()
    assert read_heartbeat(path).state == "finished"


def test_a_start_under_another_name_ends_the_starting_run_cleanly(tmp_path: Path) -> None:
    life = RunLife({"state_dir": tmp_path, "interval": 0.02})
    prepared = life.prepare("init-name", 0, None, None)
    trial = life.start("trial-1", 0, None, None)  # a hyperparameter search renamed the run
    assert trial is not prepared
    assert read_heartbeat(heartbeat(tmp_path, "init-name")).state == "finished"
    trial.step(1)
    path = heartbeat(tmp_path, "trial-1")
    wait_for(lambda: path.exists() and read_heartbeat(path).step == 1, 60, what="step 1")
    assert not read_heartbeat(heartbeat(tmp_path, "trial-1")).starting
    life.finish()


def test_a_starting_process_that_exits_cleanly_finished_and_one_that_raises_failed(
    tmp_path: Path,
) -> None:
    done = child(tmp_path, "print('evaluated')")
    assert done.returncode == 0, done.stderr
    hb = read_heartbeat(heartbeat(tmp_path))
    assert (hb.state, hb.starting, hb.deaths) == ("finished", True, 0)
    crashed = child(tmp_path, "raise ValueError('corrupt checkpoint')")
    assert crashed.returncode != 0
    hb = read_heartbeat(heartbeat(tmp_path))
    assert (hb.state, hb.error, hb.deaths) == ("failed", "ValueError", 0)  # finished before


def test_a_relaunch_after_a_death_is_never_starting(tmp_path: Path) -> None:
    """The process before it was killed: this one is a relaunch, judged at once, and the
    death is counted; then a relaunch of a process that died starting is counted too."""
    proc = subprocess.Popen(
        [sys.executable, "-c", PREPARE.format(then="import time; time.sleep(600)"), str(tmp_path)],
        env=child_env(),
    )
    try:
        path = heartbeat(tmp_path)
        wait_for(
            lambda: path.exists() and read_heartbeat(path).pid == proc.pid, 120, what="heartbeat"
        )
        assert read_heartbeat(path).starting
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    crashed = child(tmp_path, "raise OSError('truncated checkpoint')")
    assert crashed.returncode != 0
    hb = read_heartbeat(heartbeat(tmp_path))
    assert (hb.state, hb.starting, hb.deaths) == ("failed", False, 1)
    again = child(tmp_path, "raise OSError('truncated checkpoint')")
    assert again.returncode != 0
    assert read_heartbeat(heartbeat(tmp_path)).deaths == 2


def test_a_second_trainer_of_the_same_run_takes_over_and_never_writes_beside_the_first(
    tmp_path: Path,
) -> None:
    """A notebook cell that builds the trainer again: the earlier starting run gives way
    (finished), one Run writes the heartbeat; a trainer built while another trains the run
    opens none."""
    kwargs = {"state_dir": tmp_path, "interval": 0.02}
    first, second = RunLife(kwargs), RunLife(kwargs)
    a = first.prepare("nb", 0, None, None)
    b = second.prepare("nb", 0, None, None)
    assert a is not None and b is not None and b is not a
    assert first.ended and not second.ended
    path = heartbeat(tmp_path, "nb")
    wait_for(lambda: read_heartbeat(path).state == "running", 60, what="the second's heartbeat")
    trained = first.start("nb", 0, None, None)  # the first trainer's train() after all
    assert trained is not b and second.ended
    trained.step(3)
    wait_for(lambda: read_heartbeat(path).step == 3, 60, what="step 3")
    third = RunLife(kwargs)
    assert third.prepare("nb", 0, None, None) is None  # built while the first one trains
    assert read_heartbeat(path).step == 3 and not read_heartbeat(path).starting
    first.finish()
    assert read_heartbeat(path).state == "finished"
