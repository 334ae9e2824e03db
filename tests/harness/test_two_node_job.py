"""A job over two "nodes", for real: two torchrun agents (``--nnodes=2 --nproc-per-node=2``, c10d
rendezvous on 127.0.0.1, gloo on CPU), each with its own state directory and its own exporter,
scraped by a real Prometheus loading the shipped rules, notifying a real Alertmanager running
deploy/alertmanager.yml (only its receivers and waits changed). SIGKILL of one rank on the second
node gives exactly one incident at the webhook, naming that rank and that node's exporter; a clean
finish gives none."""

from __future__ import annotations

import json
import os
import signal
import textwrap
from pathlib import Path
from typing import Any

import pytest

import trainguard.exporter.collectors.runs.collector as runs_collector
from helpers.promstack import Webhook, needs_stack
from helpers.two_nodes import TwoNodes
from helpers.wait import wait_for

pytestmark = [
    pytest.mark.slow,
    needs_stack,
]

TRAIN = textwrap.dedent(
    """
    import sys, time
    import torch
    import torch.distributed as dist
    import trainguard
    name, steps = sys.argv[1], int(sys.argv[2])
    dist.init_process_group("gloo")
    t = torch.ones(4)
    with trainguard.Run(name, interval=0.2) as run:  # job, rank, state dir: from the env
        step = 0
        while steps == 0 or step < steps:
            step += 1
            dist.all_reduce(t)
            t.fill_(1.0)
            run.step(step, loss=1.0 / step)
            time.sleep(0.05)
    dist.destroy_process_group()
    """
)

#: the exporters publish the causes of exits once the SIGTERM handler (helper "signals") is in
SIGNALS_MERGED = any(
    getattr(spec, "name", "") == "trainguard_run_exit_info"
    for spec in getattr(runs_collector.RunsCollector, "metrics", ())
)


def _job_messages(hook: Webhook, run: str) -> list[dict[str, Any]]:
    return [msg for _, msg in hook.received if msg.get("commonLabels", {}).get("run") == run]


def test_one_incident_per_job_naming_the_first_death_and_none_for_a_clean_finish(
    tmp_path: Path,
) -> None:
    nodes = TwoNodes(tmp_path, TRAIN)
    prom, hook = nodes.prometheus, nodes.webhook
    try:
        # 1. a clean finish of all four ranks: nothing
        clean = nodes.launch("job-clean", 40)
        for agent in clean:
            assert agent.wait(300) == 0, nodes.logs()
        prom.wait_until('count(trainguard_run_finished{run="job-clean"} == 1) == 4', 60)
        prom.wait_until('count(trainguard_run_job_info{run="job-clean"}) == 4', 60)
        prom.wait_evaluations(5)  # past job_death_for: the rules have judged the end
        assert prom.query('ALERTS{run="job-clean"}')["data"]["result"] == []
        assert _job_messages(hook, "job-clean") == []

        # 2. SIGKILL of one rank on the second node: torchrun stops the other three
        agents = nodes.launch("job-kill", 0)

        def stepping() -> dict[int, tuple[int, int]] | None:
            found = nodes.ranks("job-kill")
            return found if len(found) == 4 else None

        ranks = wait_for(
            stepping,
            300,
            0.5,
            lambda: f"four ranks stepping\n{nodes.logs()}",
        )
        prom.wait_until('count(trainguard_run_process_up{run="job-kill"} == 1) == 4', 60)
        job = prom.query('trainguard_run_job_info{run="job-kill"}')["data"]["result"]
        job_ids = {s["metric"]["job_id"] for s in job}
        assert len(job_ids) == 1 and {s["metric"]["launcher"] for s in job} == {"torchrun"}
        # the rendezvous numbers the nodes: the second node is the one holding rank 3
        node, pid = ranks[3]
        assert {n for n, _ in ranks.values()} == {0, 1}
        assert ranks[2][0] == node and ranks[0][0] == ranks[1][0] != node
        os.kill(pid, signal.SIGKILL)
        for agent in agents:
            agent.wait(120)  # the launcher gave up (--max-restarts=0) and stopped the rest

        message = hook.wait_message(
            lambda m: (
                m.get("commonLabels", {}).get("run") == "job-kill" and m["status"] == "firing"
            ),
            120,
            "the job's page",
        )
        (alert,) = message["alerts"]
        labels, annotations = alert["labels"], alert["annotations"]
        assert labels["alertname"] == "TrainingJobRankDied"
        assert labels["severity"] == "critical"
        assert labels["job_id"] in job_ids and "instance" not in labels
        # no instance label, yet the runbook link opens a real exporter of the job: rank 0's
        runbook = f"http://{nodes.instance(ranks[0][0])}/runbook#trainingjobrankdied"
        assert annotations["runbook_url"] == runbook, annotations
        # every rank has been judged dead since, and still one incident, one alert
        prom.wait_until('count(job_rank:trainguard_run_dead:job_info{run="job-kill"}) == 4', 60)
        prom.wait_evaluations(5)
        firing = [
            msg
            for msg in _job_messages(hook, "job-kill")
            if msg["status"] == "firing" or any(a["status"] == "firing" for a in msg["alerts"])
        ]
        assert {msg["groupKey"] for msg in firing} == {message["groupKey"]}, firing
        assert all(len(msg["alerts"]) == 1 for msg in firing), firing
        assert (
            prom.query('ALERTS{alertname="TrainingProcessDied",run="job-kill"}')["data"]["result"]
            == []
        )
        # it names the rank that died first and its node
        named = (annotations["first_rank"], annotations["first_instance"])
        if named != ("3", nodes.instance(node)) and not SIGNALS_MERGED:
            # Until the SIGTERM handler is merged (helper "signals", trainguard_run_exit_info),
            # the launcher's SIGTERM leaves rank 2 a death of cause "unknown" like rank 3's, and
            # the oldest last heartbeat decides between the two to within interval (0.2 s).
            pytest.xfail(f"needs the signal handler to tell the teardown apart; named {named}")
        assert named == ("3", nodes.instance(node)), (annotations, nodes.logs())
        assert annotations["first_host"] == os.uname().nodename
        assert "rank 3" in annotations["summary"]
        if SIGNALS_MERGED:
            assert annotations["first_cause"] == "unknown"  # SIGKILL leaves no trace
    finally:
        nodes.close()
        print(json.dumps([m for _, m in hook.received], indent=1)[-4000:])
