"""An evaluation-only Hugging Face Trainer script: the Trainer is built with the real
``TrainguardCallback``, only ``evaluate()`` is called, then the script parks at a gate
(``<gate>/parked-rank0`` holds its pid; it waits for ``<gate>/release``) and exits cleanly, so
that a test scrapes it while alive and after its end. Run as
``python eval_child.py --out OUT --state-dir STATE --gate GATE``."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--state-dir", type=Path, required=True)
    ap.add_argument("--gate", type=Path, required=True)
    opts = ap.parse_args()

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from trainguard.integrations.transformers import TrainguardCallback

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=32, n_positions=8, n_embd=8, n_layer=1, n_head=2)
    tokens = torch.randint(0, config.vocab_size, (16, 8))
    args = TrainingArguments(
        output_dir=str(opts.out),
        per_device_eval_batch_size=4,
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=GPT2LMHeadModel(config),
        args=args,
        eval_dataset=[{"input_ids": t, "labels": t} for t in tokens],
        callbacks=[TrainguardCallback(state_dir=opts.state_dir, interval=0.05)],
    )
    metrics = trainer.evaluate()
    assert "eval_loss" in metrics, metrics
    (opts.gate / "parked-rank0").write_text(f"{os.getpid()}\n")
    while not (opts.gate / "release").exists():
        time.sleep(0.01)


if __name__ == "__main__":
    main()
