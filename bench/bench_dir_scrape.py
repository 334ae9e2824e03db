"""Scrape cost of directory checkpoints: 10 runs x 100 step directories x 64 files each
(64,000 files), judged by the checkpoints collector in process, as frameworks lay them out.

    PYTHONPATH=exporter python bench/bench_dir_scrape.py [--runs 10] [--steps 100]
                                                         [--files 64] [--scrapes 50]

Two layouts: ``dcp`` (``step-N/`` with 63 ``__r_0.distcp`` files and ``.metadata``, flat) and
``megatron`` (``iter_000000N/mp_rank_XX/`` 8 subdirectories of 8 files, and
``latest_checkpointed_iteration.txt``). Files are 1 KiB (the cost is in metadata, not size),
every mtime set past the grace period. Reports, per layout: the first scrape (everything
listed), the steady state (every directory's stat trusted: no directory listed again, no
file lstat'ed) with the number of ``os.scandir`` calls per scrape, scrapes 15 s apart over two
minutes (each step tree is listed and stat'ed again every 30-60 s, spread per directory), and
a scrape while one step directory per run gets a new file at every scrape (that directory
listed again, its location judged again).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from trainguard.exporter.collectors.checkpoints.collector import CheckpointsCollector
from trainguard.exporter.collectors.checkpoints.dirwatch import SETTLE_SECONDS
from trainguard.exporter.collectors.checkpoints.verifier import Verifier
from trainguard.exporter.config.model import CheckpointSettings
from trainguard.exporter.runs.targets import CheckpointTarget
from trainguard.exporter.scrape.context import Scrape

OLD = time.time_ns() - 3600 * 10**9


def build(root: Path, layout: str, runs: int, steps: int, files: int) -> list[CheckpointTarget]:
    blob = os.urandom(1024)
    targets = []
    for r in range(runs):
        loc = root / layout / f"run{r}"
        for s in range(1, steps + 1):
            if layout == "dcp":
                d = loc / f"step-{s}"
                d.mkdir(parents=True)
                for i in range(files - 1):
                    (d / f"__{i}_0.distcp").write_bytes(blob)
                (d / ".metadata").write_bytes(blob)
            else:
                d = loc / f"iter_{s:07d}"
                per = 8
                for sub in range(files // per):
                    sd = d / f"mp_rank_{sub:02d}"
                    sd.mkdir(parents=True)
                    for i in range(per):
                        (sd / f"shard_{i}.pt").write_bytes(blob)
        if layout == "megatron":
            (loc / "latest_checkpointed_iteration.txt").write_text(str(steps))
        for dirpath, dirnames, filenames in os.walk(loc):
            for n in dirnames + filenames:
                os.utime(os.path.join(dirpath, n), ns=(OLD, OLD))
        pattern = "step-{step}" if layout == "dcp" else "iter_{step}"
        targets.append(CheckpointTarget(f"run{r}", "primary", loc, pattern))
    return targets


class Clock:
    def __init__(self) -> None:
        self.now = time.monotonic()

    def __call__(self) -> float:
        return self.now


def timed(collector: CheckpointsCollector, n: int, before=lambda: None) -> tuple[list[float], int]:
    calls = [0]
    real = os.scandir

    def counting(*a):  # type: ignore[no-untyped-def]
        calls[0] += 1
        return real(*a)

    os.scandir = counting  # type: ignore[assignment]
    out = []
    try:
        for _ in range(n):
            before()
            t0 = time.perf_counter()
            scrape = Scrape()
            list(collector.gather(scrape))
            out.append((time.perf_counter() - t0) * 1000)
            assert not scrape.errors, scrape.errors
    finally:
        os.scandir = real  # type: ignore[assignment]
    return out, calls[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--files", type=int, default=64)
    ap.add_argument("--scrapes", type=int, default=50)
    args = ap.parse_args()
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    print(f"load average before: {os.getloadavg()}")
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        root = Path(tmp)
        for layout in ("dcp", "megatron"):
            targets = build(root, layout, args.runs, args.steps, args.files)
            clock = Clock()
            verifier = Verifier(1e9)
            collector = CheckpointsCollector(
                lambda _s, t=targets: t,  # type: ignore[misc]
                CheckpointSettings(),
                verifier=verifier,
                monotonic=clock,
            )
            first, first_calls = timed(collector, 1)
            clock.now += SETTLE_SECONDS + 0.1
            timed(collector, 1)  # confirms every directory's stat
            steady, steady_calls = timed(collector, args.scrapes)

            # two minutes of scrapes 15 s apart: each step tree is read again in full every
            # 30-60 s (spread per directory), so these scrapes share that work
            def tick(clock: Clock = clock) -> None:
                clock.now += 15

            revalidate, revalidate_calls = timed(collector, 8, tick)
            counter = [0]

            def one_new_file(layout: str = layout, targets=targets, counter=counter) -> None:  # type: ignore[no-untyped-def]
                counter[0] += 1
                for t in targets:
                    d = next(p for p in sorted(t.path.iterdir()) if p.is_dir())
                    if layout == "megatron":
                        d = d / "mp_rank_00"
                    (d / f"new_{counter[0]}").write_bytes(b"x")

            changing, changing_calls = timed(collector, args.scrapes, one_new_file)
            verifier.stop()
            files = args.runs * args.steps * args.files
            print(
                f"{layout}: {args.runs} runs x {args.steps} step dirs x {args.files} files "
                f"= {files} files"
            )
            print(f"  first scrape (all listed): {first[0]:.0f} ms, {first_calls} scandir calls")
            print(
                f"  steady state: p50 {statistics.median(steady):.0f} ms, max "
                f"{max(steady):.0f} ms, {steady_calls / args.scrapes:.1f} scandir calls/scrape"
            )
            print(
                f"  scrapes 15 s apart over 2 min (trees re-read every 30-60 s): p50 "
                f"{statistics.median(revalidate):.0f} ms, max {max(revalidate):.0f} ms, "
                f"{revalidate_calls / 8:.0f} scandir calls/scrape"
            )
            print(
                f"  one step dir per run changing: p50 {statistics.median(changing):.0f} ms, "
                f"{changing_calls / args.scrapes:.1f} scandir calls/scrape"
            )
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
