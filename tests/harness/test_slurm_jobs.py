"""Training jobs on a real Slurm cluster (helpers/slurm.py: slurmctld, three slurmd and munged on
127.0.0.1), each node with its own state directory and exporter, each rank a real gloo training
loop under ``trainguard.Run``. What the exporters publish is asserted, as Prometheus would scrape
it: a job requeued by ``scontrol requeue`` comes back under the same job id with attempt 1 on its
new nodes while the heartbeats of attempt 0 stay behind saying 0; a preemption's SIGTERM is
recorded by every rank; a rank SIGKILLed is a dead process on its node's exporter and the other
rank ends."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from helpers.exporter_proc import Samples
from helpers.slurm_job import TrainingNodes
from helpers.wait import wait_for

pytestmark = pytest.mark.slow

Ranks = dict[tuple[str, str], dict[str, Any]]


def ranks(nodes: TrainingNodes, run: str) -> Ranks:
    """{(node, rank): what that node's exporter publishes of the rank}, from one scrape each:
    process_up, attempt, job_id, step, pid, the exit (cause, signal)."""
    out: Ranks = {}
    for node, exporter in nodes.exporters.items():
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


def stepping(nodes: TrainingNodes, run: str, attempt: int, count: int = 2) -> Ranks | None:
    """The ranks of ``attempt`` alive and past step 3, once ``count`` of them are."""
    found = {
        key: row
        for key, row in ranks(nodes, run).items()
        if row.get("up") == 1 and row.get("attempt") == attempt and row.get("step", 0) > 3
    }
    return found if len(found) == count else None


def hostnames(nodes: TrainingNodes, nodelist: str) -> list[str]:
    out = nodes.cluster.command("scontrol", "show", "hostnames", nodelist).stdout
    return out.split()


def test_a_requeued_job_comes_back_as_attempt_1_and_the_old_heartbeats_say_0(
    slurm_nodes: TrainingNodes,
) -> None:
    nodes, cluster = slurm_nodes, slurm_nodes.cluster
    job = nodes.submit("requeued", "--requeue", "--nodes=2")
    first = cluster.wait_job(job, ["RUNNING"])
    old = wait_for(
        lambda: stepping(nodes, "requeued", 0),
        180,
        0.5,
        lambda: f"both ranks of attempt 0 stepping\n{nodes.output(job)}\n{cluster.logs()}",
    )
    assert sorted(node for node, _ in old) == hostnames(nodes, first["NodeList"])
    assert {row["job_id"] for row in old.values()} == {job}
    assert {row["launcher"] for row in old.values()} == {"slurm"}
    # rank 0's node is drained (as after a node failure): the requeued job lands elsewhere
    ((gone, _),) = [key for key in old if key[1] == "0"]
    cluster.command("scontrol", "update", f"NodeName={gone}", "State=DRAIN", "Reason=tg-test")
    cluster.command("scontrol", "requeue", job)
    second = cluster.wait_job(job, ["RUNNING"], 180, lambda fields: fields.get("Restarts") == "1")
    moved = hostnames(nodes, second["NodeList"])
    assert gone not in moved and len(moved) == 2, second

    new = wait_for(
        lambda: stepping(nodes, "requeued", 1),
        180,
        0.5,
        lambda: f"both ranks of attempt 1 stepping\n{nodes.output(job)}",
    )
    # the same job id, attempt 1, on the nodes of the new allocation (rank order: node order)
    assert sorted(new) == [(node, str(rank)) for rank, node in enumerate(moved)], new
    assert {row["job_id"] for row in new.values()} == {job}
    # every heartbeat attempt 0 left where attempt 1 did not write over it says 0, and dead
    view = ranks(nodes, "requeued")
    left = {key: view[key] for key in old if key not in new}
    assert (gone, "0") in left
    for key, row in left.items():
        assert (row["attempt"], row["up"], row["job_id"]) == (0, 0, job), (key, row)
        # the requeue stopped them with SIGTERM, as Slurm does, and they recorded it
        assert row.get("exit") == ("signal", "SIGTERM"), (key, row)
    assert len(view) == len(new) + len(left)


def test_a_preemption_sigterm_is_recorded_by_every_rank(slurm_nodes: TrainingNodes) -> None:
    nodes, cluster = slurm_nodes, slurm_nodes.cluster
    job = nodes.submit("preempted", "--nodes=2")
    cluster.wait_job(job, ["RUNNING"])
    live = wait_for(
        lambda: stepping(nodes, "preempted", 0),
        180,
        0.5,
        lambda: f"both ranks stepping\n{nodes.output(job)}\n{cluster.logs()}",
    )
    cluster.command("scancel", "--signal=TERM", job)

    def ended() -> Ranks | None:
        view = ranks(nodes, "preempted")
        done = {key: row for key, row in view.items() if row.get("up") == 0}
        return done if set(done) == set(live) and all("exit" in r for r in done.values()) else None

    done = wait_for(ended, 120, 0.5, lambda: f"both ranks gone\n{nodes.output(job)}")
    for key, row in done.items():
        assert (row["exit"], row["finished"], row["attempt"]) == (("signal", "SIGTERM"), 0, 0), (
            key,
            row,
        )
    cluster.wait_job(job, ["COMPLETED", "FAILED", "CANCELLED"], 120)


def test_a_rank_sigkilled_is_dead_on_its_nodes_exporter_and_the_other_rank_ends(
    slurm_nodes: TrainingNodes,
) -> None:
    nodes, cluster = slurm_nodes, slurm_nodes.cluster
    job = nodes.submit("killed", "--nodes=2")
    cluster.wait_job(job, ["RUNNING"])
    live = wait_for(
        lambda: stepping(nodes, "killed", 0),
        180,
        0.5,
        lambda: f"both ranks stepping\n{nodes.output(job)}\n{cluster.logs()}",
    )
    ((victim, victim_row),) = [(key, row) for key, row in live.items() if key[1] == "1"]
    ((other, _),) = [(key, row) for key, row in live.items() if key[1] == "0"]
    assert victim[0] != other[0]
    os.kill(victim_row["pid"], signal.SIGKILL)

    def ended() -> Ranks | None:
        view = ranks(nodes, "killed")
        gone = [view.get(victim, {}), view.get(other, {})]
        return view if all(r.get("up") == 0 and "exit" in r for r in gone) else None

    view = wait_for(ended, 120, 0.5, lambda: f"both ranks gone\n{nodes.output(job)}")
    # the victim: dead on its own node's exporter, of a death nothing recorded (SIGKILL)
    assert view[victim]["exit"] == ("unknown", ""), view[victim]
    assert view[victim]["finished"] == 0
    # the other node's rank ended too, without finishing: its collective failed (exception)
    # or srun stopped it (signal)
    assert view[other]["finished"] == 0
    assert view[other]["exit"][0] in ("exception", "signal"), view[other]
    # and each exporter publishes only its own node's rank
    assert set(view) == {victim, other}
    cluster.wait_job(job, ["COMPLETED", "FAILED", "CANCELLED"], 120)
