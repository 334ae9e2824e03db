"""Fleet scale: a real Prometheus evaluating the shipped rules over N simulated 8-GPU nodes.

    python bench/bench_fleet.py --nodes 100 --minutes 3 [--nodes 100,250,1000]
                                [--history-hours 6] [--rule-cpu-runs 3]
                                [--nodes-per-job 8] [--json OUT]

Each node is the real exporter's page (bench/fleet_node.py: 8 GPUs of the test NVML library,
the 8 ranks of a data-parallel run with their allocators, a primary checkpoint location and a
mirror), captured once, then served in N relabelled, slowly changing copies by ONE Python HTTP
server process at ``/node/<i>/metrics``. Prometheus (the installed binary) finds the N targets
through file_sd, each with its own ``__metrics_path__`` and ``instance`` (``node-<i>:9636``),
and the target labels the rules keep (``cluster``, ``namespace``; ``job`` is ``trainguard``).
Every ``--nodes-per-job`` nodes share a run (a job), their ranks numbered globally.
Scrape and evaluation intervals are those of deploy/prometheus.yml (15 s); the rules are
alerts/trainguard.rules.yml as shipped.

Measured from Prometheus itself over the run, after the first minute (the head fills up):
each group's ``prometheus_rule_group_last_duration_seconds`` at every evaluation (median and
maximum, and the maximum as a share of the group's interval: the goal is under 10 % at 1000
nodes), the quantiles of ``prometheus_rule_evaluation_duration_seconds``, each rule's
``evaluationTime`` from /api/v1/rules (the costliest named), ``prometheus_tsdb_head_series``,
``process_resident_memory_bytes`` (maximum seen), Prometheus's CPU, missed group iterations,
and the firing alerts (a healthy fleet should fire only Watchdog).

The group durations are wall-clock: on a machine shared with other work they mostly measure
the wait for a CPU. So after the live session each rule's expression is also run on an idle
Prometheus serving a snapshot of the same data, and its CPU time is taken
(bench/fleet_rules.py, ``--rule-cpu-runs``; 0 skips it): the sum over a group is what the
group costs per evaluation, whatever else the machine does.

A run of minutes gives long ranges (``[6h]``, ``[1d]``) only minutes of samples;
``--history-hours H`` backfills H hours for every series the rules read over a range
(bench/fleet_history.py). Figures and how they were taken: bench/RESULTS.md, "Fleet scale".
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import fleet_history
import fleet_node
import fleet_rules
import psutil
from prometheus_client.parser import text_string_to_metric_families

REPO = fleet_node.REPO
sys.path[:0] = [str(REPO / "tests")]

from helpers.exporter_proc import free_port  # noqa: E402
from helpers.wait import wait_for  # noqa: E402

RULES = REPO / "alerts" / "trainguard.rules.yml"
INTERVAL = "15s"  # deploy/prometheus.yml: scrape_interval and evaluation_interval
WARMUP = 60.0  # seconds: evaluations before this are left out of the figures
POLL = 5.0  # seconds between reads of Prometheus's /metrics and /api/v1/rules
PRIME = 75.0  # seconds: the first session before a backfill (--history-hours)
STEP = 15  # seconds: INTERVAL


def prometheus_config(workdir: Path, nodes: int, port: int) -> Path:
    targets = [
        {
            "targets": [f"127.0.0.1:{port}"],
            "labels": {
                "__metrics_path__": f"/node/{i}/metrics",
                "instance": f"node-{i:04d}:9636",
                "cluster": "fleet",
                "namespace": "training",
            },
        }
        for i in range(nodes)
    ]
    (workdir / "targets.json").write_text(json.dumps(targets))
    config = {
        "global": {"scrape_interval": INTERVAL, "evaluation_interval": INTERVAL},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {
                "job_name": "trainguard",
                "scrape_interval": INTERVAL,
                "scrape_timeout": "10s",
                "file_sd_configs": [{"files": [str(workdir / "targets.json")]}],
            }
        ],
    }
    path = workdir / "prometheus.yml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


@contextmanager
def process(cmd: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def get(url: str, timeout: float = 30) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return bytes(r.read())


def query(base: str, expr: str) -> list[dict[str, Any]]:
    body = get(f"{base}/api/v1/query?query={urllib.parse.quote(expr)}")
    return list(json.loads(body)["data"]["result"])


def own_metrics(base: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    for family in text_string_to_metric_families(get(f"{base}/metrics").decode()):
        for s in family.samples:
            out[s.name].append((s.labels, s.value))
    return out


def one(metrics: dict[str, list[tuple[dict[str, str], float]]], name: str) -> float:
    (sample,) = metrics[name]
    return sample[1]


def short_group(name: str) -> str:
    """``/path/trainguard.rules.yml;trainguard-gpu`` -> ``trainguard-gpu``."""
    return name.rsplit(";", 1)[-1]


def run_fleet(
    capture: Path,
    nodes: int,
    nodes_per_job: int,
    minutes: float,
    history_hours: float = 0,
    rule_cpu_runs: int = 3,
    keep_snapshot: Path | None = None,
) -> dict[str, Any]:
    """One Prometheus over ``nodes`` simulated nodes for ``minutes``; the figures."""
    prom_exe, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if prom_exe is None or promtool is None:
        sys.exit("bench_fleet: prometheus and promtool must be on PATH")
    with tempfile.TemporaryDirectory(prefix=f"fleet{nodes}-") as tmp:
        work = Path(tmp)
        port, prom_port = free_port(), free_port()
        serve = [sys.executable, str(Path(fleet_node.__file__)), str(capture)]
        serve += [f"--nodes={nodes}", f"--nodes-per-job={nodes_per_job}", f"--port={port}"]
        config = prometheus_config(work, nodes, port)
        base = f"http://127.0.0.1:{prom_port}"
        prom = [
            prom_exe,
            f"--config.file={config}",
            f"--storage.tsdb.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
            "--log.level=warn",
            "--web.enable-admin-api",  # the snapshot for fleet_rules
        ]
        with process(serve, work / "server.log") as server:
            wait_for(
                lambda: get(f"http://127.0.0.1:{port}/node/0/metrics", timeout=5),
                120,
                what="the fleet server",
                ignore=OSError,
            )
            extra: dict[str, Any] = {}
            if history_hours:
                with process(prom, work / "prometheus-first.log"):
                    wait_for(
                        lambda: get(f"{base}/-/ready", 5), 120, what="Prometheus", ignore=OSError
                    )
                    first = time.time()
                    time.sleep(PRIME)  # the recording rules write their series
                    at = time.time()
                    series = fleet_history.snapshot(base, RULES, history_hours)
                t = time.monotonic()
                om = work / "history.om"
                steps_of = fleet_history.record_steps(RULES)
                samples = fleet_history.write_openmetrics(om, series, first - STEP, at, steps_of)
                fleet_history.backfill(promtool, work / "history.om", work / "data")
                (work / "history.om").unlink()
                extra = {
                    "history_hours": history_hours,
                    "history_series": len(series),
                    "history_samples": samples,
                    "history_build_s": time.monotonic() - t,
                }
                print(f"history: {len(series)} series, {samples} samples", flush=True)
            with process(prom, work / "prometheus.log") as proc:
                wait_for(lambda: get(f"{base}/-/ready", 5), 300, what="Prometheus", ignore=OSError)
                try:
                    result = {**measure(base, proc.pid, server.pid, nodes, minutes), **extra}
                except BaseException:
                    print((work / "prometheus.log").read_text()[-3000:], file=sys.stderr)
                    raise
                at = time.time() - 1
                snapshot = fleet_rules.take_snapshot(base) if rule_cpu_runs else ""
        # the fleet and its Prometheus are stopped: the quiet one has the CPUs we get to itself
        if rule_cpu_runs:
            snap = work / "data" / "snapshots" / snapshot
            if keep_snapshot is not None:  # for fleet_rules.py's own command line
                shutil.copytree(snap, keep_snapshot / f"nodes{nodes}")
                (keep_snapshot / f"nodes{nodes}" / "at.txt").write_text(f"{at:.3f}\n")
            result |= fleet_rules.measure_rules(
                prom_exe, snap, work, free_port(), at, rule_cpu_runs
            )
        return result


def measure(
    base: str, prom_pid: int, server_pid: int, nodes: int, minutes: float
) -> dict[str, Any]:
    start = time.monotonic()
    end = start + 60 * minutes
    prom, server = psutil.Process(prom_pid), psutil.Process(server_pid)
    group_evals: dict[str, dict[float, float]] = defaultdict(dict)  # group -> eval ts -> s
    intervals: dict[str, float] = {}
    rule_evals: dict[tuple[str, int, str], dict[str, float]] = defaultdict(dict)
    head: list[float] = []
    rss: list[float] = []
    cpu0: tuple[float, float, float] | None = None
    metrics: dict[str, list[tuple[dict[str, str], float]]] = {}
    while time.monotonic() < end:
        time.sleep(POLL)
        warm = time.monotonic() - start >= WARMUP
        if warm and cpu0 is None:
            cpu0 = (time.monotonic(), sum(prom.cpu_times()[:2]), sum(server.cpu_times()[:2]))
        metrics = own_metrics(base)
        stamps = {
            labels["rule_group"]: v
            for labels, v in metrics["prometheus_rule_group_last_evaluation_timestamp_seconds"]
        }
        for labels, v in metrics["prometheus_rule_group_interval_seconds"]:
            intervals[short_group(labels["rule_group"])] = v
        if not warm:
            continue
        for labels, v in metrics["prometheus_rule_group_last_duration_seconds"]:
            stamp = stamps.get(labels["rule_group"], 0.0)
            if stamp > 0:
                group_evals[short_group(labels["rule_group"])][stamp] = v
        head.append(one(metrics, "prometheus_tsdb_head_series"))
        rss.append(one(metrics, "process_resident_memory_bytes"))
        rules = json.loads(get(f"{base}/api/v1/rules"))["data"]["groups"]
        for group in rules:
            for k, rule in enumerate(group["rules"]):
                key = (group["name"], k, rule["name"])
                rule_evals[key][rule["lastEvaluation"]] = float(rule["evaluationTime"])
    assert cpu0 is not None, "the run is shorter than the warm-up"
    wall = time.monotonic() - cpu0[0]
    prom_cpu = (sum(prom.cpu_times()[:2]) - cpu0[1]) / wall
    server_cpu = (sum(server.cpu_times()[:2]) - cpu0[2]) / wall
    up = query(base, 'count(up{job="trainguard"} == 1)')
    scrape = query(base, 'avg(scrape_duration_seconds{job="trainguard"})')
    firing = query(base, 'count by (alertname) (ALERTS{alertstate="firing"})')
    groups = {}
    for name, group_values in sorted(group_evals.items()):
        values = list(group_values.values())
        groups[name] = {
            "interval_s": intervals[name],
            "evaluations": len(values),
            "median_s": statistics.median(values),
            "max_s": max(values),
            "max_share_of_interval": max(values) / intervals[name],
        }
    per_rule: list[dict[str, Any]] = []
    for (group, k, rule), rule_values in rule_evals.items():
        values = [v for stamp, v in rule_values.items() if not stamp.startswith("0001")]
        if values:
            per_rule.append(
                {
                    "group": group,
                    "index": k,
                    "rule": rule,
                    "median_s": statistics.median(values),
                    "max_s": max(values),
                    "evaluations": len(values),
                }
            )
    per_rule.sort(key=lambda r: -float(r["median_s"]))
    quantiles = {
        labels["quantile"]: v
        for labels, v in metrics["prometheus_rule_evaluation_duration_seconds"]
        if "quantile" in labels
    }
    missed = sum(v for _, v in metrics["prometheus_rule_group_iterations_missed_total"])
    failures = sum(v for _, v in metrics["prometheus_rule_evaluation_failures_total"])
    return {
        "nodes": nodes,
        "load_average_end": os.getloadavg(),
        "targets_up": float(up[0]["value"][1]) if up else 0.0,
        "avg_scrape_s": float(scrape[0]["value"][1]) if scrape else None,
        "head_series_max": max(head),
        "rss_bytes_max": max(rss),
        "prometheus_cpu_cores": prom_cpu,
        "server_cpu_cores": server_cpu,
        "groups": groups,
        "rule_evaluation_quantiles_s": quantiles,
        "iterations_missed": missed,
        "evaluation_failures": failures,
        "rules_top": per_rule[:12],
        "firing": {r["metric"]["alertname"]: float(r["value"][1]) for r in firing},
    }


def report(result: dict[str, Any]) -> None:
    n = result["nodes"]
    print(f"\n== {n} nodes ({n * fleet_node.GPUS} GPUs and ranks) ==")
    print(
        f"targets up {result['targets_up']:.0f}; avg scrape {result['avg_scrape_s'] or 0:.4f} s; "
        f"head series {result['head_series_max']:.0f}; "
        f"RSS {result['rss_bytes_max'] / 2**20:.0f} MiB; "
        f"Prometheus CPU {result['prometheus_cpu_cores']:.2f} cores "
        f"({result['prometheus_cpu_cores'] * STEP:.2f} CPU-s per {STEP} s cycle), "
        f"server {result['server_cpu_cores']:.2f}; missed iterations "
        f"{result['iterations_missed']:.0f}; rule evaluation failures "
        f"{result['evaluation_failures']:.0f}"
    )
    print("| group | interval s | evals | median ms | max ms | max / interval |")
    print("|---|---|---|---|---|---|")
    for name, g in result["groups"].items():
        print(
            f"| {name} | {g['interval_s']:.0f} | {g['evaluations']} | {1000 * g['median_s']:.1f}"
            f" | {1000 * g['max_s']:.1f} | {100 * g['max_share_of_interval']:.2f} % |"
        )
    print("costliest rules (median evaluationTime):")
    for r in result["rules_top"][:8]:
        print(
            f"  {1000 * r['median_s']:8.2f} ms (max {1000 * r['max_s']:.2f})"
            f"  {short_group(r['group'])}[{r['index']}] {r['rule']}"
        )
    q = result["rule_evaluation_quantiles_s"]
    print("rule evaluation quantiles (ms):", {k: round(1000 * v, 3) for k, v in q.items()})
    print("firing:", result["firing"])
    if "group_cpu" in result:
        print("CPU per evaluation on a quiet Prometheus (fleet_rules.py):")
        print("| group | interval s | CPU ms | CPU / interval |")
        print("|---|---|---|---|")
        for name, g in sorted(result["group_cpu"].items(), key=lambda kv: -kv[1]["cpu_s"]):
            print(
                f"| {name} | {g['interval_s']:.0f} | {1000 * g['cpu_s']:.1f}"
                f" | {100 * g['share_of_interval']:.2f} % |"
            )
        for r in sorted(result["rule_cpu"], key=lambda r: -r["cpu_s"])[:10]:
            print(
                f"  {1000 * r['cpu_s']:8.2f} ms CPU ({1000 * r['wall_s']:.2f} ms wall)"
                f"  {r['group']}[{r['index']}] {r['rule']}"
            )
    if "history_hours" in result:
        print(
            f"history: {result['history_hours']} h backfilled, {result['history_series']} series, "
            f"{result['history_samples']} samples, built in {result['history_build_s']:.0f} s"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="100", help="comma-separated fleet sizes")
    parser.add_argument("--minutes", type=float, default=3.0, help="Prometheus time per size")
    parser.add_argument("--nodes-per-job", type=int, default=8)
    parser.add_argument(
        "--history-hours",
        type=float,
        default=0,
        help="backfill this much history for the series rules read over long ranges "
        "(bench/fleet_history.py)",
    )
    parser.add_argument(
        "--rule-cpu-runs",
        type=int,
        default=3,
        help="queries per rule on the quiet Prometheus (bench/fleet_rules.py); 0: skip",
    )
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument(
        "--keep-snapshot",
        type=Path,
        help="copy each size's TSDB snapshot to DIR/nodes<N> (with at.txt), so that "
        "bench/fleet_rules.py can measure changed rules on it without a new fleet",
    )
    args = parser.parse_args()
    if args.minutes * 60 <= WARMUP + 2 * POLL:
        parser.error(f"--minutes must leave time after the {WARMUP:.0f} s warm-up")
    sizes = [int(n) for n in args.nodes.split(",")]
    # a SIGTERM unwinds like Ctrl-C, so that the server and Prometheus are stopped
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    print(
        f"machine: {platform.platform()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}; load average {os.getloadavg()}"
    )
    print(subprocess.run(["prometheus", "--version"], capture_output=True, text=True).stdout[:60])
    with tempfile.TemporaryDirectory(prefix="fleet-capture-") as tmp:
        page, pid_rank, capture_dir = fleet_node.capture(Path(tmp) / "node")
        capture = Path(tmp) / "capture.json"
        fleet_node.save_capture(capture, page, pid_rank, capture_dir)
        items, _ = fleet_node.parse(page, time.time())
        budget = fleet_node.page_summary(items)
        print("series per node:", budget)
        results = []
        for n in sizes:
            result = run_fleet(
                capture,
                n,
                args.nodes_per_job,
                args.minutes,
                args.history_hours,
                args.rule_cpu_runs,
                args.keep_snapshot,
            )
            result["series_per_node"] = budget
            report(result)
            results.append(result)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
