"""A Lightning run reported to trainguard by one callback: a tiny regression on random data,
on CPU.

    python examples/train_lightning.py --root /tmp/pl-run --max-steps 200 --save-steps 50
    python examples/train_lightning.py --root /tmp/pl-run --max-steps 400 --resume
    python examples/train_lightning.py --root /tmp/pl-ddp --devices 2   # DDP, Lightning's launcher

Checkpoints go to ``<root>/checkpoints/epoch=<E>-step=<N>.ckpt``, Lightning's default names,
which the callback announces (pattern ``epoch={epoch}-step={step}``) and writes through
``trainguard.checkpoint.save``; the default ``save_top_k=1`` keeps only the newest, so the
disk use stays bounded. ``--resume`` continues from the newest complete one, as
``trainguard.checkpoint.latest`` finds it (a checkpoint killed mid-save never is).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from trainguard import checkpoint
from trainguard.integrations.lightning import TrainguardCallback


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)
        )

    def training_step(
        self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int
    ) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", required=True, help="the trainer's default_root_dir")
    ap.add_argument("--max-steps", type=int, default=200)
    ap.add_argument("--save-steps", type=int, default=50)
    ap.add_argument("--resume", action="store_true", help="from the newest complete checkpoint")
    ap.add_argument(
        "--devices", type=int, default=1, help="processes: 2 or more run DDP (gloo on CPU)"
    )
    ap.add_argument("--name", default=None, help="run name (default: the root dir's name)")
    ap.add_argument("--state-dir", default=None, help="trainguard state dir (default: per user)")
    opts = ap.parse_args()

    torch.manual_seed(0)
    x = torch.randn(512, 8)
    data = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=16, shuffle=True)
    ckpt_dir = Path(opts.root) / "checkpoints"
    checkpoints = ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=opts.save_steps)
    trainer = L.Trainer(
        default_root_dir=opts.root,
        max_steps=opts.max_steps,
        accelerator="cpu",
        # several: Lightning's own launcher starts this script again for each rank after 0
        devices=opts.devices,
        strategy="ddp" if opts.devices > 1 else "auto",
        log_every_n_steps=10,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[checkpoints, TrainguardCallback(name=opts.name, state_dir=opts.state_dir)],
    )
    pattern = "epoch={epoch}-step={step}"  # Lightning's default names
    found = checkpoint.latest(ckpt_dir, pattern=pattern) if ckpt_dir.is_dir() else None
    resume = str(found.path) if opts.resume and found else None
    trainer.fit(Regression(), data, ckpt_path=resume)
    print(f"trained to step {trainer.global_step} (resumed from {resume}) pid {os.getpid()}")


if __name__ == "__main__":
    main()
