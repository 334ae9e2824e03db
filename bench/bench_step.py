"""Cost of ``trainguard.Run.step()`` as the training loop sees it.

    PYTHONPATH=exporter python bench/bench_step.py [--calls 1000000]

Scenarios (each a fresh Run in a temp state dir, ``run.step(i, loss=..., tokens_per_s=...)``
in a tight loop):

- ``fast disk``: the temp dir as is, default interval (1 s).
- ``fast disk, interval 10 ms``: the writer thread wakes 100x more often, to show its GIL
  share does not leak into step().
- ``slow disk (fsync 50 ms)``: ``os.fsync`` replaced by a 50 ms sleep, i.e. a disk where
  every durable write takes 50 ms (a busy NFS server, a throttled cloud volume). A FUSE
  filesystem would be the faithful way to slow a disk; the writer's only blocking calls are
  open/write/fsync/rename and fsync dominates on a slow device, so sleeping in fsync (which
  like the real call releases the GIL) shows the same thing: whether step() ever waits for
  the disk.
- ``hung disk (fsync 5 s)``: the same with every fsync taking 5 s.
- ``oom_snapshots ...``: ``Run(oom_snapshots=True, snapshot_steps=1000)``: the reporter thread
  also looks for a ``trainguard snapshot`` request (one stat per wake) and tries a periodic
  snapshot every 1000 steps; on a machine without CUDA each try fails (counted, logged once),
  so the row shows the bookkeeping's cost to step(), not a real dump's (which holds the GIL
  while it builds and pickles the snapshot: a GPU measurement).
- ``baseline``: the same loop calling an empty function with the same arguments and no Run:
  the machine's own noise (preemption by other processes) that every row also contains.

For each: the amortised cost (a loop without per-call timing) and the distribution of single
calls (each call timed with perf_counter_ns, which adds ~50-100 ns to each figure).
Goals: under 5 us amortised, no single call above 1 ms.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from trainguard.run.reporter import Run


@contextmanager
def slow_fsync(seconds: float | None) -> Iterator[list[int]]:
    """Replace os.fsync by a sleep; yields a list counting the fsync calls."""
    calls: list[int] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        calls.append(1)
        time.sleep(seconds or 0)

    if seconds is not None:
        os.fsync = fsync
    try:
        yield calls
    finally:
        os.fsync = real


def amortised(run: Any, calls: int) -> float:
    step = run.step
    start = time.perf_counter()
    for i in range(calls):
        step(i, loss=0.5, tokens_per_s=1234.0)
    return (time.perf_counter() - start) / calls


def single_calls(run: Any, calls: int) -> list[int]:
    step = run.step
    clock = time.perf_counter_ns
    out = [0] * calls
    for i in range(calls):
        t0 = clock()
        step(i, loss=0.5, tokens_per_s=1234.0)
        out[i] = clock() - t0
    return out


def _noop(step: int, **scalars: float) -> None:
    """What a call costs with no Run at all: the machine's own noise floor."""


class _Baseline:
    step = staticmethod(_noop)

    def close(self) -> None:
        pass


def scenario(
    name: str, calls: int, fsync_s: float | None, interval: float, **kwargs: Any
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as state, slow_fsync(fsync_s) as fsyncs:
        run: Any = (
            _Baseline()
            if interval == 0
            else Run("bench", state_dir=state, interval=interval, close_timeout=0.5, **kwargs)
        )
        time.sleep(0.05)  # let the writer start
        per_call = amortised(run, calls)
        durations = single_calls(run, calls)
        close_start = time.perf_counter()
        run.close()
        close_s = time.perf_counter() - close_start
    durations.sort()
    return {
        "name": name,
        "amortised_us": per_call * 1e6,
        "p50_us": durations[len(durations) // 2] / 1e3,
        "p99_us": durations[int(len(durations) * 0.99)] / 1e3,
        "p9999_us": durations[int(len(durations) * 0.9999)] / 1e3,
        "max_us": durations[-1] / 1e3,
        "over_1ms": sum(d > 1_000_000 for d in durations),
        "fsyncs": len(fsyncs) if fsync_s is not None else None,
        "close_s": close_s,
    }


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else ("?",)
    return (
        f"{platform.system()} {platform.release()}, {cpu}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, load average {load[0]:.1f} at start"
        if isinstance(load[0], float)
        else f"{platform.system()}, {cpu}"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--calls", type=int, default=1_000_000)
    args = p.parse_args()
    snapshots = {"oom_snapshots": True, "snapshot_steps": 1000}
    runs: list[tuple[str, float | None, float, dict[str, Any]]] = [
        ("baseline: empty function, no Run", None, 0, {}),
        ("fast disk", None, 1.0, {}),
        ("fast disk, interval 10 ms", None, 0.01, {}),
        ("slow disk (fsync 50 ms)", 0.05, 1.0, {}),
        ("slow disk (fsync 50 ms), interval 10 ms", 0.05, 0.01, {}),
        ("hung disk (fsync 5 s)", 5.0, 1.0, {}),
        ("oom_snapshots, snapshot_steps=1000 (no CUDA: each try fails)", None, 1.0, snapshots),
        ("oom_snapshots, snapshot_steps=1000, interval 10 ms", None, 0.01, snapshots),
        ("baseline again", None, 0, {}),
    ]
    print(f"machine: {machine()}")
    print(f"command: {' '.join([os.path.basename(sys.executable), *sys.argv])}")
    print(f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
    print(f"gc: {'enabled' if gc.isenabled() else 'disabled'}; {args.calls} calls per loop\n")
    print(
        "| scenario | amortised µs/call | p50 µs | p99 µs | p99.99 µs | max µs | calls > 1 ms "
        "| fsyncs | close() s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    fmt: Callable[[Any], str] = lambda v: "—" if v is None else f"{v:.2f}"  # noqa: E731
    for name, fsync_s, interval, kwargs in runs:
        r = scenario(name, args.calls, fsync_s, interval, **kwargs)
        print(
            f"| {r['name']} | {r['amortised_us']:.3f} | {fmt(r['p50_us'])} | {fmt(r['p99_us'])} "
            f"| {fmt(r['p9999_us'])} | {fmt(r['max_us'])} | {r['over_1ms']} "
            f"| {'—' if r['fsyncs'] is None else r['fsyncs']} | {r['close_s']:.2f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
