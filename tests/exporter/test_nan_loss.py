"""A real training process whose loss goes NaN, through the real exporter: the non-finite count
and the loss's streak on /metrics (what TrainingLossNonFinite pages on), and back to a streak of
0 when the loss is finite again, the count kept."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from helpers.exporter_proc import Exporter, child_env, poll, value
from helpers.run_child import sigkill

# Finite until the file "nan" exists, then a NaN loss and an infinite grad norm until "finite"
# exists, then finite again; steps every 10 ms, the reporter waking every 20 ms.
CHILD = r"""
import math, os, sys, time
import trainguard

name, state_dir, flags = sys.argv[1], sys.argv[2], sys.argv[3]
run = trainguard.Run(name, state_dir=state_dir, interval=0.02)
step = 0
while True:
    bad = os.path.exists(os.path.join(flags, "nan")) and not os.path.exists(
        os.path.join(flags, "finite")
    )
    loss = math.nan if bad else 1.0 / (step + 1)
    run.step(step, loss=loss, grad_norm=math.inf if bad else 0.5, lr=1e-4)
    step += 1
    time.sleep(0.01)
"""

NONFINITE = "trainguard_run_scalar_nonfinite_total"
STREAK = "trainguard_run_loss_nonfinite_streak"


def test_nan_loss_is_counted_and_its_streak_published(tmp_path: Path) -> None:
    state, flags = tmp_path / "state", tmp_path / "flags"
    flags.mkdir()
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, "diverging", str(state), str(flags)],
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    rr = {"run": "diverging", "rank": "0"}
    try:
        with Exporter(state_dir=state) as exp:
            # finite: every scalar counted at 0, the streak 0
            s = poll(exp, lambda s: (value(s, "trainguard_run_step", **rr) or 0) >= 5)
            assert value(s, "trainguard_run_step", **rr) is not None, s
            for name in ("loss", "grad_norm", "lr"):
                assert value(s, NONFINITE, **rr, name=name) == 0, name
            assert value(s, STREAK, **rr) == 0

            (flags / "nan").touch()
            s = poll(exp, lambda s: (value(s, STREAK, **rr) or 0) >= 3)
            streak = value(s, STREAK, **rr)
            assert streak is not None and streak >= 3, s
            nan_loss = value(s, NONFINITE, **rr, name="loss")
            assert nan_loss is not None and nan_loss >= streak
            assert (value(s, NONFINITE, **rr, name="grad_norm") or 0) >= streak
            assert value(s, NONFINITE, **rr, name="lr") == 0
            loss = value(s, "trainguard_run_scalar", **rr, name="loss")
            assert loss is not None and loss != loss  # NaN published as NaN

            (flags / "finite").touch()
            s = poll(exp, lambda s: value(s, STREAK, **rr) == 0)
            assert value(s, STREAK, **rr) == 0, s
            # a counter: the NaN steps stay counted after the loss recovered
            assert (value(s, NONFINITE, **rr, name="loss") or 0) >= nan_loss
            loss = value(s, "trainguard_run_scalar", **rr, name="loss")
            assert loss is not None and loss == loss
    finally:
        sigkill(child.pid)
        child.wait(60)
