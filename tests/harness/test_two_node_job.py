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
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

import trainguard.exporter.collectors.runs as runs_collector
from helpers.exporter_proc import REPO, Exporter, child_env, free_port
from helpers.promstack import ALERTMANAGER, PROMETHEUS, Alertmanager, Prometheus, Webhook
from helpers.wait import wait_for
from trainguard.shared.heartbeat import HeartbeatError
from trainguard.shared.heartbeat_read import read_heartbeat

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (PROMETHEUS and ALERTMANAGER),
        reason="needs the Debian packages prometheus and prometheus-alertmanager",
    ),
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


def _alertmanager_config(url: str) -> dict[str, Any]:
    """deploy/alertmanager.yml as shipped, every receiver posting to ``url``, its waits 1s."""
    config = yaml.safe_load((REPO / "deploy" / "alertmanager.yml").read_text(encoding="utf-8"))
    config.pop("templates", None)
    for receiver in config["receivers"]:
        receiver.pop("slack_configs", None)
        for webhook in receiver.get("webhook_configs", []):
            webhook["url"] = url
    for route in [config["route"], *config["route"]["routes"]]:
        route["group_wait"] = route["group_interval"] = "1s"
    return config


class TwoNodes:
    """Two state directories and exporters ("nodes"), Prometheus and Alertmanager."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        rules = workdir / "trainguard.rules.yml"
        build = [sys.executable, str(REPO / "alerts" / "build.py"), "-o", str(rules)]
        # time runs fast: 1 s scrapes, so the job waits 3 s (not 30 s) for every node
        build += ["--set", "slow_rules_interval=1s", "--set", "job_death_for=3s"]
        subprocess.run(build, check=True, capture_output=True)
        self.state = [workdir / "node1", workdir / "node2"]
        self.exporters: list[Exporter] = []
        self.agents: list[subprocess.Popen[bytes]] = []
        self.webhook = Webhook()
        try:
            for state in self.state:
                state.mkdir()
                self.exporters.append(Exporter(state_dir=state))
            self.alertmanager = Alertmanager(
                workdir / "am", self.webhook.url, config=_alertmanager_config(self.webhook.url)
            )
            self.prometheus = Prometheus(
                workdir / "prom",
                [f"127.0.0.1:{e.port}" for e in self.exporters],
                rule_files=[rules],
                alertmanager=self.alertmanager.url,
            )
        except BaseException:
            self.close()
            raise
        self.script = workdir / "train.py"
        self.script.write_text(TRAIN)

    def instance(self, node: int) -> str:
        return f"127.0.0.1:{self.exporters[node].port}"

    def launch(self, run: str, steps: int) -> list[subprocess.Popen[bytes]]:
        """One torchrun agent per node (``steps=0``: train until killed)."""
        port = free_port()
        agents = []
        for node, state in enumerate(self.state):
            env = child_env(
                {
                    "TRAINGUARD_STATE_DIR": str(state),
                    "GLOO_SOCKET_IFNAME": "lo",
                    "OMP_NUM_THREADS": "1",
                }
            )
            for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TRAINGUARD_JOB", "SLURM_JOB_ID"):
                env.pop(name, None)
            log = (self.workdir / f"{run}-agent{node}.log").open("wb")
            agents.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "torch.distributed.run",
                        "--nnodes=2",
                        "--nproc-per-node=2",
                        "--max-restarts=0",
                        "--rdzv-backend=c10d",
                        f"--rdzv-endpoint=127.0.0.1:{port}",
                        str(self.script),
                        run,
                        str(steps),
                    ],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
            log.close()
        self.agents += agents
        return agents

    def ranks(self, run: str) -> dict[int, tuple[int, int]]:
        """{global rank: (node, pid)} as the heartbeats say (running ones)."""
        out = {}
        for node, state in enumerate(self.state):
            for path in state.glob("*.heartbeat.json"):
                try:
                    hb = read_heartbeat(path)
                except HeartbeatError:
                    continue
                if hb.run == run and hb.state == "running" and hb.step:
                    out[hb.rank] = (node, hb.pid)
        return out

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted(self.workdir.glob("*-agent*.log"))
        )

    def close(self) -> None:
        for agent in self.agents:
            if agent.poll() is None:
                agent.kill()
            agent.wait()
        for part in (getattr(self, "prometheus", None), getattr(self, "alertmanager", None)):
            if part is not None:
                part.stop()
        for exporter in self.exporters:
            exporter.stop()
        self.webhook.close()


def _job_messages(hook: Webhook, run: str) -> list[dict[str, Any]]:
    return [msg for _, msg in hook.received if msg.get("commonLabels", {}).get("run") == run]


def test_one_incident_per_job_naming_the_first_death_and_none_for_a_clean_finish(
    tmp_path: Path,
) -> None:
    nodes = TwoNodes(tmp_path)
    prom, hook = nodes.prometheus, nodes.webhook
    try:
        # 1. a clean finish of all four ranks: nothing
        clean = nodes.launch("job-clean", steps=40)
        for agent in clean:
            assert agent.wait(300) == 0, nodes.logs()
        prom.wait_until('count(trainguard_run_finished{run="job-clean"} == 1) == 4', 60)
        prom.wait_until('count(trainguard_run_job_info{run="job-clean"}) == 4', 60)
        prom.wait_evaluations(5)  # past job_death_for: the rules have judged the end
        assert prom.query('ALERTS{run="job-clean"}')["data"]["result"] == []
        assert _job_messages(hook, "job-clean") == []

        # 2. SIGKILL of one rank on the second node: torchrun stops the other three
        agents = nodes.launch("job-kill", steps=0)

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
