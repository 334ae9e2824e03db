"""A real run whose loss turns NaN at step 100 and keeps stepping and checkpointing every 50
steps (what issue 43 met): each checkpoint's record says whether the loss was finite when it was
saved, ``latest()`` skips the NaN ones unless asked, ``prune(keep=3)`` keeps the last finite
one, a mirror carries the word over, and the exporter, ``trainguard status`` and ``verify`` say
where the streak began and which checkpoint to resume from."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from helpers.exporter_proc import Exporter, child_env, poll, value
from helpers.run_child import sigkill
from test_terminal import tg
from trainguard import checkpoint
from trainguard.shared.manifest import read_all_records

# Steps 1..400, the loss NaN from step 100 on, a checkpoint every 50 steps, each followed by
# prune(keep=3); then it prints "done" and keeps its run alive (still stepping at 400).
CHILD = r"""
import math, sys, time
import trainguard
from trainguard import checkpoint

name, state_dir, ckpt = sys.argv[1], sys.argv[2], sys.argv[3]
run = trainguard.Run(name, checkpoint_dir=ckpt, state_dir=state_dir, interval=0.02)
for step in range(1, 401):
    run.step(step, loss=math.nan if step >= 100 else 1.0 / step)
    if step % 50 == 0:
        checkpoint.save(b"weights at %d" % step, f"{ckpt}/step_{step}.pt")
        checkpoint.prune(ckpt, keep=3, grace=0)
    time.sleep(0.01)
print("done", flush=True)
while True:
    time.sleep(1)
"""

RR = {"run": "diverging", "rank": "0"}


def test_a_nan_run_through_save_latest_prune_and_the_exporter(tmp_path: Path) -> None:
    state, ckpt = tmp_path / "state", tmp_path / "ckpt"
    ckpt.mkdir()
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, "diverging", str(state), str(ckpt)],
        env=child_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "done"

        records = read_all_records(ckpt)
        finite = {r.step: r.loss_finite for r in records.values()}
        # the newest three and the last one saved with a finite loss: prune kept step 50
        assert finite == {50: True, 300: False, 350: False, 400: False}
        assert sorted(p.name for p in ckpt.glob("step_*.pt")) == [
            "step_300.pt",
            "step_350.pt",
            "step_400.pt",
            "step_50.pt",
        ]
        doc = json.loads((ckpt / ".trainguard" / "step_400.pt.json").read_text())
        assert doc["loss_finite"] is False

        found = checkpoint.latest(ckpt)
        assert found is not None and found.step == 50 and found.loss_finite is True
        anyway = checkpoint.latest(ckpt, allow_nonfinite=True)
        assert anyway is not None and anyway.step == 400 and anyway.loss_finite is False

        mirror = tmp_path / "mirror"
        mirror.mkdir()
        checkpoint.mirror(ckpt / "step_400.pt", mirror)
        checkpoint.mirror(ckpt / "step_50.pt", mirror)
        assert {r.step: r.loss_finite for r in read_all_records(mirror).values()} == {
            50: True,
            400: False,
        }

        # pruning again, however often, never deletes the newest finite one
        checkpoint.prune(ckpt, keep=1, grace=0)
        assert sorted(p.name for p in ckpt.glob("step_*.pt")) == ["step_400.pt", "step_50.pt"]

        where = {"run": "diverging", "location": "primary"}
        with Exporter(state_dir=state) as exp:
            s = poll(
                exp,
                lambda s: (
                    value(s, "trainguard_checkpoint_last_step", **where) == 400
                    and value(s, "trainguard_run_step", **RR) == 400
                ),
            )
            assert value(s, "trainguard_checkpoint_last_step", **where) == 400
            assert value(s, "trainguard_checkpoint_last_finite_step", **where) == 50
            # where the NaN began: after the newest finite step observed, at or before the
            # first non-finite one observed (the reporter sees one step per wake-up)
            first = value(s, "trainguard_run_loss_nonfinite_first_step", **RR)
            last_finite = value(s, "trainguard_run_loss_last_finite_step", **RR)
            assert first is not None and last_finite is not None, s
            assert 1 <= last_finite <= 99 and 100 <= first <= 400
            assert (value(s, "trainguard_run_loss_nonfinite_streak", **RR) or 0) >= 1
            # where this process began (after a restart, TrainingProcessRestarted's steps lost)
            assert value(s, "trainguard_run_first_step", **RR) == 1

        # trainguard status: the run shown as stepping on a NaN loss, where the NaN began,
        # and the checkpoint to resume from
        r = tg("status", f"--state.dir={state}", "--json", "--sample=0")
        assert r.returncode == 1, r.stderr  # a run stepping on a NaN loss is not fine
        (row,) = json.loads(r.stdout)["runs"]
        assert row["state"] == "nan-loss", row
        assert row["loss"] is None and row["loss_nonfinite_streak"] >= 1
        assert row["loss_nonfinite_first_step"] == first
        assert row["loss_last_finite_step"] == last_finite
        assert [(c["location"], c["step"]) for c in row["checkpoints"]] == [("primary", 50)]
        text = tg("status", f"--state.dir={state}", "--sample=0").stdout
        assert "nan-loss" in text and f"not finite since step {int(first)}" in text, text

        # trainguard verify: the NaN checkpoints named as such, step 50 the one to resume from
        text = tg("verify", str(ckpt)).stdout
        assert "step_400.pt  complete  14 bytes, saved with a NaN or infinite loss" in text, text
        assert "resume from: step_50.pt (step 50, the newest saved with a finite loss)" in text
    finally:
        sigkill(child.pid)
        child.wait(60)
