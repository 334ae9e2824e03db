"""Training jobs on a real Slurm cluster (helpers/slurm.py: slurmctld, three slurmd and munged on
127.0.0.1), each node with its own state directory and exporter, each rank a real gloo training
loop under ``trainguard.Run``. What the exporters publish is asserted, as Prometheus would scrape
it: a job requeued by ``scontrol requeue`` comes back under the same job id with attempt 1 on its
new nodes while the heartbeats of attempt 0 stay behind saying 0. With a real Prometheus loading
the shipped rules and a real Alertmanager, the requeued job that steps again notifies nothing
but, at most, a restart: its attempt 0 is history (issue 40). The requeue is waited for once:
what the exporters publish and what is notified are asserted in the same test. Preemption, a
rank SIGKILLed, a node lost, a clean finish and an elastic job: test_slurm_pages.py."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from helpers.paths import REPO
from helpers.promstack import (
    Alertmanager,
    Prometheus,
    Webhook,
    needs_stack,
)
from helpers.slurm_job import Ranks, TrainingNodes
from helpers.two_nodes import alertmanager_config
from helpers.wait import wait_for

pytestmark = pytest.mark.slow


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
        lambda: nodes.stepping(run, 0),
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
        lambda: nodes.stepping(run, 1),
        180,
        0.5,
        lambda: f"both ranks of attempt 1 stepping\n{nodes.output(job)}",
    )
    # the same job id, attempt 1, on the nodes of the new allocation (rank order: node order)
    assert sorted(new) == [(node, str(rank)) for rank, node in enumerate(moved)], new
    assert {row["job_id"] for row in new.values()} == {job}
    return job, old, new


def assert_attempt_0_left_behind(nodes: TrainingNodes, job: str, old: Ranks, new: Ranks) -> None:
    """Every heartbeat attempt 0 left where attempt 1 did not write over it says attempt 0,
    dead, stopped by the requeue's SIGTERM."""
    ((gone, _),) = [key for key in old if key[1] == "0"]
    view = nodes.ranks("requeued")
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


@needs_stack
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
        job, old, new = requeue(nodes, "requeued")
        assert_attempt_0_left_behind(nodes, job, old, new)
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
