"""A training loop that saves with a real Orbax CheckpointManager, to be SIGKILLed mid-save.

    python orbax_child.py DIR sync|async
    python orbax_child.py check DIR:STEP,STEP... [DIR:STEP,...]

Resumes after the newest step Orbax itself lists in DIR (as a restarted job does), then saves a
small pytree at every step, keeping the 3 newest (Orbax deletes older ones). Each leaf holds the
step, so a restore says which step it came from. Prints ``saving N`` before each save and
``saved N`` once ``save`` returned (async: once the save is under way), for the test to time its
kill. ``check`` restores the given steps of each directory with ``CheckpointManager.restore``
and exits non-zero unless each holds its step's values (tests/training/test_orbax_real.py).
"""

from __future__ import annotations

import sys

import numpy as np
import orbax.checkpoint as ocp

SHAPE = (256, 256)  # 256 KiB of float32 a leaf: a save takes a few tens of milliseconds


def state(step: int) -> dict[str, object]:
    return {
        "params": {"w": np.full(SHAPE, step, np.float32), "b": np.full((64,), step, np.float32)},
        "opt": {"mu": np.full(SHAPE, -step, np.float32)},
        "step": np.asarray(step, np.int64),
    }


def manager(directory: str, mode: str, read_only: bool = False) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(
        max_to_keep=3,
        enable_async_checkpointing=mode == "async",
        read_only=read_only,
    )
    return ocp.CheckpointManager(directory, options=options)


def train(directory: str, mode: str) -> None:
    mgr = manager(directory, mode)
    start = (mgr.latest_step() or 0) + 1
    for step in range(start, start + 10_000):
        print(f"saving {step}", flush=True)
        mgr.save(step, args=ocp.args.StandardSave(state(step)))
        print(f"saved {step}", flush=True)
    mgr.wait_until_finished()


def check(directory: str, steps: list[int]) -> None:
    """Restore each step with CheckpointManager.restore and check it holds that step's values."""
    mgr = manager(directory, "sync", read_only=True)
    for step in steps:
        got = mgr.restore(step, args=ocp.args.StandardRestore(state(0)))
        want = state(step)
        ok = (
            np.array_equal(got["params"]["w"], want["params"]["w"])
            and np.array_equal(got["params"]["b"], want["params"]["b"])
            and np.array_equal(got["opt"]["mu"], want["opt"]["mu"])
            and int(got["step"]) == step
        )
        if not ok:
            raise SystemExit(f"step {step}: restored values are not that step's")
        print(f"restored {directory} {step}", flush=True)
    mgr.close()


if __name__ == "__main__":
    if sys.argv[1] == "check":
        for arg in sys.argv[2:]:
            where, _, steps = arg.rpartition(":")
            check(where, [int(s) for s in steps.split(",") if s])
    else:
        train(sys.argv[1], sys.argv[2])
