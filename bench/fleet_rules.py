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
"""

from __future__ import annotations

import json
import subprocess
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


def measure_rules(
    prom_exe: str, snapshot_dir: Path, workdir: Path, port: int, at: float, runs: int
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
        rules = rules_of(Path(__file__).resolve().parent.parent / "alerts" / "trainguard.rules.yml")
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
