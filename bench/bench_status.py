"""``trainguard status`` end to end over one run whose ``output_dir`` holds 1,172 Hugging Face
``checkpoint-N`` directories nobody recorded (built as bench/bench_hf_latest.py builds them:
seven files each, a ~250 KB ``trainer_state.json``), the terminal command as a user types it.

    PYTHONPATH=exporter python bench/bench_status.py [--steps 1172] [--repeat 3] [--alive]
        [--sample DURATION] [--profile FILE]

The run's heartbeat is written by a real ``trainguard.Run`` announcing the directory with the
Trainer's pattern: finished (``status`` reads once), or with ``--alive`` held open by a child
process (``status`` reads the heartbeats twice, ``--sample`` apart, the command's default 2 s
unless ``--sample`` is given here). Each repeat is a new ``trainguard status`` process: its
wall and CPU time (user + system, from the kernel), the page cache warm after the build.
``--profile`` writes a cProfile of one more call to FILE.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from bench_hf_latest import build

from helpers.hf_holder import hold

PATTERN = "checkpoint-{step}"


def status(state: Path, *extra: str) -> tuple[float, float, str]:
    """(wall s, CPU s, output) of one ``trainguard status`` process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainguard.exporter.terminal",
            "status",
            f"--state.dir={state}",
            *extra,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    wall = time.perf_counter() - wall
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1172)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--alive", action="store_true", help="the run alive (status reads twice)")
    ap.add_argument("--sample", default=None, help="status --sample (default: the command's, 2s)")
    ap.add_argument("--profile", type=Path, help="write a cProfile of one more call here")
    opts = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out, state = Path(tmp) / "out", Path(tmp) / "state"
        out.mkdir()
        t0 = time.perf_counter()
        build(out, opts.steps)
        print(f"built {opts.steps} checkpoint dirs in {time.perf_counter() - t0:.1f} s")
        mode = "alive" if opts.alive else "finished"
        holder = hold(out, state, opts.steps * 50, mode, "bench")
        try:
            if opts.alive:
                assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
            else:
                assert holder.wait() == 0
            extra = (f"--sample={opts.sample}",) if opts.sample is not None else ()
            print(f"load average {os.getloadavg()[0]:.1f}")
            for i in range(opts.repeat):
                wall, cpu, text = status(state, *extra)
                row = next((ln for ln in text.splitlines() if ln.startswith("bench")), "?")
                print(f"status #{i + 1}: {wall:.2f} s wall, {cpu:.2f} s CPU | {row.strip()}")
            if opts.profile:
                cmd = [sys.executable, "-m", "cProfile", "-o", str(opts.profile)]
                cmd += ["-m", "trainguard.exporter.terminal", "status", f"--state.dir={state}"]
                subprocess.run([*cmd, *extra], capture_output=True, check=True)
                print(f"profile: {opts.profile}")
        finally:
            holder.kill()
            holder.wait()


if __name__ == "__main__":
    main()
