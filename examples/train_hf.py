"""A Hugging Face Trainer run reported to trainguard by one callback: a tiny GPT-2 built from
a config (nothing downloaded) on random tokens, on CPU.

    python examples/train_hf.py --output-dir /tmp/hf-run --max-steps 200 --save-steps 50
    python examples/train_hf.py --output-dir /tmp/hf-run --max-steps 400 --resume

The Trainer keeps the newest ``--save-total-limit`` checkpoints (3), so the disk use stays
bounded however long it runs. ``--resume`` continues from the newest complete checkpoint
(``trainguard.checkpoint.latest``: recorded by the callback when the Trainer saved it).
Under torchrun nothing changes: ``torchrun --nproc-per-node 2 examples/train_hf.py ...``
reports each rank.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from trainguard import checkpoint
from trainguard.integrations.transformers import CHECKPOINT_PATTERN, TrainguardCallback


def newest_complete_checkpoint(output_dir: str) -> str | None:
    """What trainguard calls the newest complete ``checkpoint-N`` (the exporter agrees)."""
    if not Path(output_dir).is_dir():
        return None
    found = checkpoint.latest(output_dir, pattern=CHECKPOINT_PATTERN)
    return str(found.path) if found else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--output-dir", required=True)
    ap.add_argument("--max-steps", type=int, default=200)
    ap.add_argument("--save-steps", type=int, default=50)
    ap.add_argument("--save-total-limit", type=int, default=3, help="checkpoints kept")
    ap.add_argument("--resume", action="store_true", help="from the newest complete checkpoint")
    ap.add_argument("--name", default=None, help="run name (default: the output dir's name)")
    ap.add_argument("--state-dir", default=None, help="trainguard state dir (default: per user)")
    opts = ap.parse_args()

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    model = GPT2LMHeadModel(config)
    tokens = torch.randint(0, config.vocab_size, (256, 16))
    data = [{"input_ids": t, "labels": t} for t in tokens]
    args = TrainingArguments(
        output_dir=opts.output_dir,
        max_steps=opts.max_steps,
        save_steps=opts.save_steps,
        save_total_limit=opts.save_total_limit,
        logging_steps=10,
        per_device_train_batch_size=8,
        learning_rate=1e-3,
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    callback = TrainguardCallback(name=opts.name, state_dir=opts.state_dir)  # the one line
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
    resume = newest_complete_checkpoint(opts.output_dir) if opts.resume else None
    trainer.train(resume_from_checkpoint=resume)
    print(f"trained to step {trainer.state.global_step} (resumed from {resume}) pid {os.getpid()}")


if __name__ == "__main__":
    main()
