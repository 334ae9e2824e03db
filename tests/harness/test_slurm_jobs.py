"""Training jobs on a real Slurm cluster (helpers/slurm.py: slurmctld, three slurmd and munged on
127.0.0.1), each node with its own state directory and exporter, each rank a real gloo training
loop under ``trainguard.Run``. What the exporters publish is asserted, as Prometheus would scrape
it: a job requeued by ``scontrol requeue`` comes back under the same job id with attempt 1 on its
new nodes while the heartbeats of attempt 0 stay behind saying 0; a preemption's SIGTERM is
recorded by every rank; a rank SIGKILLed is a dead process on its node's exporter and the other
rank ends. With a real Prometheus loading the shipped rules and a real Alertmanager, the
requeued job that steps again notifies nothing but, at most, a restart: its attempt 0 is
history (issue 40)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from helpers.exporter_proc import Samples
from helpers.paths import REPO
from helpers.promstack import ALERTMANAGER, PROMETHEUS, Alertmanager, Prometheus, Webhook
from helpers.slurm_job import TrainingNodes
from helpers.two_nodes import alertmanager_config
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


def requeue(nodes: TrainingNodes, run: str) -> tuple[str, Ranks, Ranks]:
    """A 2-node ``sbatch --requeue`` job, stepping, then requeued by ``scontrol requeue`` with
    its rank 0's node drained (as after a node failure), so that attempt 1 runs on other
    nodes; returns (job id, attempt 0's ranks, attempt 1's ranks) once attempt 1 steps."""
    cluster = nodes.cluster
    job = nodes.submit(run, "--requeue", "--nodes=2")
    first = cluster.wait_job(job, ["RUNNING"])
    old = wait_for(
        lambda: stepping(nodes, run, 0),
        180,
        0.5,
        lambda: f"both ranks of attempt 0 stepping\n{nodes.output(job)}\n{cluster.logs()}",
    )
    assert sorted(node for node, _ in old) == hostnames(nodes, first["NodeList"])
    assert {row["job_id"] for row in old.values()} == {job}
    assert {row["launcher"] for row in old.values()} == {"slurm"}
    ((gone, _),) = [key for key in old if key[1] == "0"]
    cluster.command("scontrol", "update", f"NodeName={gone}", "State=DRAIN", "Reason=tg-test")
    cluster.command("scontrol", "requeue", job)
    second = cluster.wait_job(job, ["RUNNING"], 180, lambda fields: fields.get("Restarts") == "1")
    moved = hostnames(nodes, second["NodeList"])
    assert gone not in moved and len(moved) == 2, second
    new = wait_for(
        lambda: stepping(nodes, run, 1),
        180,
        0.5,
        lambda: f"both ranks of attempt 1 stepping\n{nodes.output(job)}",
    )
    # the same job id, attempt 1, on the nodes of the new allocation (rank order: node order)
    assert sorted(new) == [(node, str(rank)) for rank, node in enumerate(moved)], new
    assert {row["job_id"] for row in new.values()} == {job}
    return job, old, new


def test_a_requeued_job_comes_back_as_attempt_1_and_the_old_heartbeats_say_0(
    slurm_nodes: TrainingNodes,
) -> None:
    nodes = slurm_nodes
    job, old, new = requeue(nodes, "requeued")
    ((gone, _),) = [key for key in old if key[1] == "0"]
    # every heartbeat attempt 0 left where attempt 1 did not write over it says 0, and dead
    view = ranks(nodes, "requeued")
    left = {key: view[key] for key in old if key not in new}
    assert (gone, "0") in left
    for key, row in left.items():
        assert (row["attempt"], row["up"], row["job_id"]) == (0, 0, job), (key, row)
        # the requeue stopped them with SIGTERM, as Slurm does, and they recorded it
        assert row.get("exit") == ("signal", "SIGTERM"), (key, row)
    assert len(view) == len(new) + len(left)


#: TrainingJobRankDied's ``for`` (job_death_for), plus margin: a death of the new attempt would
#: page by then. (TrainingJobTerminated's longer job_terminated_for needs no waiting out: once the
#: newer attempt is there, the stopped ranks of attempt 0 are history and it is not even pending.)
JOB_RULES_FOR = 125.0  # job_death_for: 2m


@pytest.mark.skipif(
    not (PROMETHEUS and ALERTMANAGER),
    reason="needs the Debian packages prometheus and prometheus-alertmanager",
)
@pytest.mark.slow(seconds=60)
def test_a_requeued_job_on_the_shipped_rules_notifies_at_most_a_restart(
    slurm_nodes: TrainingNodes, tmp_path: Path
) -> None:
    nodes = slurm_nodes
    hook = Webhook()
    alertmanager = Alertmanager(tmp_path / "am", hook.url, config=alertmanager_config(hook.url))
    prom = Prometheus(
        tmp_path / "prom",
        [exporter.url.removeprefix("http://") for exporter in nodes.exporters.values()],
        rule_files=[REPO / "alerts" / "trainguard.rules.yml"],  # as shipped
        alertmanager=alertmanager.url,
    )
    try:
        requeue(nodes, "requeued")
        prom.wait_until('count(trainguard_run_job_attempt{run="requeued"} == 1) == 2', 60)
        stepped = time.monotonic()
        count: dict[str, float] = {}

        def jobs_evaluations() -> float:  # Prometheus names a group "<file>;<group>"
            groups = prom.rule_group_iterations()
            return sum(v for k, v in groups.items() if k.endswith(";trainguard-jobs"))

        def judged() -> bool:
            # past the job rules' longest `for`, then three more evaluations of their group
            if "at" not in count and time.monotonic() - stepped >= JOB_RULES_FOR:
                count["at"] = jobs_evaluations()
            return "at" in count and jobs_evaluations() >= count["at"] + 3

        wait_for(judged, JOB_RULES_FOR + 120, 0.5, "the job rules to judge the requeued job")
        alerts = prom.query('ALERTS{run="requeued"}')["data"]["result"]
        said = sorted(
            (a["metric"]["alertname"], a["metric"]["alertstate"], a["metric"].get("severity", ""))
            for a in alerts
        )
        notified = sorted(
            {
                (alert["labels"]["alertname"], alert["status"])
                for _, message in hook.received
                for alert in message.get("alerts", [])
                if alert["labels"].get("run") == "requeued"
            }
        )
        # the job steps again: at most a restart notice, nothing firing nor pending, no page
        wrong = [a for a in said if a[0] != "TrainingJobRestarted"]
        assert wrong == [], f"alerts: {said}; notified: {notified}"
        assert {name for name, _ in notified} <= {"TrainingJobRestarted"}, notified
    finally:
        prom.stop()
        alertmanager.stop()
        hook.close()


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
