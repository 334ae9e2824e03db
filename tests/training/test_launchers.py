"""The multi-process launchers as users run them, on CPU (gloo), through a real exporter:
``accelerate launch`` and ``torchrun`` with the Hugging Face Trainer, and Lightning's own DDP
launcher (``Trainer(strategy="ddp", devices=2)`` starts the script again for rank 1).

One test a launcher, two launches each: the first parks every rank at step 15 (a checkpoint
at 10 done) to check every rank up, its step and the checkpoint complete on the exporter, then
rank 1 is SIGKILLed and the next scrape shows it dead; the second launch resumes from step 10
and finishes: every rank finished at step 20, its checkpoint complete, the death counted.
The training child is helpers/framework_child.py, the one the other end-to-end tests run."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from helpers.exporter_proc import child_env, free_port, poll, select, value
from helpers.run_child import sigkill
from test_integrations_e2e import (
    DEADLINE,
    ENV,
    MAX_STEPS,
    SAVE_STEPS,
    Training,
    exporter,
    last_step,
    tail,
)
from trainguard import checkpoint
from trainguard.shared.manifest import read_all_records
from trainguard.shared.pattern import CheckpointPattern

pytestmark = pytest.mark.slow

GATE_STEP = 15
RANKS = 2


@dataclass(frozen=True)
class Launcher:
    name: str
    framework: str  # framework_child's first argument
    #: the launch command before the script (after ``python``); ``{port}``: a free port
    prefix: tuple[str, ...]
    extra: tuple[str, ...] = ()  # after the script's own arguments


LAUNCHERS = [
    # accelerate 1.15's --cpu starts one process (several only through mpirun); --multi_gpu
    # is its torchrun launcher, whose workers fall back on CPU and gloo without CUDA
    # (use_cpu=True in the TrainingArguments): docs/integrations.md
    Launcher(
        "accelerate",
        "hf",
        (
            "-m",
            "accelerate.commands.launch",
            "--multi_gpu",
            f"--num_processes={RANKS}",
            "--num_machines=1",
            "--mixed_precision=no",
            "--dynamo_backend=no",
            "--main_process_ip=127.0.0.1",
            "--main_process_port={port}",
        ),
    ),
    Launcher(
        "torchrun-hf",
        "hf",
        (
            "-m",
            "torch.distributed.run",
            f"--nproc-per-node={RANKS}",
            "--rdzv-backend=c10d",
            "--rdzv-endpoint=127.0.0.1:{port}",
        ),
    ),
    # no launcher: Lightning's _SubprocessScriptLauncher runs `python <script> <args>` again
    Launcher("lightning-ddp", "lightning", (), (f"--devices={RANKS}", "--strategy=ddp")),
]


def start(t: Training, launcher: Launcher, gate_step: int) -> subprocess.Popen[str]:
    t.gate.mkdir(parents=True, exist_ok=True)
    port = str(free_port())
    prefix = [arg.replace("{port}", port) for arg in launcher.prefix]
    env = child_env(
        {
            **ENV,
            "GLOO_SOCKET_IFNAME": "lo",
            "MASTER_ADDR": "127.0.0.1",  # Lightning's own launcher (the others set their own)
            "MASTER_PORT": port,
            "HF_HOME": str(t.gate.parent / "hf-home"),  # no user's accelerate config
        }
    )
    with open(t.log, "a") as log:
        return subprocess.Popen(
            [sys.executable, *prefix, *t.command(gate_step, *launcher.extra)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )


def stop(proc: subprocess.Popen[str], ranks: Sequence[int] = ()) -> None:
    """The launcher and every process it started (``ranks`` too, had they left it), gone.

    Killed one by one: torchrun's workers are not in the launcher's process group.
    """
    family: list[psutil.Process] = []
    for pid in [proc.pid, *ranks]:
        with contextlib.suppress(psutil.NoSuchProcess):
            family += [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    for p in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    proc.wait()
    psutil.wait_procs(family, timeout=60)


@pytest.mark.parametrize("launcher", LAUNCHERS, ids=[x.name for x in LAUNCHERS])
def test_every_rank_reports_a_killed_rank_dies_and_the_relaunch_finishes(
    tmp_path: Path, launcher: Launcher
) -> None:
    t = Training(
        launcher.framework,
        tmp_path / f"{launcher.name}-run",
        tmp_path / "state",
        tmp_path / "gate",
        tmp_path / "train.log",
        None,
    )
    t.state.mkdir(parents=True)
    ranks = [{"run": t.name, "rank": str(r)} for r in range(RANKS)]
    ckpt = t.out if launcher.framework == "hf" else t.out / "checkpoints"
    pattern = "checkpoint-{step}" if launcher.framework == "hf" else "epoch={epoch}-step={step}"
    with exporter(t) as exp:
        first = start(t, launcher, GATE_STEP)
        pids: list[int] = []
        try:
            pids = t.wait_parked(first, ranks=RANKS)  # type: ignore[arg-type]
            # the launcher's own processes: Lightning's rank 0 is the script it starts again
            own = launcher.framework == "lightning"
            assert (pids[0] == first.pid) == own, (pids, first.pid)
            parents = [psutil.Process(pid).ppid() for pid in pids[int(own) :]]
            assert parents == [first.pid] * (RANKS - int(own)), (parents, first.pid)
            s = poll(
                exp,
                lambda s: (
                    all(value(s, "trainguard_run_step", **k) == GATE_STEP for k in ranks)
                    and last_step(s, t) == SAVE_STEPS
                ),
                DEADLINE,
            )
            assert [value(s, "trainguard_run_process_up", **k) for k in ranks] == [1, 1]
            assert [value(s, "trainguard_run_finished", **k) for k in ranks] == [0, 0]
            # one job: the rules judge its ranks together (Lightning's launcher: the callback's)
            jobs = [dict(lbl)["job_id"] for lbl in select(s, "trainguard_run_job_info", run=t.name)]
            assert len(jobs) == RANKS and len(set(jobs)) == 1 and jobs[0], jobs
            # one record, by rank 0, of the checkpoint every rank took part in
            assert sorted(read_all_records(ckpt)) == sorted(
                p.name
                for p in ckpt.iterdir()
                if CheckpointPattern(pattern).step(p.name) is not None
            )
            sigkill(pids[1])
            s = exp.scrape()  # the next scrape
            assert value(s, "trainguard_run_process_up", **ranks[1]) == 0, tail(t.log)
            assert value(s, "trainguard_run_finished", **ranks[1]) == 0
            assert value(s, "trainguard_run_step", **ranks[1]) == GATE_STEP
        finally:
            stop(first, pids)
        (t.gate / "release").touch()  # the relaunch runs through
        second = start(t, launcher, -1)
        try:
            rc = second.wait(DEADLINE)
            assert rc == 0, tail(t.log)
        finally:
            stop(second)
        s = poll(
            exp,
            lambda s: (
                all(value(s, "trainguard_run_finished", **k) == 1 for k in ranks)
                and last_step(s, t) == MAX_STEPS
            ),
            DEADLINE,
        )
        assert [value(s, "trainguard_run_step", **k) for k in ranks] == [MAX_STEPS] * RANKS
        deaths = value(s, "trainguard_run_deaths_total", run=t.name)
        assert deaths is not None and deaths >= 1, deaths
        assert value(s, "trainguard_run_last_death_step", run=t.name) == GATE_STEP
    found = checkpoint.latest(ckpt, pattern=pattern, verify_hash=True)
    assert found is not None and found.step == MAX_STEPS
