"""A tiny Hugging Face Trainer run on CPU (a model built from a config, random data, nothing
downloaded), for the tests to kill while it saves, and the checks of what it left:

    python hf_child.py train OUT            # save every step until killed
    python hf_child.py check DIR...         # load every part of each checkpoint as a resume does
    python hf_child.py resume OUT DIR       # Trainer.train(resume_from_checkpoint=DIR)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)
from transformers.trainer_callback import TrainerState


class Random(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        ids = torch.randint(0, 128, (16,), generator=g)
        return {"input_ids": ids, "labels": ids}


def model() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=128, n_positions=32, n_embd=64, n_layer=2, n_head=2)
    return GPT2LMHeadModel(cfg)


def trainer(out: str, max_steps: int) -> Trainer:
    args = TrainingArguments(
        output_dir=out,
        max_steps=max_steps,
        save_strategy="steps",
        save_steps=1,
        logging_steps=1000,
        per_device_train_batch_size=2,
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    return Trainer(model=model(), args=args, train_dataset=Random())


class Began(TrainerCallback):
    step = -1

    def on_train_begin(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        Began.step = state.global_step


def main() -> None:
    mode = sys.argv[1]
    if mode == "train":
        trainer(sys.argv[2], 100_000).train()
    elif mode == "check":
        for d in map(Path, sys.argv[2:]):
            step = int(d.name.split("-")[1])
            state = TrainerState.load_from_json(str(d / "trainer_state.json"))
            assert state.global_step == step, (d, state.global_step)
            GPT2LMHeadModel.from_pretrained(d)
            torch.load(d / "optimizer.pt", weights_only=True)
            torch.load(d / "scheduler.pt", weights_only=True)
            torch.load(d / "rng_state.pth", weights_only=False)
    elif mode == "resume":
        ckpt = Path(sys.argv[3])
        step = int(ckpt.name.split("-")[1])
        t = trainer(sys.argv[2], step + 1)
        t.add_callback(Began())
        t.train(resume_from_checkpoint=str(ckpt))
        print(json.dumps({"resumed_from": Began.step, "global_step": t.state.global_step}))


if __name__ == "__main__":
    main()
