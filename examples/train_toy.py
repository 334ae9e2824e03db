"""A small CPU training loop that reports to trainguard: watch it with the exporter, kill it
with ``kill -9`` and see ``trainguard_run_process_up 0`` at the next scrape, start it again
and see the death recorded (it resumes from its newest checkpoint).

    python examples/train_toy.py --steps 500 --sleep 0.2 --checkpoint-dir /tmp/toy-ckpt \
        --mirror-dir /tmp/toy-mirror

Needs torch (CPU is enough) and trainguard importable (``pip install -e .`` or
``PYTHONPATH=exporter``). The data is synthetic and made here: y = sin(x . w) + noise.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from pathlib import Path

import torch
from torch import nn

import trainguard
from trainguard import checkpoint


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--name",
        # `trainguard launch --name X -- python examples/train_toy.py` sets $TRAINGUARD_RUN
        default=os.environ.get("TRAINGUARD_RUN") or "toy",
        help="run name (default: $TRAINGUARD_RUN, else toy: %(default)s)",
    )
    p.add_argument("--steps", type=int, default=300, help="train up to this step")
    p.add_argument("--sleep", type=float, default=0.0, help="seconds to sleep per step")
    p.add_argument("--checkpoint-dir", type=Path, default=None, help="save and resume here")
    p.add_argument("--checkpoint-every", type=int, default=50, help="steps between checkpoints")
    p.add_argument("--mirror-dir", type=Path, default=None, help="mirror each checkpoint here")
    p.add_argument("--keep", type=int, default=3, help="complete checkpoints to keep")
    p.add_argument(
        "--prune-grace",
        type=float,
        default=30.0,
        help="never prune a file touched this recently, in seconds (default: %(default)s; "
        "the library's default is 300, for writers other than trainguard.checkpoint: this "
        "toy's saves are recorded whole, so a short grace keeps --keep honest)",
    )
    p.add_argument("--state-dir", type=Path, default=None, help="trainguard state dir")
    p.add_argument("--log-file", type=Path, default=None, help="append a line per step here")
    p.add_argument(
        "--oom-snapshots",
        action="store_true",
        help="dump a CUDA memory snapshot on OOM (only does something with CUDA)",
    )
    return p.parse_args()


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
    if args.checkpoint_dir is not None:
        args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        # the newest COMPLETE checkpoint: a truncated or half-written one is never resumed from
        resumed = checkpoint.latest(args.checkpoint_dir)
        if resumed is not None:
            state = torch.load(resumed, weights_only=True)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            start = resumed.step
            print(f"resumed from {resumed.path} at step {start}", flush=True)
    if args.mirror_dir is not None:
        args.mirror_dir.mkdir(parents=True, exist_ok=True)

    with contextlib.ExitStack() as stack:
        run = stack.enter_context(
            trainguard.Run(
                args.name,
                checkpoint_dir=args.checkpoint_dir,
                mirrors={"backup": args.mirror_dir} if args.mirror_dir else None,
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
                path = args.checkpoint_dir / f"step_{step}.pt"
                checkpoint.save(state, path)  # .part, fsync, rename, then size + sha256 record
                mirrors = []
                if args.mirror_dir is not None:
                    checkpoint.mirror(path, args.mirror_dir)
                    mirrors.append(args.mirror_dir)
                checkpoint.prune(
                    args.checkpoint_dir, keep=args.keep, mirrors=mirrors, grace=args.prune_grace
                )
            if step % 50 == 0:
                print(f"step {step} loss {loss.item():.4f}", flush=True)
            if args.sleep:
                time.sleep(args.sleep)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
