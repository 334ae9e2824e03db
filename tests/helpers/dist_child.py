"""One rank of a real multi-process save on CPU (gloo), for the tests to run and kill:

    python dist_child.py savedir LOC RANK WORLD PORT STEPS...   # save_dir + DCP + own files
    python dist_child.py savedir-loop LOC RANK WORLD PORT        # the same, step after step
    python dist_child.py dcp LOC RANK WORLD PORT                 # dcp.save step after step

``dcp`` saves with torch.distributed.checkpoint alone (its own protocol: .metadata last) in
an endless loop, printing each step done, until it is killed. Each rank's state holds tensors
of its own (``rank<r>.w``) and a shared one, so every rank writes a file of its own."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

ELEMENTS = 64 * 1024  # 256 KiB per tensor: a save takes long enough to be killed inside


def state(rank: int, world: int, step: int) -> dict[str, torch.Tensor]:
    """What rank ``rank`` saves at ``step``: deterministic, so a loader can check it."""
    g = torch.Generator().manual_seed(step * 1000 + rank)
    out = {f"rank{rank}.w": torch.rand(ELEMENTS, generator=g)}
    out["shared"] = torch.full((1024,), float(step))
    return out


def load_all(path: Path, world: int, step: int) -> None:
    """Load a DCP checkpoint in one process (no process group) and check every rank's tensors:
    raises if it is not loadable or holds something else."""
    target = {f"rank{r}.w": torch.empty(ELEMENTS) for r in range(world)}
    target["shared"] = torch.empty(1024)
    dcp.load(target, checkpoint_id=str(path), no_dist=True)
    for r in range(world):
        want = state(r, world, step)[f"rank{r}.w"]
        if not torch.equal(target[f"rank{r}.w"], want):
            raise AssertionError(f"{path}: rank {r}'s tensor differs")
    if not torch.equal(target["shared"], torch.full((1024,), float(step))):
        raise AssertionError(f"{path}: shared tensor differs")


def main() -> None:
    mode, loc, rank_s, world_s, port = sys.argv[1:6]
    rank, world = int(rank_s), int(world_s)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    base = Path(loc)
    if mode in ("savedir", "savedir-loop"):
        from trainguard import checkpoint

        steps = map(int, sys.argv[6:]) if mode == "savedir" else itertools.count(1)
        for step in steps:
            with checkpoint.save_dir(
                base / f"step-{step}",
                pattern="step-{step}",
                rank=rank,
                world_size=world,
                barrier=dist.barrier,
            ) as tmp:
                dcp.save(state(rank, world, step), checkpoint_id=str(tmp))
                (tmp / f"extra-rank{rank}.bin").write_bytes(bytes([rank]) * (1000 + rank))
            if rank == 0 and mode == "savedir-loop":
                print(step, flush=True)
    elif mode == "dcp":
        step = 0
        while True:
            step += 1
            dcp.save(state(rank, world, step), checkpoint_id=str(base / f"step-{step}"))
            if rank == 0:
                print(step, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
