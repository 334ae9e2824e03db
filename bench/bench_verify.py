"""``trainguard verify --hash`` against ``sha256sum`` on the same file, in one run: the
command as a user runs it (a new Python process, imports, listing, verdict, hashing, the
``latest()`` choice) vs the plain tool. Interleaved, each repeat in a fresh order, the file
read once before timing so both hash from the page cache; median of ``--repeat`` runs.

    python bench/bench_verify.py [--size-mib 1024] [--repeat 3] [--dir DIR]

Prints a Markdown section to paste into bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "exporter"))

from trainguard import checkpoint  # noqa: E402


def timed(cmd: list[str], env: dict[str, str], ok: tuple[int, ...] = (0,)) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    took = time.perf_counter() - t0
    if r.returncode not in ok:
        raise SystemExit(f"{cmd}: exit {r.returncode}: {r.stderr.decode()}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None)
    args = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=str(REPO / "exporter"))
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        d = Path(tmp)
        path = d / "step_1.pt"
        chunk = os.urandom(1 << 20)

        def write(fh: object) -> None:
            for _ in range(args.size_mib):
                fh.write(chunk)  # type: ignore[attr-defined]

        checkpoint.save(write, path)
        subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)  # warm cache
        contenders = {
            "trainguard verify --hash": [
                sys.executable, "-m", "trainguard.exporter.terminal", "verify", str(d),
                "--hash", "--grace=0",
            ],
            "sha256sum": ["sha256sum", str(path)],
        }  # fmt: skip
        times: dict[str, list[float]] = {k: [] for k in contenders}
        for _ in range(args.repeat):
            order = list(contenders)
            random.shuffle(order)
            for name in order:
                times[name].append(timed(contenders[name], env))
    size = args.size_mib * (1 << 20)
    med = {k: statistics.median(v) for k, v in times.items()}
    rate = {k: size / v / (1 << 20) for k, v in med.items()}
    ours, theirs = rate["trainguard verify --hash"], rate["sha256sum"]
    load = os.getloadavg()[0]
    print("## trainguard verify --hash\n")
    print(
        f"- machine: {platform.system()} {platform.release()}, {platform.processor() or '?'}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}; load average {load:.1f} "
        "at the end of the run"
    )
    print(
        f"- command: `python bench/bench_verify.py --size-mib {args.size_mib} "
        f"--repeat {args.repeat}`"
    )
    print(f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC\n")
    print("| contender | median s | MiB/s | all runs s |")
    print("|---|---|---|---|")
    for k in contenders:
        runs = ", ".join(f"{t:.2f}" for t in times[k])
        print(f"| `{k}` | {med[k]:.2f} | {rate[k]:.0f} | {runs} |")
    print(f"\nratio ours / sha256sum: {ours / theirs:.2f}")


if __name__ == "__main__":
    main()
