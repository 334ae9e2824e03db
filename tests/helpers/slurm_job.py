"""A training job on the real Slurm cluster of helpers/slurm.py: every node with its own state
directory (chosen in the job script from ``$SLURMD_NODENAME``) and its own exporter, as a real
cluster runs one exporter per node; every rank a small real gloo training loop under
``trainguard.Run`` whose job, rank and attempt come from Slurm's environment alone."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from helpers.exporter_proc import Exporter, Samples, child_env
from helpers.slurm import SlurmCluster

#: {(node, rank): what that node's exporter publishes of the rank}
Ranks = dict[tuple[str, str], dict[str, Any]]

#: a rank of the job: a small real training loop (gloo all-reduce on CPU, one step every
#: ~50 ms) reporting through trainguard.Run; its job, rank and attempt come from Slurm's
#: environment, its state directory from the node it landed on (the job script below)
TRAIN = """
import sys, time
import torch
import torch.distributed as dist
import trainguard
name, steps = sys.argv[1], int(sys.argv[2])
dist.init_process_group("gloo")
t = torch.ones(4)
with trainguard.Run(name, interval=0.2) as run:
    step = 0
    while steps == 0 or step < steps:
        step += 1
        dist.all_reduce(t)
        t.fill_(1.0)
        run.step(step, loss=1.0 / step)
        time.sleep(0.05)
dist.destroy_process_group()
"""

#: the batch script: a rendezvous port of this attempt's own, then one srun task per node,
#: each with the state directory of the node it runs on (what an exporter per node reads)
JOB = """#!/bin/bash
export MASTER_ADDR=127.0.0.1 GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1
PORT='import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
MASTER_PORT=$({python} -c "$PORT")
export MASTER_PORT
echo "attempt ${{SLURM_RESTART_COUNT:-0}} of job $SLURM_JOB_ID on $SLURM_JOB_NODELIST"
srun bash -c 'export RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS \\
    TRAINGUARD_STATE_DIR={workdir}/state-$SLURMD_NODENAME; exec {python} {train} "$@"' \\
    rank "$@"
"""


class TrainingNodes:
    """A Slurm cluster whose every node has its own state directory and its own exporter,
    and the batch script of a training job whose ranks report there."""

    def __init__(self, cluster: SlurmCluster, workdir: Path) -> None:
        self.cluster = cluster
        self.workdir = workdir
        self.exporters: dict[str, Exporter] = {}
        train = workdir / "train.py"
        train.write_text(TRAIN)
        self.script = workdir / "job.sh"
        self.script.write_text(JOB.format(python=sys.executable, workdir=workdir, train=train))
        try:
            for node in cluster.nodes:
                state = workdir / f"state-{node}"
                state.mkdir()
                self.exporters[node] = Exporter(state_dir=state)
        except BaseException:
            self.close()
            raise

    def submit(self, run: str, *options: str, steps: int = 0) -> str:
        """sbatch the training job (one rank per node, ``options`` added); its job id."""
        env = child_env({"OMP_NUM_THREADS": "1"})
        for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TRAINGUARD_JOB", "TRAINGUARD_STATE_DIR"):
            env.pop(name, None)
        return self.cluster.sbatch(
            self.script,
            [
                "--ntasks-per-node=1",
                f"--chdir={self.workdir}",
                f"--output={self.workdir}/job-%j.out",
                *options,
            ],
            [run, str(steps)],
            env=env,
        )

    def output(self, job_id: str) -> str:
        """What the batch script and its ranks printed (for assertion messages)."""
        path = self.workdir / f"job-{job_id}.out"
        return path.read_text(errors="replace")[-4000:] if path.exists() else "(no output)"

    def ranks(self, run: str) -> Ranks:
        """{(node, rank): what that node's exporter publishes of the rank}, from one scrape of
        each exporter still running: process_up, attempt, job_id, step, pid, the exit (cause,
        signal), finished."""
        out: Ranks = {}
        for node, exporter in self.exporters.items():
            if exporter.proc.poll() is not None:  # killed with its node
                continue
            samples: Samples = exporter.scrape()
            for (name, frozen), value in samples.items():
                labels = dict(frozen)
                if labels.get("run") != run or "rank" not in labels:
                    continue
                row = out.setdefault((node, labels["rank"]), {})
                if name == "trainguard_run_process_up":
                    row["up"] = value
                elif name == "trainguard_run_job_attempt":
                    row["attempt"] = value
                elif name == "trainguard_run_job_info":
                    row["job_id"] = labels["job_id"]
                    row["launcher"] = labels["launcher"]
                elif name == "trainguard_run_step":
                    row["step"] = value
                elif name == "trainguard_run_info":
                    row["pid"] = int(labels["pid"])
                elif name == "trainguard_run_exit_info":
                    row["exit"] = (labels["cause"], labels["signal"])
                elif name == "trainguard_run_finished":
                    row["finished"] = value
        return out

    def stepping(self, run: str, attempt: int, count: int = 2) -> Ranks | None:
        """The ranks of ``attempt`` alive and past step 3, once ``count`` of them are."""
        found = {
            key: row
            for key, row in self.ranks(run).items()
            if row.get("up") == 1 and row.get("attempt") == attempt and row.get("step", 0) > 3
        }
        return found if len(found) == count else None

    def lose_node(self, node: str) -> None:
        """The node is lost with everything on it: its slurmd, its ranks and its exporter
        SIGKILLed (:meth:`SlurmCluster.lose_node`)."""
        self.exporters[node].proc.kill()
        self.cluster.lose_node(node)
        self.exporters[node].proc.wait()

    def close(self) -> None:
        for exporter in self.exporters.values():
            exporter.stop()
