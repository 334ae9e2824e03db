"""A Slurm job stopped on purpose, told apart from one cancelled with nothing said (issue 43, 2b).

On a real Slurm cluster (helpers/slurm.py), each node with its own state directory and
exporter, each rank a real gloo training loop under ``trainguard.Run``. A rank's SIGTERM reads
the same whoever sent it, and a job's ranks die in any order once one is gone (the survivors'
collectives fail): so the stop is recorded on every node of the job first, through the job's
own allocation (``srun --jobid --overlap``, one task per node running ``trainguard stop
--no-signal``), and only then is the job cancelled. Every rank's end then reads ``on_purpose``,
whatever killed it; a job cancelled with nothing said reads ``signal``, a stop by a signal that
warns and then pages, as a preemption nobody restarts must.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from helpers.exporter_proc import child_env
from helpers.slurm_job import TrainingNodes
from helpers.wait import wait_for

pytestmark = pytest.mark.slow


def _ended(nodes: TrainingNodes, run: str, live: dict[tuple[str, str], Any]) -> Any:
    view = nodes.ranks(run)
    done = {key: row for key, row in view.items() if row.get("up") == 0 and "exit" in row}
    return done if set(done) == set(live) else None


def test_a_job_recorded_on_every_node_then_cancelled_reads_on_purpose(
    slurm_nodes: TrainingNodes,
) -> None:
    nodes, cluster = slurm_nodes, slurm_nodes.cluster
    mine = nodes.submit("mine", "--nodes=2")
    other = nodes.submit("other", "--nodes=1")
    for job in (mine, other):
        cluster.wait_job(job, ["RUNNING"])
    live = {}
    for run, job, count in (("mine", mine, 2), ("other", other, 1)):
        live[run] = wait_for(
            lambda run=run, count=count: nodes.stepping(run, 0, count),
            180,
            0.5,
            lambda job=job: f"the ranks stepping\n{nodes.output(job)}\n{cluster.logs()}",
        )

    # the person's stop, said on every node of the job, inside its allocation
    said = cluster.command(
        "srun",
        f"--jobid={mine}",
        "--overlap",
        "--nodes=2",
        "--ntasks-per-node=1",
        "bash",
        "-c",
        f"exec {sys.executable} -m trainguard.exporter.terminal stop mine --no-signal "
        f"--state.dir={nodes.workdir}/state-$SLURMD_NODENAME",
        env=child_env(),
    )
    assert said.stdout.count("recorded as stopped on purpose") == 2, said.stdout + said.stderr
    cluster.command("scancel", mine)
    cluster.command("scancel", other)  # the same cancel, with nothing said

    done = wait_for(
        lambda: _ended(nodes, "mine", live["mine"]),
        120,
        0.5,
        lambda: f"both ranks gone\n{nodes.ranks('mine')}\n{nodes.output(mine)}",
    )
    # whichever died of the SIGTERM and whichever of its peer's death first: on purpose
    for key, row in done.items():
        assert row["exit"][0] == "on_purpose", (key, row, nodes.output(mine))
    gone = wait_for(
        lambda: _ended(nodes, "other", live["other"]),
        120,
        0.5,
        lambda: f"its rank gone\n{nodes.ranks('other')}\n{nodes.output(other)}",
    )
    for key, row in gone.items():
        assert row["exit"] == ("signal", "SIGTERM"), (key, row, nodes.output(other))
    # Slurm's own record cannot tell them apart: both CANCELLED, with no word of who cancelled or
    # why (alerts/runbook.md, TrainingProcessTerminated; accounting, where there is some, says
    # "CANCELLED by <uid>", never the owner's intent)
    told = [cluster.wait_job(job, ["CANCELLED"], 120) for job in (mine, other)]
    for fields in told:
        assert (fields["JobState"], fields["Reason"]) == ("CANCELLED", "None"), fields
        assert not [key for key in fields if "cancel" in key.lower()], fields
