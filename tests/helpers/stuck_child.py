"""A training loop whose data function blocks while a flag file exists (test_stuck.py).

The test copies it to ``train.py`` (the name a user's script would have) and runs it::

    python train.py STATE BLOCK STOP                    # one process, no torch
    python train.py STATE BLOCK STOP RANK WORLD PORT    # a rank of a gloo job on 127.0.0.1

Rank ``WORLD - 1`` (the only rank alone) blocks in ``load_batch`` while ``BLOCK`` exists (or,
while ``BLOCK.save`` exists too, in a checkpoint save whose writing lasts as long); in a job the
other ranks then wait for it in ``dist.all_reduce``. The loop ends when ``STOP`` exists.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import trainguard
from trainguard import checkpoint


def load_batch(block: Path, step: int) -> int:
    """The user's data function: stuck here while the flag file exists."""
    while block.exists():
        time.sleep(0.05)  # BLOCKED
    return step


def save_checkpoint(block: Path, directory: Path, step: int) -> None:
    """The user's routine save: writing the checkpoint lasts while the flag file exists."""

    def write(f: object) -> None:
        while block.exists():
            time.sleep(0.05)  # SAVING
        f.write(b"weights")  # type: ignore[attr-defined]

    checkpoint.save(write, directory / f"step_{step}.pt")


def main() -> None:
    state, block, stop = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    rank, world = 0, 1
    job = len(sys.argv) > 4
    if job:
        import torch
        import torch.distributed as dist

        rank, world, port = int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
        )
    with trainguard.Run("stuck", state_dir=state, interval=0.2, rank=rank) as run:
        step = 0
        while not stop.exists():
            step += 1
            if rank == world - 1:
                if block.with_suffix(".save").exists():
                    save_checkpoint(block, Path(state) / "ckpt", step)
                else:
                    load_batch(block, step)
            if job:
                dist.all_reduce(torch.ones(1))  # ALL_REDUCE
            run.step(step)
            time.sleep(0.02)
    if job:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
