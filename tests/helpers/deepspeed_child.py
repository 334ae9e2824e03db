"""A rank of a DeepSpeed ZeRO run on CPU (gloo) that saves at every step, to be SIGKILLed.

    python deepspeed_child.py DIR STAGE RANK WORLD PORT GATE
    python deepspeed_child.py check STAGE RANK WORLD PORT DIR:STEP,STEP... [DIR:STEP,...]

Resumes from the step directory ``trainguard.checkpoint.latest`` finds in DIR (as the docs
say: ``engine.load_checkpoint(save_dir, tag=found.path.name)``), then trains a small model
and calls ``engine.save_checkpoint(DIR)`` after every step (tags ``global_step<N>``, then
``latest``). Before each save rank 0 reads a line from the FIFO ``GATE`` (the others wait in
the save's first barrier): ``go``, ``kill F``: SIGKILL itself F times the mean length of
its saves so far into this one (timed here, as the test's own wake-up on two busy cores
takes longer than a save), or ``killat K``: SIGKILL itself as this save calls ``torch.save``
for the K-th time (1: the model states, 2: its ZeRO partition). Rank 0 prints ``saving N``
and ``saved N SECONDS``. ``check``
loads each given step with ``engine.load_checkpoint`` (model, ZeRO optimizer partitions) and
exits non-zero unless each comes back as that step (tests/training/test_deepspeed_real.py).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import deepspeed
import deepspeed.ops
import torch

from trainguard.checkpoint import latest

PATTERN = "global_step{step}"


def engine_for(stage: int, rank: int, world: int, port: int) -> deepspeed.DeepSpeedEngine:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
    )
    # DeepSpeed's CPU accelerator JIT-compiles a shared-memory allreduce (C++ against torch's
    # headers: minutes on two cores) in init_distributed; gloo does without it
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64))
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
    }
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    return engine


def kill_at(k: int) -> None:
    """SIGKILL this process when torch.save is called for the ``k``-th time from now."""
    real = torch.save
    calls = 0

    def save(*args: object, **kwargs: object) -> None:
        nonlocal calls
        calls += 1
        if calls == k:
            os.kill(os.getpid(), signal.SIGKILL)
        real(*args, **kwargs)  # type: ignore[arg-type]

    torch.save = save


def train(directory: str, stage: int, rank: int, world: int, port: int, gate: str) -> None:
    engine = engine_for(stage, rank, world, port)
    gate_r = open(gate) if rank == 0 else None  # noqa: SIM115 (read until the kill)
    took: list[float] = []
    found = latest(directory, pattern=PATTERN, grace=0) if os.path.isdir(directory) else None
    if found is not None:
        engine.load_checkpoint(directory, tag=found.path.name)
    while True:
        x = torch.randn(2, 64)
        loss = engine(x).pow(2).mean()
        engine.backward(loss)
        engine.step()
        if gate_r is not None:
            order = gate_r.readline().split()
            if not order:
                return  # the test closed the gate
            print(f"saving {engine.global_steps}", flush=True)
            if order[0] == "kill":
                after = float(order[1]) * sum(took) / len(took)
                threading.Timer(after, os.kill, (os.getpid(), signal.SIGKILL)).start()
            elif order[0] == "killat":
                kill_at(int(order[1]))
        t0 = time.monotonic()
        engine.save_checkpoint(directory)
        took.append(time.monotonic() - t0)
        if rank == 0:
            print(f"saved {engine.global_steps} {took[-1]:.3f}", flush=True)


def check(stage: int, rank: int, world: int, port: int, wanted: list[str]) -> None:
    engine = engine_for(stage, rank, world, port)
    for arg in wanted:
        directory, _, steps = arg.rpartition(":")
        for step in (int(s) for s in steps.split(",") if s):
            path, _ = engine.load_checkpoint(directory, tag=f"global_step{step}")
            if path is None or engine.global_steps != step:
                raise SystemExit(f"{directory} step {step}: loaded {path}, {engine.global_steps}")
            if rank == 0:
                print(f"loaded {directory} {step}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "check":
        nums = [int(a) for a in sys.argv[2:6]]
        check(nums[0], nums[1], nums[2], nums[3], sys.argv[6:])
    else:
        args = sys.argv[1:]
        train(args[0], int(args[1]), int(args[2]), int(args[3]), int(args[4]), args[5])
