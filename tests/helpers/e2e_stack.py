"""The whole chain, started for real: a training child using trainguard.Run, the exporter with
the test NVML library, Prometheus with the shipped rules, Alertmanager and a webhook receiver.
Shared by the end-to-end test and bench/bench_detection.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from helpers.exporter_proc import REPO, Exporter, child_env
from helpers.nvml_fake import FakeNvmlState
from helpers.promstack import Alertmanager, Prometheus, Webhook

GIB = 1 << 30

TRAIN = textwrap.dedent(
    """
    import sys, time
    import trainguard
    name, steps, state_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    with trainguard.Run(name, state_dir=state_dir, interval=0.1) as run:
        for step in range(1, steps + 1):
            run.step(step, loss=1.0 / step)
            time.sleep(0.02)
        if steps == 0:
            step = 0
            while True:
                step += 1
                run.step(step, loss=1.0 / step, data_seconds=0.005, compute_seconds=0.015)
                time.sleep(0.02)
    """
)


class Stack:
    """Exporter + Prometheus + Alertmanager + webhook on 127.0.0.1, 1 s scrape and evaluation."""

    def __init__(
        self,
        workdir: Path,
        config_yaml: str = "",
        rule_overrides: tuple[str, ...] = (),
        scrape_interval: str = "1s",
        evaluation_interval: str = "1s",
        group_wait: str = "1s",
    ) -> None:
        self.workdir = workdir
        self.state_dir = workdir / "state"
        self.state_dir.mkdir(parents=True)
        self.nvml = FakeNvmlState()
        self.nvml.add_gpu("GPU-e2e00000-0000-0000-0000-000000000000", used=1 * GIB)
        self.nvml_path = self.nvml.write(workdir / "nvml.state")
        rules = workdir / "trainguard.rules.yml"
        build = [sys.executable, str(REPO / "alerts" / "build.py"), "-o", str(rules)]
        # time runs fast here: the slow group (5m in production) keeps pace with the others, so
        # that waiting for every group to have judged the data takes seconds, not minutes
        build += ["--set", f"slow_rules_interval={evaluation_interval}"]
        for override in rule_overrides:
            build += ["--set", override]
        subprocess.run(build, check=True, capture_output=True)
        cfg = workdir / "trainguard.yml"
        cfg.write_text(config_yaml or "{}\n")
        self.webhook = Webhook()
        self.children: list[subprocess.Popen[bytes]] = []
        self.exporter = Exporter(
            args=[f"--config.file={cfg}"],
            env=self.nvml.env(self.nvml_path),
            state_dir=self.state_dir,
        )
        self.alertmanager = Alertmanager(workdir / "am", self.webhook.url, group_wait=group_wait)
        self.prometheus = Prometheus(
            workdir / "prom",
            [f"127.0.0.1:{self.exporter.port}"],
            rule_files=[rules],
            alertmanager=self.alertmanager.url,
            scrape_interval=scrape_interval,
            evaluation_interval=evaluation_interval,
        )

    def start_training(self, name: str, steps: int = 0) -> subprocess.Popen[bytes]:
        """A real training child; ``steps=0`` trains until killed. It holds 2 GiB on the GPU,
        as the driver reports it."""
        proc = subprocess.Popen(
            [sys.executable, "-c", TRAIN, name, str(steps), str(self.state_dir)],
            env=child_env(),
        )
        self.children.append(proc)
        self.nvml.add_process(0, proc.pid, 2 * GIB)
        self.nvml.gpus[0].used += 2 * GIB
        self.nvml.write(self.nvml_path)
        return proc

    def driver_frees(self, pid: int) -> None:
        """What the driver does once a process is gone: its memory is released."""
        self.nvml.processes = [p for p in self.nvml.processes if p.pid != pid]
        self.nvml.gpus[0].used -= 2 * GIB
        self.nvml.write(self.nvml_path)

    def kill(self, proc: subprocess.Popen[bytes]) -> float:
        """SIGKILL the child; returns the wall-clock time of the kill."""
        t = time.time()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        self.driver_frees(proc.pid)
        return t

    def close(self) -> None:
        for child in self.children:  # those a failed test left training: not for ever
            if child.poll() is None:
                child.kill()
            child.wait()
        for part in (self.prometheus, self.alertmanager):
            part.stop()
        self.exporter.stop()
        self.webhook.close()
