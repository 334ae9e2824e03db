"""Detection latency end to end: SIGKILL of a training process -> Alertmanager's webhook
delivers TrainingProcessDied, with real Prometheus, Alertmanager and the real exporter.

    python bench/bench_detection.py [--trials 8] [--scrape 1s] [--evaluation 1s] [--group-wait 1s]

Goal (issue 5): every trial within scrape interval + evaluation interval + group_wait.
Prometheus' own jitter (it spreads scrapes over the interval) and Alertmanager's dispatch
are inside the figure; nothing is subtracted.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO / "exporter")]

from helpers.e2e_stack import Stack  # noqa: E402
from trainguard.shared.units import parse_duration as seconds  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--trials", type=int, default=8)
    p.add_argument("--scrape", default="1s")
    p.add_argument("--evaluation", default="1s")
    p.add_argument("--group-wait", default="1s")
    args = p.parse_args()
    budget = seconds(args.scrape) + seconds(args.evaluation) + seconds(args.group_wait)
    latencies = []
    with tempfile.TemporaryDirectory() as d:
        stack = Stack(
            Path(d),
            scrape_interval=args.scrape,
            evaluation_interval=args.evaluation,
            group_wait=args.group_wait,
        )
        try:
            for trial in range(args.trials):
                name = f"bench-{trial}"
                child = stack.start_training(name)
                stack.prometheus.wait_until(f'trainguard_run_process_up{{run="{name}"}} == 1')
                # kill at a random phase of the scrape and evaluation cycles
                time.sleep((trial * 0.37) % seconds(args.scrape))
                killed = stack.kill(child)
                received, _ = stack.webhook.wait_for(
                    "TrainingProcessDied", timeout=budget * 10, run=name
                )
                latencies.append(received - killed)
                print(f"trial {trial}: {latencies[-1]:.2f} s", flush=True)
        finally:
            stack.close()
    scrape = seconds(args.scrape)
    print(
        f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.node()}, "
        f"Python {platform.python_version()}; scrape {args.scrape}, evaluation "
        f"{args.evaluation}, group_wait {args.group_wait}, group_interval 1s"
    )
    print("| trials | min s | median s | max s | max / scrape interval | budget s | all within |")
    print("|---|---|---|---|---|---|---|")
    print(
        f"| {len(latencies)} | {min(latencies):.2f} | {statistics.median(latencies):.2f} | "
        f"{max(latencies):.2f} | {max(latencies) / scrape:.2f}x | {budget:.0f} | "
        f"{'yes' if max(latencies) <= budget else 'NO'} |"
    )


if __name__ == "__main__":
    main()
