"""``trainguard status``'s checkpoint column, as a user runs it: judged once while the rate's
sample is waited for (an alive run), and a location that keeps it waiting (a real FUSE mount
that stops answering, helpers/hangfs.py) said on the terminal while it waits, then the table."""

from __future__ import annotations

import json
from pathlib import Path

import pexpect
import torch
from safetensors.torch import save_file

from helpers.hf_holder import hold
from test_hung_mounts import HangFS
from test_terminal import on_terminal, tg

DEADLINE = 60.0


def hf_dirs(out: Path, steps: list[int]) -> None:
    """``checkpoint-N`` directories as the Trainer leaves them, nobody's record in them."""
    out.mkdir(parents=True, exist_ok=True)
    for step in steps:
        d = out / f"checkpoint-{step}"
        d.mkdir()
        save_file({"w": torch.zeros(64)}, str(d / "model.safetensors"))
        torch.save({"a": torch.zeros(8)}, d / "optimizer.pt")
        (d / "config.json").write_text('{"model_type": "gpt2"}\n')
        (d / "trainer_state.json").write_text(json.dumps({"global_step": step}) + "\n")


def test_an_alive_runs_checkpoints_come_with_the_sampled_rate(tmp_path: Path) -> None:
    """``--sample``: the checkpoints judged during the sample are the ones shown, newest
    complete first; a truncated newest model file sends it back to the one before."""
    out, state = tmp_path / "out", tmp_path / "state"
    hf_dirs(out, [10, 20, 30])
    model = out / "checkpoint-30" / "model.safetensors"
    with open(model, "r+b") as fh:
        fh.truncate(model.stat().st_size - 8)
    proc = hold(out, state, 35, "alive", "hf")
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        r = tg("status", f"--state.dir={state}", "--json", "--sample=1s")
        assert r.returncode == 0, r.stderr
        (run,) = json.loads(r.stdout)["runs"]
        assert run["state"] == "alive"
        (loc,) = run["checkpoints"]
        assert (loc["location"], loc["step"], loc["at_risk"], loc["error"]) == (
            "primary",
            20,
            15,
            None,
        )
    finally:
        proc.kill()
        proc.wait()


def test_status_says_which_location_it_waits_for(tmp_path: Path) -> None:
    """On a terminal, a judgement that takes long names its location on stderr while it waits
    (a hung mount), and the table comes once the mount answers."""
    backing, mnt, state = tmp_path / "backing", tmp_path / "mnt", tmp_path / "state"
    hf_dirs(backing, [10, 20])
    mnt.mkdir()
    with HangFS(backing, mnt, tmp_path / "hangfs.log") as fs:
        done = hold(mnt, state, 20, "finished", "hf")
        assert done.wait(DEADLINE) == 0
        fs.hang()
        child = on_terminal("status", f"--state.dir={state}")
        try:
            child.expect_exact(f"judging checkpoints: {mnt} (1/1)", timeout=DEADLINE)
            fs.answer()
            child.expect_exact("primary: 20 (0)", timeout=DEADLINE)
            child.expect(pexpect.EOF, timeout=DEADLINE)
        finally:
            fs.answer()
            child.close(force=True)
        assert child.exitstatus == 0, child.before
