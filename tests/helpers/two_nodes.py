"""Two "nodes" of one job on this machine: two torchrun agents (``--nnodes=2
--nproc-per-node=2``, c10d rendezvous on 127.0.0.1, gloo on CPU), each with its own state
directory and its own exporter; optionally a real Prometheus loading the shipped rules and a real
Alertmanager running deploy/alertmanager.yml (only its receivers and waits changed)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from helpers.exporter_proc import REPO, Exporter, child_env, free_port
from helpers.promstack import Alertmanager, Prometheus, Webhook
from trainguard.shared.heartbeat.read import read_heartbeat
from trainguard.shared.heartbeat.record import HeartbeatError


def alertmanager_config(url: str) -> dict[str, Any]:
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
    """Two state directories and exporters ("nodes"), Prometheus and Alertmanager.

    ``script`` is the training script every rank runs (its arguments: the run's name, then
    :meth:`launch`'s); ``stack=False`` starts no Prometheus, Alertmanager or webhook (tests
    that scrape the exporters themselves).
    """

    def __init__(self, workdir: Path, script: str, *, stack: bool = True) -> None:
        self.workdir = workdir
        self.state = [workdir / "node1", workdir / "node2"]
        self.exporters: list[Exporter] = []
        self.agents: list[subprocess.Popen[bytes]] = []
        self.script = workdir / "train.py"
        self.script.write_text(script)
        if not stack:
            for state in self.state:
                state.mkdir()
                self.exporters.append(Exporter(state_dir=state))
            return
        rules = workdir / "trainguard.rules.yml"
        build = [sys.executable, str(REPO / "alerts" / "build.py"), "-o", str(rules)]
        # time runs fast: 1 s scrapes, so the job waits 3 s (not 30 s) for every node
        build += ["--set", "slow_rules_interval=1s", "--set", "job_death_for=3s"]
        subprocess.run(build, check=True, capture_output=True)
        self.webhook = Webhook()
        try:
            for state in self.state:
                state.mkdir()
                self.exporters.append(Exporter(state_dir=state))
            self.alertmanager = Alertmanager(
                workdir / "am", self.webhook.url, config=alertmanager_config(self.webhook.url)
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

    def instance(self, node: int) -> str:
        """The ``instance`` Prometheus gives node ``node``'s exporter."""
        return f"127.0.0.1:{self.exporters[node].port}"

    def launch(
        self, run: str, *args: object, env: Mapping[str, str] | None = None
    ) -> list[subprocess.Popen[bytes]]:
        """One torchrun agent per node, each rank running the script with ``run`` and ``args``."""
        port = free_port()
        agents = []
        for node, state in enumerate(self.state):
            child = child_env(
                {
                    "TRAINGUARD_STATE_DIR": str(state),
                    "GLOO_SOCKET_IFNAME": "lo",
                    "OMP_NUM_THREADS": "1",
                    **(env or {}),
                }
            )
            for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TRAINGUARD_JOB", "SLURM_JOB_ID"):
                child.pop(name, None)
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
                        *map(str, args),
                    ],
                    env=child,
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
        """The agents' logs (their tails), for assertion messages."""
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted(self.workdir.glob("*-agent*.log"))
        )

    def close(self) -> None:
        """Kill the agents left, stop Prometheus, Alertmanager and the exporters."""
        for agent in self.agents:
            if agent.poll() is None:
                agent.kill()
            agent.wait()
        for part in (getattr(self, "prometheus", None), getattr(self, "alertmanager", None)):
            if part is not None:
                part.stop()
        for exporter in self.exporters:
            exporter.stop()
        if hasattr(self, "webhook"):
            self.webhook.close()
