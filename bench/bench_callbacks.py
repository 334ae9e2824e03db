"""Cost of the framework callbacks per training step, inside real training runs.

    OMP_NUM_THREADS=1 PYTHONPATH=exporter python bench/bench_callbacks.py [--steps 300] [--rounds 3]

For each framework (the Hugging Face Trainer, Lightning; tiny models on CPU, as in
examples/), rounds alternate a run *without* the callback and one *with* it, same seed and
data. Two figures:

- **hook cost**: the time spent inside ``TrainguardCallback``'s per-step hooks (the Trainer's
  ``on_step_end`` and ``on_log``, Lightning's ``on_train_batch_end``), timed around each call
  by a wrapper: what the callback adds to a step, whatever the step costs;
- **step time**: wall time between consecutive step ends, median over the steps of all
  rounds, without and with the callback: whether the addition is visible at all. A tiny model
  on CPU makes a step short (milliseconds), which is the worst case for a fixed cost per step;
  real steps are 100-10000x longer.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def timed(hook: Callable[..., Any], sink: list[int]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter_ns()
        try:
            return hook(*args, **kwargs)
        finally:
            sink.append(time.perf_counter_ns() - start)

    return call


def run_hf(steps: int, with_callback: bool, out: Path, hooks: list[int]) -> list[float]:
    import torch
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    from trainguard.integrations.transformers import TrainguardCallback

    ends: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            ends.append(time.perf_counter())

    callbacks: list[Any] = [Clock()]
    if with_callback:
        cb = TrainguardCallback(state_dir=out / "state")
        cb.on_step_end = timed(cb.on_step_end, hooks)  # type: ignore[method-assign]
        cb.on_log = timed(cb.on_log, hooks)  # type: ignore[method-assign]
        callbacks.insert(0, cb)
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    tokens = torch.randint(0, config.vocab_size, (512, 16))
    args = TrainingArguments(
        output_dir=str(out / "hf"),
        max_steps=steps,
        save_strategy="no",
        logging_steps=10,
        per_device_train_batch_size=8,
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
    )
    Trainer(
        model=GPT2LMHeadModel(config),
        args=args,
        train_dataset=[{"input_ids": t, "labels": t} for t in tokens],
        callbacks=callbacks,
    ).train()
    return ends


def run_lightning(steps: int, with_callback: bool, out: Path, hooks: list[int]) -> list[float]:
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import Callback
    from torch.utils.data import DataLoader, TensorDataset

    from trainguard.integrations.lightning import TrainguardCallback

    ends: list[float] = []

    class Clock(Callback):
        def on_train_batch_end(self, *a: Any) -> None:
            ends.append(time.perf_counter())

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(
                torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)
            )

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    callbacks: list[Any] = [Clock()]
    if with_callback:
        cb = TrainguardCallback(state_dir=out / "state")
        cb.on_train_batch_end = timed(cb.on_train_batch_end, hooks)  # type: ignore[method-assign]
        callbacks.insert(0, cb)
    torch.manual_seed(0)
    x = torch.randn(4096, 32)
    trainer = L.Trainer(
        default_root_dir=out / "pl",
        max_steps=steps,
        accelerator="cpu",
        devices=1,
        log_every_n_steps=10,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
    )
    data = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=16)
    trainer.fit(Module(), data)
    return ends


def step_times(ends: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(ends[10:])]  # the first steps warm up


def us(ns: float) -> str:
    return f"{ns / 1000:.1f} us"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    opts = ap.parse_args()
    print(
        f"# {datetime.date.today()} {platform.machine()} {os.cpu_count()} cpus, "
        f"python {platform.python_version()}, load {os.getloadavg()[0]:.1f}, "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '-')}"
    )
    print("| framework | hook per step: median / p99 / max | step without | step with |")
    print("|---|---|---|---|")
    for name, run in (("HF Trainer", run_hf), ("Lightning", run_lightning)):
        without: list[float] = []
        with_: list[float] = []
        hooks: list[int] = []
        for _ in range(opts.rounds):
            with tempfile.TemporaryDirectory() as tmp:
                without += step_times(run(opts.steps, False, Path(tmp), []))
            with tempfile.TemporaryDirectory() as tmp:
                with_ += step_times(run(opts.steps, True, Path(tmp), hooks))
        hooks.sort()
        p99 = hooks[min(len(hooks) - 1, int(len(hooks) * 0.99))]
        print(
            f"| {name} | {us(statistics.median(hooks))} / {us(p99)} / {us(hooks[-1])} "
            f"| {statistics.median(without) * 1000:.2f} ms "
            f"| {statistics.median(with_) * 1000:.2f} ms |",
            flush=True,
        )


if __name__ == "__main__":
    sys.exit(main())
