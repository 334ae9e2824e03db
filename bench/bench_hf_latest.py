"""What ``trainguard status`` and ``verify`` pay per location of Hugging Face checkpoints:
``checkpoint.latest`` over 1,172 ``checkpoint-N`` directories nobody recorded, each with the
Trainer's files (a small ``model.safetensors``, torch zips, ``config.json``) and a
``trainer_state.json`` of 2,000 log entries (~250 KB), as a long run leaves them.

    PYTHONPATH=exporter python bench/bench_hf_latest.py [--steps 1172] [--repeat 3]

Reports the wall and CPU time of each call (the first one cold for trainguard's caches, the
page cache warm), and the newest complete step found (at once: every file carries its own
length, so no grace period is waited for).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from trainguard import checkpoint


def build(out: Path, steps: int) -> None:
    save_file({"w": torch.zeros(256)}, str(out / "m.safetensors"))
    torch.save({"a": torch.zeros(64)}, out / "o.pt")
    model, zipped = (out / "m.safetensors").read_bytes(), (out / "o.pt").read_bytes()
    hist = [{"loss": 1.0, "step": i, "learning_rate": 1e-4, "epoch": 0.1} for i in range(2000)]
    state = json.dumps({"global_step": 1, "log_history": hist}, indent=2, sort_keys=True) + "\n"
    for s in range(1, steps + 1):
        d = out / f"checkpoint-{s * 50}"
        d.mkdir()
        (d / "model.safetensors").write_bytes(model)
        for name in ("optimizer.pt", "rng_state.pth", "scheduler.pt", "training_args.bin"):
            (d / name).write_bytes(zipped)
        (d / "config.json").write_text('{\n  "model_type": "gpt2"\n}\n')
        (d / "trainer_state.json").write_text(state)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1172)
    ap.add_argument("--repeat", type=int, default=3)
    opts = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        build(out, opts.steps)
        for i in range(opts.repeat):
            wall, cpu = time.perf_counter(), time.process_time()
            found = checkpoint.latest(out, pattern="checkpoint-{step}")
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            step = found.step if found else None
            print(f"latest #{i + 1}: {wall:.2f} s wall, {cpu:.2f} s CPU, newest complete {step}")


if __name__ == "__main__":
    main()
