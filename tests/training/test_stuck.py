"""Where a stalled rank is stuck: real training processes block, their heartbeats say where.

The child is tests/helpers/stuck_child.py copied to ``train.py``: its ``load_batch`` blocks while
a flag file exists. Alone, the heartbeat names ``load_batch`` at its line in ``train.py`` and the
location goes away when it steps again; in a two-rank gloo job the other rank waits in
``dist.all_reduce``, and the exporter's /metrics tells the two apart by ``collective``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.exporter_proc import Exporter, Samples, child_env, free_port, poll, select
from helpers.paths import HELPERS
from helpers.run_child import heartbeat_path, wait_heartbeat
from helpers.zygote import Zygote
from trainguard.shared.heartbeat.record import Heartbeat

#: overdue after 1 s without a step (the default, 30 s, would make a slow test)
ENV = {"TRAINGUARD_STUCK_AFTER": "1", "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}


def script(tmp_path: Path) -> tuple[Path, dict[str, int]]:
    """The child as ``train.py``, and the line numbers of its marked lines."""
    path = tmp_path / "train.py"
    shutil.copy(HELPERS / "stuck_child.py", path)
    lines = path.read_text(encoding="utf-8").splitlines()
    marks = {}
    for mark in ("BLOCKED", "ALL_REDUCE", "SAVING"):
        marks[mark] = next(i for i, line in enumerate(lines, 1) if line.endswith(f"# {mark}"))
    return path, marks


def stuck_where(hb: Heartbeat) -> str | None:
    return hb.stuck.where if hb.stuck is not None else None


def test_heartbeat_names_the_user_function_a_rank_is_blocked_in(tmp_path: Path) -> None:
    train, marks = script(tmp_path)
    state, block, stop = tmp_path / "state", tmp_path / "block", tmp_path / "stop"
    proc = subprocess.Popen(
        [sys.executable, str(train), str(state), str(block), str(stop)],
        env=child_env(ENV),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        path = heartbeat_path(state, "stuck")
        hb = wait_heartbeat(path, lambda h: (h.step or 0) >= 5)
        assert hb.stuck is None  # stepping: nothing sampled
        block.touch()
        hb = wait_heartbeat(path, lambda h: h.stuck is not None)
        assert hb.stuck is not None
        where = hb.stuck.where
        assert where.startswith(f"train.py:{marks['BLOCKED']} load_batch <- train.py:"), where
        assert " main" in where and "/" not in where, where
        assert hb.stuck.collective is None
        assert hb.stuck.since <= hb.time
        stuck_step = hb.step
        block.unlink()  # steps again: the location goes
        hb = wait_heartbeat(path, lambda h: h.stuck is None)
        assert (hb.step or 0) > (stuck_step or 0)
        stop.touch()
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
        hb = wait_heartbeat(path, lambda h: h.state == "finished")
        assert hb.stuck is None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_rank_overdue_in_a_checkpoint_save_says_it_is_saving(tmp_path: Path) -> None:
    # rank 0's routine save outlasts its pace: where it is, and that it is saving (a pause the
    # rules tell from a hang, alerts/rules/stuck.py); in its data function it is not saving
    train, marks = script(tmp_path)
    state, block, stop = tmp_path / "state", tmp_path / "block", tmp_path / "stop"
    (state / "ckpt").mkdir(parents=True)
    proc = subprocess.Popen(
        [sys.executable, str(train), str(state), str(block), str(stop)],
        env=child_env(ENV),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        path = heartbeat_path(state, "stuck")
        wait_heartbeat(path, lambda h: (h.step or 0) >= 5)
        block.with_suffix(".save").touch()
        block.touch()
        hb = wait_heartbeat(path, lambda h: h.stuck is not None)
        assert hb.stuck is not None and hb.stuck.saving, hb.stuck
        where = f"train.py:{marks['SAVING']} save_checkpoint.<locals>.write <- "
        assert hb.stuck.where.startswith(where), hb.stuck
        with Exporter(state_dir=state) as exp:
            samples = poll(exp, lambda s: bool(select(s, "trainguard_run_stuck_info")), 60)
        [labels] = [dict(lbl) for lbl in select(samples, "trainguard_run_stuck_info", run="stuck")]
        assert labels["saving"] == "true" and labels["collective"] == "", labels
        block.with_suffix(".save").unlink()
        block.unlink()
        hb = wait_heartbeat(path, lambda h: h.stuck is None)
        block.touch()  # now in its data function: not saving
        hb = wait_heartbeat(path, lambda h: h.stuck is not None)
        assert hb.stuck is not None and not hb.stuck.saving, hb.stuck
        assert hb.stuck.where.startswith(f"train.py:{marks['BLOCKED']} load_batch"), hb.stuck
        block.unlink()
        stop.touch()
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_job_metrics_tell_the_rank_in_its_data_function_from_the_one_in_all_reduce(
    tmp_path: Path, framework_zygote: Zygote
) -> None:
    train, marks = script(tmp_path)
    state, block, stop = tmp_path / "state", tmp_path / "block", tmp_path / "stop"
    port = free_port()
    logs = [open(tmp_path / f"rank{r}.log", "w") for r in range(2)]  # noqa: SIM115
    ranks = [
        framework_zygote.spawn(
            [train, str(state), str(block), str(stop), str(r), "2", str(port)],
            child_env({**ENV, "WORLD_SIZE": "2"}),
            stdout=logs[r],
            stderr=subprocess.STDOUT,
        )
        for r in range(2)
    ]
    try:
        for r in range(2):
            wait_heartbeat(heartbeat_path(state, "stuck", r), lambda h: (h.step or 0) >= 5)
        block.touch()  # rank 1 blocks in load_batch; rank 0 waits for it in all_reduce
        with Exporter(state_dir=state) as exp:

            def both(s: Samples) -> bool:
                return len(select(s, "trainguard_run_stuck_info", run="stuck")) == 2

            samples = poll(exp, both, timeout=90)
        rows = {
            dict(labels)["rank"]: dict(labels)
            for labels in select(samples, "trainguard_run_stuck_info", run="stuck")
        }
        assert set(rows) == {"0", "1"}, rows
        assert rows["0"]["collective"] == "all_reduce", rows
        where = rows["0"]["where"]
        assert where.startswith(f"all_reduce <- train.py:{marks['ALL_REDUCE']} main <- "), rows
        assert rows["1"]["collective"] == "", rows
        assert rows["1"]["where"].startswith(f"train.py:{marks['BLOCKED']} load_batch <- "), rows
    finally:
        for proc in ranks:
            proc.kill()
        for proc in ranks:
            proc.wait(60)
        for log in logs:
            log.close()


def test_a_rank_that_never_reached_its_first_step_says_where(tmp_path: Path) -> None:
    train, marks = script(tmp_path)
    state, block, stop = tmp_path / "state", tmp_path / "block", tmp_path / "stop"
    block.touch()  # blocked before step 1
    proc = subprocess.Popen(
        [sys.executable, str(train), str(state), str(block), str(stop)],
        env=child_env(ENV),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        hb = wait_heartbeat(heartbeat_path(state, "stuck"), lambda h: h.stuck is not None)
        assert hb.step is None
        assert hb.stuck is not None
        assert hb.stuck.where.startswith(f"train.py:{marks['BLOCKED']} load_batch <- "), hb
        assert hb.stuck.since - hb.started >= 2 * 1 - 0.5  # twice the floor before a first step
    finally:
        proc.kill()
        proc.wait()
