"""A run stopped with ``trainguard stop`` notifies nothing; one SIGTERMed with nothing said warns
and then pages (issue 43, item 2b), through the whole chain started for real: training children,
the exporter, Prometheus with the shipped rules (``terminated_restart_window`` 5s instead of 30m,
so that the page comes in seconds), Alertmanager and a webhook."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.e2e_stack import Stack
from helpers.exporter_proc import child_env
from helpers.promstack import needs_stack

pytestmark = [
    pytest.mark.slow,
    needs_stack,
]


def test_a_stop_on_purpose_notifies_nothing_and_a_bare_sigterm_warns_then_pages(
    tmp_path: Path,
) -> None:
    stack = Stack(tmp_path, rule_overrides=("terminated_restart_window=5s",))
    prom, hook = stack.prometheus, stack.webhook
    try:
        mine = stack.start_training("e2e-mine")
        other = stack.start_training("e2e-other")
        for run in ("e2e-mine", "e2e-other"):
            prom.wait_until(f'trainguard_run_process_up{{run="{run}"}} == 1', timeout=60)

        r = subprocess.run(
            [sys.executable, "-m", "trainguard.exporter.terminal", "stop", "e2e-mine"],
            env={**child_env(), "TRAINGUARD_STATE_DIR": str(stack.state_dir)},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert mine.wait(60) == -signal.SIGTERM
        stack.driver_frees(mine.pid)
        os.kill(other.pid, signal.SIGTERM)  # the same signal, with nothing said
        assert other.wait(60) == -signal.SIGTERM
        stack.driver_frees(other.pid)

        _, alert = hook.wait_for("TrainingProcessTerminated", timeout=60, run="e2e-other")
        assert alert["labels"]["severity"] == "warning"
        _, alert = hook.wait_for("TrainingProcessDied", timeout=60, run="e2e-other")
        assert alert["labels"]["severity"] == "critical"
        prom.wait_until('trainguard_run_exit_info{run="e2e-mine",cause="on_purpose"} == 1')
        prom.wait_evaluations(3)  # every group has judged the stop, well past its window
        assert prom.query('ALERTS{run="e2e-mine"}')["data"]["result"] == []
        delivered = [a["labels"] for _, a in hook.alerts() if a["labels"].get("run") == "e2e-mine"]
        assert delivered == []
    finally:
        stack.close()
