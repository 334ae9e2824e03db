"""A small CPU training loop that reports to trainguard: watch it with the exporter, kill it
with ``kill -9`` and see ``trainguard_run_process_up 0`` at the next scrape, start it again
and see the death recorded (it resumes from its newest checkpoint).

    python examples/train_toy.py --steps 500 --sleep 0.2 --checkpoint-dir /tmp/toy-ckpt

Needs torch (CPU is enough) and trainguard importable (``pip install -e .`` or
``PYTHONPATH=exporter``). The data is synthetic and made here: y = sin(x . w) + noise.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import time
from pathlib import Path

import torch
from torch import nn

import trainguard

CHECKPOINT_RE = re.compile(r"^step_(\d+)\.pt$")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--name", default="toy", help="run name (default: %(default)s)")
    p.add_argument("--steps", type=int, default=300, help="train up to this step")
    p.add_argument("--sleep", type=float, default=0.0, help="seconds to sleep per step")
    p.add_argument("--checkpoint-dir", type=Path, default=None, help="save and resume here")
    p.add_argument("--checkpoint-every", type=int, default=50, help="steps between checkpoints")
    p.add_argument("--state-dir", type=Path, default=None, help="trainguard state dir")
    p.add_argument("--log-file", type=Path, default=None, help="append a line per step here")
    p.add_argument(
        "--oom-snapshots",
        action="store_true",
        help="dump a CUDA memory snapshot on OOM (only does something with CUDA)",
    )
    return p.parse_args()


def newest_checkpoint(directory: Path | None) -> tuple[int, Path] | None:
    if directory is None or not directory.is_dir():
        return None
    found = []
    for path in directory.iterdir():
        m = CHECKPOINT_RE.match(path.name)
        if m:
            found.append((int(m.group(1)), path))
    return max(found) if found else None


def save_checkpoint(state: dict[str, object], directory: Path, step: int) -> Path:
    """Write to a temp name, fsync, then rename: a reader (or a resume after kill -9) never
    sees half a file under the final name."""
    # TODO: switch to trainguard.checkpoint.save(state, path) once it lands; it also records
    # the size and sha256 the exporter checks truncated files and mirrors against.
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"step_{step}.pt"
    tmp = directory / f".step_{step}.pt.part"
    with open(tmp, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, final)
    return final


def main() -> int:
    args = parse_args()
    torch.manual_seed(0)
    features = 64
    model = nn.Sequential(
        nn.Linear(features, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    true_w = torch.randn(features)
    start = 0
    resumed = newest_checkpoint(args.checkpoint_dir)
    if resumed is not None:
        state = torch.load(resumed[1], weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = resumed[0]
        print(f"resumed from {resumed[1]} at step {start}", flush=True)

    with contextlib.ExitStack() as stack:
        run = stack.enter_context(
            trainguard.Run(
                args.name,
                checkpoint_dir=args.checkpoint_dir,
                log_file=args.log_file,
                state_dir=args.state_dir,
                oom_snapshots=args.oom_snapshots,
            )
        )
        log = stack.enter_context(open(args.log_file, "a")) if args.log_file else None
        batch = 128
        last = time.perf_counter()
        for step in range(start + 1, args.steps + 1):
            x = torch.randn(batch, features)
            y = torch.sin(x @ true_w / features**0.5).unsqueeze(1) + 0.05 * torch.randn(batch, 1)
            with run.capture_oom():  # on a CUDA OOM: memory snapshot next to the heartbeat
                loss = nn.functional.mse_loss(model(x), y)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
            now = time.perf_counter()
            samples_per_s = batch / max(now - last, 1e-9)
            last = now
            run.step(step, loss=loss.item(), samples_per_s=samples_per_s)
            if log is not None:
                log.write(f"step {step} loss {loss.item():.4f}\n")
                log.flush()
            if args.checkpoint_dir is not None and step % args.checkpoint_every == 0:
                state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
                save_checkpoint(state, args.checkpoint_dir, step)
            if step % 50 == 0:
                print(f"step {step} loss {loss.item():.4f}", flush=True)
            if args.sleep:
                time.sleep(args.sleep)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
