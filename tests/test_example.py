"""examples/train_toy.py runs, reports through trainguard.Run and checkpoints atomically."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from exporter_proc import REPO, child_env
from trainguard.heartbeat import heartbeat_filename, read_heartbeat


def test_toy_training_reports_and_checkpoints(tmp_path: Path) -> None:
    ckpt, state, log = tmp_path / "ckpt", tmp_path / "state", tmp_path / "train.log"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "examples" / "train_toy.py"),
            "--steps=20",
            "--checkpoint-every=10",
            f"--checkpoint-dir={ckpt}",
            f"--state-dir={state}",
            f"--log-file={log}",
        ],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    hb = read_heartbeat(state / heartbeat_filename("toy", 0))
    assert (hb.state, hb.step) == ("finished", 20)
    assert set(hb.scalars) == {"loss", "samples_per_s"}
    assert hb.checkpoint_dir == str(ckpt) and hb.log_file == str(log)
    assert sorted(p.name for p in ckpt.iterdir()) == ["step_10.pt", "step_20.pt"]
    assert log.read_text().count("\n") == 20
