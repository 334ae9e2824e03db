"""CPU time of each shipped rule over bench/bench_fleet.py's fleet, measured without the noise of
a shared machine.

A rule group's ``last_duration`` is wall-clock: where other work holds the CPUs it mostly
measures the wait. CPU time does not. After the live session the bench takes a snapshot of
Prometheus's TSDB (the admin API: the backfilled blocks and the head, recorded series
included), stops the fleet and that Prometheus, and starts a second one on the snapshot that
neither scrapes nor evaluates rules, so that it spends nothing on its own. Each rule's
expression is then queried at the snapshot's last evaluation time (``--rule-cpu-runs`` times
and until 0.2 s of CPU, after one unmeasured run), and the CPU seconds the process used (all
its threads: the evaluation and the garbage collection it causes) divided by the runs is the
rule's cost; the sum over a group is the group's cost per evaluation. The evaluation of one
rule is one goroutine, so on a machine with a free core a group takes about that long.

Run on its own, it measures a rules file (changed ones too) on a snapshot that
``bench_fleet.py --keep-snapshot DIR`` kept, without a new fleet::

    python bench/fleet_rules.py DIR/nodes100 [--rules FILE] [--groups a,b] [--runs 3]

The snapshot is copied first (Prometheus writes to its data directory). A series that a
changed rules file records anew is not in that snapshot: rules reading it find nothing and
look cheaper than they are, so the full bench is the figure to report.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import yaml


def take_snapshot(base: str) -> str:
    """Snapshot the TSDB of the Prometheus at ``base`` (started with --web.enable-admin-api)."""
    req = urllib.request.Request(f"{base}/api/v1/admin/tsdb/snapshot", method="POST")
    with urllib.request.urlopen(req, timeout=600) as r:
        return str(json.loads(r.read())["data"]["name"])


def rules_of(path: Path) -> list[dict[str, Any]]:
    """Every rule of the rules file: group, interval, index in its group, name, expression."""
    doc = yaml.safe_load(path.read_text())
    out = []
    for group in doc["groups"]:
        interval = group.get("interval", "15s")
        seconds = int(interval[:-1]) * {"s": 1, "m": 60, "h": 3600}[interval[-1]]
        for k, rule in enumerate(group["rules"]):
            name = rule.get("record") or rule["alert"]
            out.append(
                {"group": group["name"], "interval_s": seconds, "index": k, "rule": name,
                 "expr": rule["expr"]}
            )  # fmt: skip
    return out


def _query(base: str, expr: str, at: float) -> int:
    """Run ``expr`` at ``at``; the number of samples it returned (failing on an error)."""
    url = f"{base}/api/v1/query?query={urllib.parse.quote(expr)}&time={at:.3f}"
    with urllib.request.urlopen(url, timeout=600) as r:
        body = json.loads(r.read())
    if body.get("status") != "success":
        raise RuntimeError(f"query failed: {body}")
    return len(body["data"]["result"])


RULES = Path(__file__).resolve().parent.parent / "alerts" / "trainguard.rules.yml"


def measure_rules(
    prom_exe: str,
    snapshot_dir: Path,
    workdir: Path,
    port: int,
    at: float,
    runs: int,
    rules_path: Path = RULES,
    groups_only: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """Each rule's CPU seconds per evaluation on a quiet Prometheus serving ``snapshot_dir``."""
    config = workdir / "quiet.yml"
    config.write_text("global: {}\n")
    cmd = [
        prom_exe,
        f"--config.file={config}",
        f"--storage.tsdb.path={snapshot_dir}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--storage.tsdb.retention.time=100y",
        "--log.level=warn",
    ]
    base = f"http://127.0.0.1:{port}"
    with (workdir / "quiet.log").open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                with urllib.request.urlopen(f"{base}/-/ready", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("the quiet Prometheus never became ready")
            time.sleep(0.5)
        me = psutil.Process(proc.pid)
        rules = [r for r in rules_of(rules_path) if not groups_only or r["group"] in groups_only]
        per_rule = []
        for rule in rules:
            results = _query(base, rule["expr"], at)  # unmeasured: pages the data in
            cpu0, wall0 = sum(me.cpu_times()[:2]), time.perf_counter()
            done = 0
            # at least ``runs``, and enough for 0.2 s of CPU (the kernel counts in 10 ms ticks)
            while done < runs or (sum(me.cpu_times()[:2]) - cpu0 < 0.2 and done < 50):
                _query(base, rule["expr"], at)
                done += 1
            cpu = (sum(me.cpu_times()[:2]) - cpu0) / done
            wall = (time.perf_counter() - wall0) / done
            entry = {k: v for k, v in rule.items() if k != "expr"}
            per_rule.append({**entry, "cpu_s": cpu, "wall_s": wall, "results": results})
        groups: dict[str, dict[str, float]] = {}
        for r in per_rule:
            g = groups.setdefault(r["group"], {"interval_s": r["interval_s"], "cpu_s": 0.0})
            g["cpu_s"] += r["cpu_s"]
        for g in groups.values():
            g["share_of_interval"] = g["cpu_s"] / g["interval_s"]
        return {"rule_cpu_runs": runs, "rule_cpu": per_rule, "group_cpu": groups}
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    """Measure a rules file on a kept snapshot; print groups and the costliest rules."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("snapshot", type=Path, help="a directory bench_fleet.py kept")
    parser.add_argument("--rules", type=Path, default=RULES)
    parser.add_argument("--groups", default="", help="comma-separated group names (all)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    prom_exe = shutil.which("prometheus")
    if prom_exe is None:
        sys.exit("fleet_rules: prometheus must be on PATH")
    at = float((args.snapshot / "at.txt").read_text())
    groups = frozenset(g for g in args.groups.split(",") if g)
    with tempfile.TemporaryDirectory(prefix="fleet-rules-") as tmp:
        work = Path(tmp)
        data = work / "data"
        shutil.copytree(args.snapshot, data, ignore=shutil.ignore_patterns("at.txt"))
        result = measure_rules(
            prom_exe, data, work, _free_port(), at, args.runs, args.rules, groups
        )
    print("| group | interval s | CPU ms | CPU / interval | x10 |")
    print("|---|---|---|---|---|")
    for name, g in sorted(result["group_cpu"].items(), key=lambda kv: -kv[1]["cpu_s"]):
        share = 100 * g["share_of_interval"]
        print(f"| {name} | {g['interval_s']:.0f} | {1000 * g['cpu_s']:.1f} | {share:.2f} % "
              f"| {10 * share:.1f} % |")  # fmt: skip
    for r in sorted(result["rule_cpu"], key=lambda r: -r["cpu_s"])[: args.top]:
        print(f"  {1000 * r['cpu_s']:8.2f} ms  {r['group']}[{r['index']}] {r['rule']}"
              f"  ({r['results']} results)")  # fmt: skip


if __name__ == "__main__":
    main()
