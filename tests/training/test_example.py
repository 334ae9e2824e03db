"""examples/train_toy.py runs, reports through trainguard.Run and checkpoints atomically."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.exporter_proc import REPO, child_env
from helpers.zygote import Zygote
from trainguard import checkpoint
from trainguard.shared.heartbeat.read import read_heartbeat
from trainguard.shared.heartbeat.record import heartbeat_filename

pytestmark = pytest.mark.slow


def toy(
    zygote: Zygote, tmp_path: Path, steps: int, *extra: str, env: dict[str, str] | None = None
) -> str:
    """The example's output (stdout and stderr); run forked from the fork server."""
    ckpt, state, log = tmp_path / "ckpt", tmp_path / "state", tmp_path / "train.log"
    rc, output = zygote.run(
        [
            REPO / "examples" / "train_toy.py",
            f"--steps={steps}",
            "--checkpoint-every=10",
            "--keep=2",
            f"--checkpoint-dir={ckpt}",
            f"--mirror-dir={tmp_path / 'mirror'}",
            f"--state-dir={state}",
            f"--log-file={log}",
            *extra,
        ],
        child_env(env),
        600,
    )
    assert rc == 0, output
    return output


def test_toy_training_reports_and_checkpoints(tmp_path: Path, framework_zygote: Zygote) -> None:
    ckpt, state, log = tmp_path / "ckpt", tmp_path / "state", tmp_path / "train.log"
    toy(framework_zygote, tmp_path, 20)
    hb = read_heartbeat(state / heartbeat_filename("toy", 0))
    assert (hb.state, hb.step) == ("finished", 20)
    assert set(hb.scalars) == {"loss", "samples_per_s"}
    assert hb.checkpoint_dir == str(ckpt) and hb.log_file == str(log)
    assert hb.mirrors == {"backup": str(tmp_path / "mirror")}
    checkpoints = sorted(p.name for p in ckpt.iterdir() if not p.name.startswith("."))
    assert checkpoints == ["step_10.pt", "step_20.pt"]
    latest = checkpoint.latest(ckpt)
    assert latest is not None and latest.step == 20
    mirrored = checkpoint.latest(tmp_path / "mirror", verify_hash=True)
    assert mirrored is not None and mirrored.step == 20
    assert log.read_text().count("\n") == 20
    # a second start resumes from the newest complete checkpoint and prunes to --keep=2
    again = toy(framework_zygote, tmp_path, 40, "--prune-grace=0")
    assert f"resumed from {ckpt / 'step_20.pt'} at step 20" in again
    assert sorted(p.name for p in ckpt.iterdir() if not p.name.startswith(".")) == [
        "step_30.pt",
        "step_40.pt",
    ]
    assert sorted(p.name for p in (tmp_path / "mirror").iterdir() if p.suffix == ".pt") == [
        "step_30.pt",
        "step_40.pt",
    ]


def test_toy_takes_its_name_from_trainguard_launch(
    tmp_path: Path, framework_zygote: Zygote
) -> None:
    # `trainguard launch --name X -- python examples/train_toy.py` sets $TRAINGUARD_RUN
    toy(framework_zygote, tmp_path, 5, env={"TRAINGUARD_RUN": "launched-name"})
    hb = read_heartbeat(tmp_path / "state" / heartbeat_filename("launched-name", 0))
    assert (hb.run, hb.state) == ("launched-name", "finished")
    assert not (tmp_path / "state" / heartbeat_filename("toy", 0)).exists()
