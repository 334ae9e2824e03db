"""A training process whose checkpoint saves fail, for tests/training/test_save_failures.py.

``full CKPT GATE``: a ``trainguard.Run`` announcing CKPT (a 2 MiB tmpfs) saves one small
checkpoint, then tries three of 3 MiB with ``checkpoint.save`` (bytes: an OSError) and one
``torch.save`` of 4 MiB (a RuntimeError around the OSError), catching each and stepping on, as
scripts do; it writes ``GATE/saved`` and steps until ``GATE/release`` appears.
``dcp CKPT PORT``: one gloo process whose ``dcp.async_save`` of 4 MiB into CKPT fails in DCP's
writer thread, watched by ``checkpoint.watch_save``; prints ``failed <type>``.
The state directory is ``$TRAINGUARD_STATE_DIR`` for both the run and the checkpoint library.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def full(ckpt: Path, gate: Path) -> None:
    import torch

    import trainguard
    from trainguard import checkpoint

    with trainguard.Run("saves-full", checkpoint_dir=ckpt, interval=0.05) as run:
        run.step(1, loss=1.0)
        checkpoint.save(b"x" * 1000, ckpt / "step_1.pt")
        for step in (2, 3, 4):
            run.step(step, loss=1.0)
            try:
                checkpoint.save(b"x" * (3 << 20), ckpt / f"step_{step}.pt")
            except OSError as exc:
                print("caught", exc.errno, flush=True)
        try:
            checkpoint.save({"w": torch.zeros(1 << 20)}, ckpt / "step_5.pt")
        except RuntimeError:
            print("caught torch", flush=True)
        (gate / "saved").write_text("")
        step = 5
        while not (gate / "release").exists():
            step += 1
            run.step(step, loss=1.0)
            time.sleep(0.05)


def dcp(ckpt: Path, port: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dist_cp

    from trainguard import checkpoint

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, GLOO_SOCKET_IFNAME="lo")
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        path = ckpt / "step-1"
        future = dist_cp.async_save({"w": torch.zeros(1 << 20)}, checkpoint_id=path)
        checkpoint.watch_save(future, path)
        try:
            future.result()  # type: ignore[union-attr]  # a Future without a stager
            print("saved", flush=True)
        except BaseException as exc:  # DCP's CheckpointException is a BaseException
            print("failed", type(exc).__name__, flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    mode, where, extra = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    if mode == "full":
        full(where, Path(extra))
    else:
        dcp(where, extra)
