"""A relaunch that dies loading its checkpoint is a death; a script that only evaluates is not.

Issue 27, case 15: a relaunch that crashed while loading its checkpoint, before the framework's
train-begin hook, left no trace (the heartbeat still named the killed process before it, the
death count stayed put). The callbacks now report from the framework's set-up, in a starting
phase (docs/heartbeat.md#starting). Real training children (helpers/framework_child.py, the
real callbacks), really killed, a real checkpoint corrupted so that the real resume raises, and
a real exporter scraped over HTTP.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers.exporter_proc import REPO, Exporter, Samples, child_env, poll, select, value
from helpers.run_child import sigkill
from helpers.wait import wait_for
from helpers.zygote import Forked, Zygote

pytestmark = pytest.mark.slow

CHILD = REPO / "tests" / "helpers" / "framework_child.py"
EVAL_CHILD = REPO / "tests" / "helpers" / "eval_child.py"
DEADLINE = 600.0  # importing a framework on a loaded 2-core machine takes tens of seconds
ENV = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def tail(log: Path) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-40:])


def spawn(zygote: Zygote, argv: list[str], log: Path) -> Forked:
    with open(log, "a") as out:
        return zygote.spawn(argv, child_env(ENV), stdout=out, stderr=subprocess.STDOUT)


def parked(gate: Path, proc: Forked, log: Path) -> int:
    """The pid the child wrote at its gate, once it is there."""
    f = gate / "parked-rank0"

    def there() -> bool:
        if f.exists() and f.read_text().endswith("\n"):
            return True
        if proc.poll() is not None:
            raise AssertionError(f"exited with {proc.returncode} before its gate:\n{tail(log)}")
        return False

    wait_for(there, DEADLINE, what="the child at its gate")
    return int(f.read_text())


def ended(proc: Forked, log: Path) -> int:
    try:
        return proc.wait(DEADLINE)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"the child did not end:\n{tail(log)}") from None


def pids(s: Samples, run: str) -> list[str]:
    return [dict(labels)["pid"] for labels in select(s, "trainguard_run_info", run=run)]


def corrupt_same_size(path: Path) -> None:
    """Garbage of the file's own size: still listed complete by its size, unreadable."""
    path.write_bytes(b"\x00" * path.stat().st_size)


#: (framework, the file of step 10's checkpoint the resume reads, relative to --out)
CORRUPT: dict[str, Callable[[Path], Path]] = {
    "hf": lambda out: out / "checkpoint-10" / "trainer_state.json",
    "lightning": lambda out: out / "checkpoints" / "epoch=0-step=10.ckpt",
}


@pytest.mark.parametrize("framework", ["hf", "lightning"])
def test_a_relaunch_dying_while_loading_its_checkpoint_is_seen_and_counted(
    tmp_path: Path, framework: str, framework_zygote: Zygote
) -> None:
    """Killed at step 15 (a checkpoint at 10), then relaunched twice; each relaunch resumes
    from step 10's checkpoint, made unreadable, and raises before training begins. Each is the
    process the exporter names, dead without finishing, and each death is counted."""
    out, state, gate, log = (
        tmp_path / "run",
        tmp_path / "state",
        tmp_path / "gate",
        tmp_path / "log",
    )
    state.mkdir()
    gate.mkdir()
    run, key = out.name, {"run": out.name, "rank": "0"}
    argv = [
        str(CHILD),
        framework,
        f"--out={out}",
        f"--state-dir={state}",
        f"--gate={gate}",
        "--max-steps=20",
        "--save-steps=10",
    ]
    config = tmp_path / "trainguard.yml"
    config.write_text("checkpoints: {grace_period: 1s}\n")
    with Exporter([f"--config.file={config}"], state_dir=state) as exp:
        first = spawn(framework_zygote, [*argv, "--gate-step=15"], log)
        try:
            pid = parked(gate, first, log)
            poll(exp, lambda s: value(s, "trainguard_run_step", **key) == 15, DEADLINE)
            sigkill(pid)
        finally:
            if first.poll() is None:
                first.kill()
            first.wait()
        dead = exp.scrape()
        assert pids(dead, run) == [str(pid)]
        assert value(dead, "trainguard_run_process_up", **key) == 0
        assert value(dead, "trainguard_run_deaths_total", run=run) == 0
        corrupt_same_size(CORRUPT[framework](out))
        for deaths in (1, 2):
            relaunch = spawn(framework_zygote, argv, log)
            rc = ended(relaunch, log)
            assert rc != 0, tail(log)
            assert "Traceback" in log.read_text(errors="replace")
            s = poll(exp, lambda s, p=relaunch.pid: pids(s, run) == [str(p)], 60)
            # the relaunch is the process the exporter names: gone without finishing, by an
            # exception, and the death of the process before it counted
            assert pids(s, run) == [str(relaunch.pid)], tail(log)
            assert value(s, "trainguard_run_process_up", **key) == 0, tail(log)
            assert value(s, "trainguard_run_finished", **key) == 0
            assert value(s, "trainguard_run_starting", **key) is None
            assert value(s, "trainguard_run_exit_info", **key, cause="exception", signal="") == 1
            assert value(s, "trainguard_run_deaths_total", run=run) == deaths
            # no step of its own: the relaunch died before its first
            assert value(s, "trainguard_run_step", **key) is None


def test_an_evaluation_only_script_is_starting_then_finished(
    tmp_path: Path, framework_zygote: Zygote
) -> None:
    """A Trainer built with the callback, only evaluate() called: while alive it is seen
    (its pid, starting) and nothing a rule judges a training run by is there (process_up,
    finished, the start age: no TrainingNoFirstStep, stall, goodput); its clean exit is a
    clean finish, no death."""
    out, state, gate, log = (
        tmp_path / "eval",
        tmp_path / "state",
        tmp_path / "gate",
        tmp_path / "log",
    )
    state.mkdir()
    gate.mkdir()
    run, key = out.name, {"run": out.name, "rank": "0"}
    with Exporter([], state_dir=state) as exp:
        proc = spawn(
            framework_zygote,
            [str(EVAL_CHILD), f"--out={out}", f"--state-dir={state}", f"--gate={gate}"],
            log,
        )
        try:
            pid = parked(gate, proc, log)
            alive = poll(exp, lambda s: pids(s, run) == [str(pid)], 60)
            assert pids(alive, run) == [str(pid)]
            assert value(alive, "trainguard_run_starting", **key) == 1
            for absent in (
                "trainguard_run_process_up",
                "trainguard_run_finished",
                "trainguard_run_start_age_seconds",
                "trainguard_run_start_timestamp_seconds",
                "trainguard_run_step",
            ):
                assert value(alive, absent, **key) is None, absent
            assert not select(alive, "trainguard_run_stuck_info", run=run)
            assert value(alive, "trainguard_run_heartbeat_age_seconds", **key) is not None
            (gate / "release").touch()
            assert ended(proc, log) == 0, tail(log)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        s = poll(exp, lambda s: value(s, "trainguard_run_finished", **key) == 1, 60)
        assert value(s, "trainguard_run_process_up", **key) == 0
        assert value(s, "trainguard_run_starting", **key) is None
        assert not select(s, "trainguard_run_exit_info", run=run)
        assert value(s, "trainguard_run_deaths_total", run=run) == 0
