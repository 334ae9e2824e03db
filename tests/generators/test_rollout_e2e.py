"""The exporter's pod is replaced under the Prometheus Operator, end to end: a real Prometheus
scrapes a real exporter through the relabelling of the shipped ServiceMonitor, with the labels
the Operator puts on a pod's target (``pod``, ``container``, ``endpoint``, ``service``); the
pod is replaced (a new exporter on a new address, a new ``pod`` name) and nothing a user sees
changes: each series continues under its own name and no alert fires for the old OOM of a
finished run (alerts/tests/rollout_test.yml has the rule cases)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers.exporter_proc import REPO, Exporter
from helpers.promstack import PROMETHEUS, Prometheus
from helpers.run_child import own_heartbeat, put
from trainguard.shared.heartbeat.record import AllocatorStats

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not PROMETHEUS, reason="needs the Debian package prometheus"),
]

SERVICEMONITOR = REPO / "deploy" / "kubernetes" / "servicemonitor.yaml"
NODE = "gpu-node-1"
#: how long an OOM stays news in this test (30m by default): the old pod is scraped longer
OOM_RECENT = "15s"
GIB = 1 << 30
CAMEL = {"sourceLabels": "source_labels", "targetLabel": "target_label"}


def shipped_relabelling(drop_pod_labels: bool = True) -> list[dict[str, Any]]:
    """The ServiceMonitor's relabelings as Prometheus reads them (the Operator appends them
    to its own relabelling of the target); without its labeldrop when ``drop_pod_labels`` is
    False."""
    doc = yaml.safe_load(SERVICEMONITOR.read_text(encoding="utf-8"))
    (endpoint,) = doc["spec"]["endpoints"]
    out = [{CAMEL.get(k, k): v for k, v in rule.items()} for rule in endpoint["relabelings"]]
    assert any(r["action"] == "labeldrop" for r in out), "the ServiceMonitor drops no label"
    return [r for r in out if drop_pod_labels or r["action"] != "labeldrop"]


def operator_target(exporter: Exporter, pod: str) -> list[dict[str, Any]]:
    """A file_sd target group with the labels the Operator's relabelling gives an endpoint of
    the exporter's Service (before the ServiceMonitor's own relabelings)."""
    return [
        {
            "targets": [f"127.0.0.1:{exporter.port}"],
            "labels": {
                "namespace": "monitoring",
                "service": "trainguard-exporter",
                "pod": pod,
                "container": "exporter",
                "endpoint": "metrics",
                "__meta_kubernetes_pod_node_name": NODE,
            },
        }
    ]


def write_targets(path: Path, groups: list[dict[str, Any]]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(groups), encoding="utf-8")
    tmp.replace(path)  # file_sd must never read half a file


def finished_run_that_caught_an_oom(state: Path) -> None:
    """A run that caught one OOM two hours into its life and then finished cleanly."""
    now = time.time()
    stats = AllocatorStats(
        device=0,
        allocated_bytes=10 * GIB,
        reserved_bytes=12 * GIB,
        max_allocated_bytes=14 * GIB,
        inactive_split_bytes=GIB,
        alloc_retries=3,
        ooms=1,
    )
    hb = own_heartbeat("llama-ft", state="finished", started=now - 7200, allocator=(stats,))
    put(state, hb)


def values(prom: Prometheus, expr: str) -> list[Any]:
    res = prom.query(expr)
    assert res.get("status") == "success", res
    return list(res["data"]["result"])


def scraping(prom: Prometheus, exporter: Exporter, timeout: float = 60) -> None:
    """Wait until Prometheus's only trainguard target is ``exporter`` and it is up."""
    deadline = time.monotonic() + timeout
    while True:
        active = prom.api("targets")["data"]["activeTargets"]
        urls = [(t["scrapeUrl"], t["health"]) for t in active if t["labels"]["job"] == "trainguard"]
        if urls == [(f"http://127.0.0.1:{exporter.port}/metrics", "up")]:
            return
        assert time.monotonic() < deadline, f"targets: {urls}"
        time.sleep(0.25)


@pytest.mark.parametrize("drop_pod_labels", [True, False], ids=["shipped", "without-labeldrop"])
def test_pod_replaced_changes_nothing_a_user_sees(tmp_path: Path, drop_pod_labels: bool) -> None:
    state = tmp_path / "state"
    state.mkdir()
    finished_run_that_caught_an_oom(state)
    rules = tmp_path / "trainguard.rules.yml"
    build = [sys.executable, str(REPO / "alerts" / "build.py"), "-o", str(rules)]
    build += ["--set", "slow_rules_interval=1s", "--set", f"oom_recent={OOM_RECENT}"]
    subprocess.run(build, check=True, capture_output=True)
    targets = tmp_path / "targets.yml"
    old = Exporter(state_dir=state)
    new: Exporter | None = None
    prom: Prometheus | None = None
    try:
        write_targets(targets, operator_target(old, "trainguard-exporter-7xk2p"))
        job = {
            "job_name": "serviceMonitor/monitoring/trainguard-exporter/0",
            "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "1s"}],
            "relabel_configs": shipped_relabelling(drop_pod_labels),
        }
        prom = Prometheus(tmp_path / "prom", [], rule_files=[rules], scrape_configs=[job])
        scraping(prom, old)
        # the old pod has been scraped for longer than an OOM stays news
        prom.wait_until(f"up{{job='trainguard'}} offset {OOM_RECENT} == 1", timeout=120)

        # the DaemonSet replaces the pod: a new exporter, a new address, a new pod name
        new = Exporter(state_dir=state)
        write_targets(targets, operator_target(new, "trainguard-exporter-q9d4m"))
        old.stop()
        scraping(prom, new)
        prom.wait_until("trainguard_run_allocator_ooms_total", timeout=60)
        prom.wait_evaluations(5)

        series = values(prom, "count_over_time(trainguard_run_allocator_ooms_total[5m])")
        firing = values(prom, 'ALERTS{alertname!="Watchdog"}')
        assert firing == [], "a rollout made alerts fire"
        if drop_pod_labels:
            # one series before and after: the data holds no trace of the rollout
            assert len(series) == 1, series
            assert "pod" not in series[0]["metric"]
            assert values(prom, '{__name__=~"trainguard_.+", pod!=""}') == []
        else:
            # the control: without the labeldrop the series start again under the new pod
            # name (and the rules above still judged them as one)
            assert sorted(s["metric"]["pod"] for s in series) == [
                "trainguard-exporter-7xk2p",
                "trainguard-exporter-q9d4m",
            ]
            assert {s["metric"]["instance"] for s in series} == {NODE}
    finally:
        if prom is not None:
            prom.stop()
        old.stop()
        if new is not None:
            new.stop()
