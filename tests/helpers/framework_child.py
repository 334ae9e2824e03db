"""A real training process for the framework callback tests: the Hugging Face Trainer or
Lightning, on CPU, a tiny model built here (nothing downloaded), reporting through the real
``TrainguardCallback``. Run as ``python -m helpers.framework_child``.

Gates make the tests deterministic without sleeping: at ``--gate-step`` every rank writes
``<gate dir>/parked-rank<R>`` and waits for ``<gate dir>/release`` (so a test scrapes, or
kills, a process known to be mid-training at a known step); a worker that torchrun restarted
(``$TORCHELASTIC_RESTART_COUNT`` > 0) waits for ``<gate dir>/restart`` before it starts (so a
test sees the death before the restart). ``--raise-step`` raises ValueError there. Every
start resumes from the newest checkpoint the framework finished writing, if any (Lightning:
what ``trainguard.checkpoint.latest`` returns; ``<gate dir>/resumed`` then holds that path, or
``none``, and the step training started from). Lightning's ``--park-in-save-step`` parks
while its checkpoint of that step is being saved (pickled), so that a test kills it there."""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import time
from pathlib import Path
from typing import Any


def wait_for(path: Path) -> None:
    while not path.exists():
        time.sleep(0.01)


def park(gate: Path, rank: int) -> None:
    (gate / f"parked-rank{rank}").write_text(f"{os.getpid()}\n")
    wait_for(gate / "release")


def train_hf(opts: argparse.Namespace) -> None:
    import torch
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    from trainguard.integrations.transformers import TrainguardCallback

    class Gate(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step == opts.gate_step:
                park(opts.gate, args.process_index)
            if state.global_step == opts.raise_step:
                raise ValueError("training failed")

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=32, n_positions=8, n_embd=8, n_layer=1, n_head=2)
    tokens = torch.randint(0, config.vocab_size, (64, 8))
    args = TrainingArguments(
        output_dir=str(opts.out),
        max_steps=opts.max_steps,
        save_steps=opts.save_steps,
        logging_steps=5,
        per_device_train_batch_size=4,
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
        include_num_input_tokens_seen=True,  # logged: the callback makes it tokens_per_s
        ddp_timeout=120,  # a restarted worker group that cannot connect fails (and restarts)
    )
    trainer = Trainer(
        model=GPT2LMHeadModel(config),
        args=args,
        train_dataset=[{"input_ids": t, "labels": t} for t in tokens],
        callbacks=[TrainguardCallback(state_dir=opts.state_dir, interval=0.05), Gate()],
    )
    done = [p for p in opts.out.glob("checkpoint-*") if (p / "trainer_state.json").exists()]
    resume = max(done, key=lambda p: int(p.name.split("-")[1])) if done else None
    trainer.train(resume_from_checkpoint=str(resume) if resume else None)


def train_lightning(opts: argparse.Namespace) -> None:
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import Callback, ModelCheckpoint
    from torch.utils.data import DataLoader, TensorDataset

    from trainguard import checkpoint
    from trainguard.integrations.lightning import TrainguardCallback

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
            if self.trainer.global_step == opts.park_in_save_step:
                checkpoint["park"] = ParkWhilePickled(self.trainer.global_rank)

    class ParkWhilePickled:
        """Parks when torch.save pickles it: mid-save, the checkpoint's file open."""

        def __init__(self, rank: int) -> None:
            self.rank = rank

        def __reduce__(self) -> tuple[Any, ...]:
            park(opts.gate, self.rank)
            return (dict, ())

    class Gate(Callback):
        def on_train_start(self, trainer: Any, *a: Any) -> None:
            if trainer.global_rank == 0:
                (opts.gate / "resumed").write_text(f"{resume or 'none'} {trainer.global_step}\n")

        def on_train_batch_end(self, trainer: Any, *a: Any) -> None:
            if trainer.global_step == opts.gate_step:
                park(opts.gate, trainer.global_rank)
            if trainer.global_step == opts.raise_step:
                raise ValueError("training failed")

    torch.manual_seed(0)
    x = torch.randn(64, 4)
    ckpt_dir = opts.out / "checkpoints"
    trainer = L.Trainer(
        default_root_dir=opts.out,
        max_steps=opts.max_steps,
        accelerator="cpu",
        # under torchrun: its processes; --devices=2 --strategy=ddp: Lightning's own launcher,
        # which starts this script again for rank 1
        devices=opts.devices or int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        strategy=opts.strategy,
        log_every_n_steps=5,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[
            ModelCheckpoint(  # Lightning's default names: epoch=0-step=10.ckpt
                dirpath=ckpt_dir, every_n_train_steps=opts.save_steps, save_top_k=-1
            ),
            TrainguardCallback(state_dir=opts.state_dir, interval=0.05),
            Gate(),
        ],
    )
    pattern = "epoch={epoch}-step={step}"
    found = checkpoint.latest(ckpt_dir, pattern=pattern) if ckpt_dir.is_dir() else None
    resume = str(found.path) if found else None
    data = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=4)
    trainer.fit(Module(), data, ckpt_path=resume)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("framework", choices=["hf", "lightning"])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--state-dir", type=Path, required=True)
    ap.add_argument("--gate", type=Path, required=True)
    ap.add_argument("--max-steps", type=int, default=20)
    ap.add_argument("--save-steps", type=int, default=10)
    ap.add_argument("--gate-step", type=int, default=-1)
    ap.add_argument("--raise-step", type=int, default=-1, help="raise ValueError at this step")
    ap.add_argument("--devices", type=int, default=0, help="Lightning: devices= (0: the launcher)")
    ap.add_argument("--strategy", default="auto", help="Lightning: strategy=")
    ap.add_argument("--park-in-save-step", type=int, default=-1, help="Lightning: park mid-save")
    opts = ap.parse_args()
    faulthandler.register(signal.SIGUSR1)  # a test that gives up dumps where it hangs
    if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0:
        wait_for(opts.gate / "restart")
    (train_hf if opts.framework == "hf" else train_lightning)(opts)


if __name__ == "__main__":
    main()
