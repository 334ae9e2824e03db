"""kill -9 to Alertmanager webhook: the shipped rules page for a silent death, warn once for a
death hidden by an immediate restart, stay quiet for a clean exit, warn for a truncated mirror
while the primary holds the step intact and page once no intact copy is left. (How fast the page
comes, within one scrape and one evaluation, is measured by bench/bench_detection.py: a pass/fail
test on a shared machine asserts what happens, not how long it takes.)"""

from __future__ import annotations

import os
import time
import urllib.request
from pathlib import Path

import pytest

from helpers.e2e_stack import Stack
from helpers.promstack import needs_stack

pytestmark = [
    pytest.mark.slow,
    needs_stack,
]


def test_kill_restart_clean_exit_and_truncated_mirror(tmp_path: Path) -> None:
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
    successor = None
    try:
        # 1. a silent death pages
        victim = stack.start_training("e2e-died")
        prom.wait_until('trainguard_run_process_up{run="e2e-died"} == 1')
        prom.wait_until('trainguard_run_gpu_memory_used_bytes{run="e2e-died"} > 0')
        stack.kill(victim)
        _, alert = hook.wait_for("TrainingProcessDied", timeout=60, run="e2e-died")
        assert alert["labels"]["severity"] == "critical"
        assert "e2e-died" in alert["annotations"]["description"]
        # its runbook link is the runbook served by the exporter that saw the death
        url = alert["annotations"]["runbook_url"]
        assert url.endswith("/runbook#trainingprocessdied"), url
        with urllib.request.urlopen(url, timeout=30) as response:
            assert response.status == 200
            assert '<h2 id="trainingprocessdied">' in response.read().decode()

        # 2. a death the supervisor hides by restarting the run at once (torchrun, systemd,
        # Kubernetes): the restarted process records it, and it warns, once
        victim = stack.start_training("e2e-restarted")
        prom.wait_until(
            f'trainguard_run_info{{run="e2e-restarted",pid="{victim.pid}"}}'
            " and on (instance, run, rank) trainguard_run_process_up == 1",
            timeout=60,
        )
        stack.kill(victim)
        successor = stack.start_training("e2e-restarted")
        _, alert = hook.wait_for("TrainingProcessRestarted", timeout=60, run="e2e-restarted")
        assert alert["labels"]["severity"] == "warning"
        assert "(cause: unknown)" in alert["annotations"]["description"]
        # several evaluations and Alertmanager flushes later, still one notification for it
        prom.wait_until(
            'count_over_time(ALERTS{alertname="TrainingProcessRestarted",run="e2e-restarted",'
            'alertstate="firing"}[1m]) >= 5',
            timeout=60,
        )
        notified = [
            msg
            for _, msg in hook.received
            if msg["groupLabels"].get("alertname") == "TrainingProcessRestarted"
        ]
        assert len(notified) == 1, notified

        # 3. a clean exit delivers nothing
        clean = stack.start_training("e2e-clean", steps=20)
        assert clean.wait(60) == 0
        stack.driver_frees(clean.pid)
        prom.wait_until('trainguard_run_finished{run="e2e-clean"} == 1')
        prom.wait_until('trainguard_run_process_up{run="e2e-clean"} == 0')
        prom.wait_evaluations(3)  # the rules have judged the exit several times since
        assert prom.query('ALERTS{run="e2e-clean"}')["data"]["result"] == []
        delivered = [a["labels"] for _, a in hook.alerts() if a["labels"].get("run") == "e2e-clean"]
        assert delivered == []

        # 4. a mirror truncated at 73% after it was written pages
        checkpoint.save(os.urandom(1 << 20), primary / "step_100.pt")
        checkpoint.mirror(primary / "step_100.pt", mirror_dir)
        copy = mirror_dir / "step_100.pt"
        prom.wait_until('trainguard_checkpoint_last_step{run="e2e-ckpt",location="backup"} == 100')
        with open(copy, "r+b") as fh:
            fh.truncate(int((1 << 20) * 0.73))
        old = time.time() - 600
        os.utime(copy, (old, old))
        # the primary still holds step 100 intact, so the run can resume: a warning to fix the
        # mirror, not a page (issue 14: severity follows the damage)
        _, alert = hook.wait_for("CheckpointTruncated", timeout=60, run="e2e-ckpt")
        assert alert["labels"]["location"] == "backup"
        assert alert["labels"]["severity"] == "warning"
        assert "newest intact: step 100" in alert["annotations"]["description"]
        # the primary copy is intact: nothing fires for it
        assert (
            prom.query('ALERTS{alertname="CheckpointTruncated",location="primary"}')["data"][
                "result"
            ]
            == []
        )

        # 5. the primary copy of step 100 truncated too: no intact copy is left, it pages
        with open(primary / "step_100.pt", "r+b") as fh:
            fh.truncate(1 << 19)
        os.utime(primary / "step_100.pt", (old, old))
        _, alert = hook.wait_for(
            "CheckpointTruncated", timeout=60, run="e2e-ckpt", severity="critical"
        )
        assert "newest intact: step none" in alert["annotations"]["description"]
    finally:
        if successor is not None:
            successor.kill()
            successor.wait()
        stack.close()
