"""A restart loop without progress, for real: a training process that is killed at the same
step again and again, relaunched each time under the same run name, never getting past its
newest checkpoint. A real exporter and a real Prometheus loading the shipped rules (only the
loop's window, WINDOW, and the slow group's interval shortened): TrainingRestartLoop fires
after the third death, and not after the second (issue 28)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers.exporter_proc import REPO, Exporter, child_env
from helpers.promstack import PROMETHEUS, Prometheus
from trainguard import checkpoint

pytestmark = [
    pytest.mark.slow(seconds=70),  # mostly waiting out the loop's window
    pytest.mark.skipif(not PROMETHEUS, reason="needs the Debian package prometheus"),
]

#: the loop's window (2h shipped): the test waits it out once, so that the checkpoint is old
#: news, then three deaths must come within it: each a new Python process that steps five
#: times and a scrape, a small part of the window even on a machine many times slower than a
#: quiet one.
WINDOW = "1m"

#: steps to 5 (past the checkpoint of step 2, never to a new one), then waits to be killed
TRAIN = textwrap.dedent(
    """
    import sys, time
    import trainguard
    run = trainguard.Run("loop", checkpoint_dir=sys.argv[1], interval=0.2)
    for step in range(1, 6):
        run.step(step, loss=1.0)
    time.sleep(3600)
    """
)


def test_a_run_killed_at_the_same_step_again_and_again_pages(tmp_path: Path) -> None:
    ckpt, state = tmp_path / "ckpt", tmp_path / "state"
    ckpt.mkdir()
    state.mkdir()
    checkpoint.save(os.urandom(4096), ckpt / "step_2.pt")  # the newest complete checkpoint
    rules = tmp_path / "trainguard.rules.yml"
    build = [sys.executable, str(REPO / "alerts" / "build.py"), "-o", str(rules)]
    build += ["--set", "slow_rules_interval=1s", "--set", f"restart_loop_window={WINDOW}"]
    subprocess.run(build, check=True, capture_output=True)
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    env = child_env({"TRAINGUARD_STATE_DIR": str(state)})
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"):
        env.pop(name, None)
    config = tmp_path / "trainguard.yml"
    config.write_text(f"runs:\n  - name: loop\n    checkpoints: {{primary: {ckpt}}}\n")
    with Exporter(args=[f"--config.file={config}"], state_dir=state) as exp:
        prom = Prometheus(tmp_path / "prom", [f"127.0.0.1:{exp.port}"], rule_files=[rules])
        try:
            # the checkpoint is old news for the loop's window (a first checkpoint within it
            # would be progress): Prometheus has known it for the whole window
            prom.wait_until(
                f'trainguard_checkpoint_last_step{{run="loop"}} offset {WINDOW}', timeout=300
            )
            for deaths in range(4):
                proc = subprocess.Popen([sys.executable, str(script), str(ckpt)], env=env)
                try:
                    # this process is up, stepped past the checkpoint, and recorded the
                    # deaths before it (Prometheus saw each count: the rule needs the rise)
                    prom.wait_until(
                        f'trainguard_run_deaths_total{{run="loop"}} == {deaths}'
                        ' and on (run) trainguard_run_step{run="loop"} == 5'
                        ' and on (run) trainguard_run_process_up{run="loop"} == 1',
                        timeout=120,
                    )
                    if deaths == 2:  # two restarts so far: not a loop yet
                        assert not prom.query('ALERTS{alertname="TrainingRestartLoop"}')["data"][
                            "result"
                        ]
                finally:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait()
            (alert,) = prom.wait_until(
                'ALERTS{alertname="TrainingRestartLoop",alertstate="firing",run="loop"}',
                timeout=120,
            )
            assert alert["metric"]["severity"] == "critical"
        finally:
            prom.stop()
