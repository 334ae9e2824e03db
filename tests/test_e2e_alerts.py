"""kill -9 to Alertmanager webhook: the shipped rules page for a silent death, stay quiet for a
clean exit, and page for a truncated mirror. (How fast the page comes, within one scrape and
one evaluation, is measured by bench/bench_detection.py: a pass/fail test on a shared machine
asserts what happens, not how long it takes.)"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from helpers.e2e_stack import Stack
from helpers.promstack import ALERTMANAGER, PROMETHEUS

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (PROMETHEUS and ALERTMANAGER),
        reason="needs the Debian packages prometheus and prometheus-alertmanager (./run-tests "
        "installs them)",
    ),
]


def test_kill_clean_exit_and_truncated_mirror(tmp_path: Path) -> None:
    from trainguard import checkpoint

    primary, mirror_dir = tmp_path / "ckpt", tmp_path / "mirror"
    primary.mkdir()
    mirror_dir.mkdir()
    stack = Stack(
        tmp_path,
        config_yaml=(
            "runs:\n"
            "  - name: e2e-ckpt\n"
            f"    checkpoints: {{primary: {primary}, mirrors: {{backup: {mirror_dir}}}}}\n"
            "checkpoints: {grace_period: 1s}\n"
        ),
        rule_overrides=("checkpoint_damage_for=1s",),
    )
    prom, hook = stack.prometheus, stack.webhook
    try:
        # 1. a silent death pages
        victim = stack.start_training("e2e-died")
        prom.wait_until('trainguard_run_process_up{run="e2e-died"} == 1')
        prom.wait_until('trainguard_run_gpu_memory_used_bytes{run="e2e-died"} > 0')
        stack.kill(victim)
        _, alert = hook.wait_for("TrainingProcessDied", timeout=60, run="e2e-died")
        assert alert["labels"]["severity"] == "critical"
        assert "e2e-died" in alert["annotations"]["description"]

        # 2. a clean exit delivers nothing
        clean = stack.start_training("e2e-clean", steps=20)
        assert clean.wait(60) == 0
        stack.driver_frees(clean.pid)
        prom.wait_until('trainguard_run_finished{run="e2e-clean"} == 1')
        prom.wait_until('trainguard_run_process_up{run="e2e-clean"} == 0')
        prom.wait_evaluations(3)  # the rules have judged the exit several times since
        assert prom.query('ALERTS{run="e2e-clean"}')["data"]["result"] == []
        delivered = [a["labels"] for _, a in hook.alerts() if a["labels"].get("run") == "e2e-clean"]
        assert delivered == []

        # 3. a mirror truncated at 73% after it was written pages
        checkpoint.save(os.urandom(1 << 20), primary / "step_100.pt")
        checkpoint.mirror(primary / "step_100.pt", mirror_dir)
        copy = mirror_dir / "step_100.pt"
        prom.wait_until('trainguard_checkpoint_last_step{run="e2e-ckpt",location="backup"} == 100')
        with open(copy, "r+b") as fh:
            fh.truncate(int((1 << 20) * 0.73))
        old = time.time() - 600
        os.utime(copy, (old, old))
        _, alert = hook.wait_for("CheckpointTruncated", timeout=60, run="e2e-ckpt")
        assert alert["labels"]["location"] == "backup"
        assert alert["labels"]["severity"] == "critical"
        # the primary copy is intact: nothing fires for it
        assert (
            prom.query('ALERTS{alertname="CheckpointTruncated",location="primary"}')["data"][
                "result"
            ]
            == []
        )
    finally:
        stack.close()
