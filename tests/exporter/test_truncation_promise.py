"""The truncation promise with a real file and a real exporter (issue 43, item 4).

A checkpoint cut short after its writer committed its record (``truncate -s -100``) is
truncated at the first scrape, with the default 5-minute grace period, and ``trainguard verify``
says so at once: the grace period is for files that a writer may still be filling, and a file
with a committed record has none. A copy with no record of its own still gets the grace.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from helpers.exporter_proc import Exporter, value
from test_terminal import tg
from trainguard import checkpoint


def test_a_recorded_checkpoint_cut_short_is_truncated_at_the_first_scrape(tmp_path: Path) -> None:
    ckpt, mirror = tmp_path / "ckpt", tmp_path / "mirror"
    ckpt.mkdir()
    mirror.mkdir()
    for step in (100, 200):
        checkpoint.save(os.urandom(50_000), ckpt / f"step_{step}.pt")
    # a copy of step 200 by another tool, in flight (20 kB so far): no record of its own
    (mirror / "step_200.pt").write_bytes((ckpt / "step_200.pt").read_bytes()[:20_000])
    subprocess.run(["truncate", "-s", "-100", str(ckpt / "step_200.pt")], check=True)
    cfg = tmp_path / "tg.yml"
    cfg.write_text(  # the default grace period (5m), said out loud
        f"runs:\n  - name: r\n    checkpoints:\n      primary: {ckpt}\n"
        f"      mirrors: {{backup: {mirror}}}\n"
        "checkpoints: {grace_period: 5m}\n"
    )
    with Exporter(args=[f"--config.file={cfg}"], state_dir=tmp_path / "state") as exp:
        s = exp.scrape()  # the first one, seconds after the cut: well inside 5 minutes
    primary = {"run": "r", "location": "primary"}
    assert value(s, "trainguard_checkpoint_truncated_files", **primary) == 1
    assert (
        value(s, "trainguard_checkpoint_newest_damaged_step", **primary, damage="truncated") == 200
    )
    assert value(s, "trainguard_checkpoint_last_step", **primary) == 100
    # the copy without a record may still be being written: not truncated within the grace
    backup = {"run": "r", "location": "backup"}
    assert value(s, "trainguard_checkpoint_truncated_files", **backup) == 0

    text = tg("verify", str(ckpt)).stdout
    assert "step_200.pt  truncated  49900/50000 bytes" in text, text
    assert "resume from: step_100.pt (step 100)" in text
    text = tg("verify", str(mirror), f"--primary={ckpt}").stdout
    assert "step_200.pt  in flight  20000/50000 bytes, touched within the grace period" in text
