"""Scrape time with huge directories and a huge file: the timing targets that pass/fail tests
used to assert (issue 12 moved them here: on a busy machine a test asserts what happens, and
how long it takes is measured, on purpose, by a benchmark).

    python bench/bench_big_dirs.py [--repeat 5] [--entries 100000]

Cases (medians of ``--repeat`` scrapes after one warm-up scrape, except where said):

- ``checkpoint dir, 100k names``: the checkpoint collector in-process, on a directory of
  ``--entries`` unrelated names and 200 checkpoints (tests/exporter/test_checkpoints_collector.py
  checks it lists the directory once). Target: under 1 s.
- ``state dir, 100k names``: the real exporter over HTTP, a state dir of ``--entries``
  unrelated entries and two heartbeats. Target: under 1 s.
- ``state dir, 10 001 heartbeat files``: the same after 10 001 files that look like
  heartbeats: the first scrape reads 10 000 of them (target: under 10 s), the next ones read
  none again (target: under 3 s; tests/exporter/test_runtable.py checks they are not read again).
- ``1 GiB sparse heartbeat``: refused from its size, never read. Target: under 1 s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# tests/ for helpers, tests/exporter/ for the collector test's Setup
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "exporter"), str(REPO / "exporter")]

from helpers.exporter_proc import Exporter  # noqa: E402
from helpers.run_child import own_heartbeat, put  # noqa: E402
from test_checkpoints_collector import Setup  # noqa: E402


def touch_many(directory: Path, names: list[str]) -> None:
    for name in names:
        os.close(os.open(directory / name, os.O_CREAT | os.O_WRONLY, 0o644))


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def median_of(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm
    return statistics.median(timed(fn) for _ in range(repeat))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--entries", type=int, default=100_000)
    args = ap.parse_args()
    rows: list[tuple[str, float, float]] = []
    with tempfile.TemporaryDirectory(prefix="tg-bench-dirs-") as tmp_name:
        tmp = Path(tmp_name)

        (tmp / "ck").mkdir()
        ck = Setup(tmp / "ck")
        try:
            touch_many(ck.p, [f"other_{i}.log" for i in range(args.entries)])
            for step in range(200):
                (ck.p / f"step_{step}.pt").write_bytes(b"x")
            rows.append(("checkpoint dir, 100k names", median_of(ck.scrape, args.repeat), 1.0))
        finally:
            ck.verifier.stop()
            shutil.rmtree(tmp / "ck", ignore_errors=True)

        state = tmp / "state"
        state.mkdir()
        touch_many(state, [f"junk_{i}.log" for i in range(args.entries)])
        put(state, own_heartbeat("big-dir-a"))
        put(state, own_heartbeat("big-dir-b"))
        with Exporter(state_dir=state) as exp:
            rows.append(("state dir, 100k names", median_of(exp.scrape, args.repeat), 1.0))
            touch_many(state, [f"x{i}-00000000.rank0.heartbeat.json" for i in range(10_001)])
            rows.append(("state dir, 10 001 heartbeat files: first", timed(exp.scrape), 10.0))
            again = statistics.median(timed(exp.scrape) for _ in range(args.repeat))
            rows.append(("state dir, 10 001 heartbeat files: again", again, 3.0))
        shutil.rmtree(state, ignore_errors=True)

        state = tmp / "sparse"
        state.mkdir()
        put(state, own_heartbeat("good"))
        with open(state / "huge-00000000.rank0.heartbeat.json", "wb") as f:
            f.truncate(1 << 30)
        with Exporter(state_dir=state) as exp:
            rows.append(("1 GiB sparse heartbeat", median_of(exp.scrape, args.repeat), 1.0))

    width = max(len(name) for name, _, _ in rows)
    print(f"{'case':<{width}}  {'seconds':>8}  target")
    for name, seconds, target in rows:
        verdict = "ok" if seconds < target else "OVER"
        print(f"{name:<{width}}  {seconds:8.3f}  < {target:g} s {verdict}")


if __name__ == "__main__":
    main()
