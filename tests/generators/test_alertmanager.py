"""deploy/alertmanager.yml and its notification template, by Alertmanager's own tools: amtool
renders deploy/trainguard.tmpl, and a real Alertmanager running the shipped configuration (its
receivers pointed at 127.0.0.1) applies the shipped inhibitions and posts the rendered text."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers.paths import REPO
from helpers.promstack import ALERTMANAGER, Alertmanager, Webhook
from helpers.wait import wait_for

ROOT = REPO
DEPLOY = ROOT / "deploy"
TEMPLATE = DEPLOY / "trainguard.tmpl"
AMTOOL = shutil.which("amtool")
needs_amtool = pytest.mark.skipif(
    AMTOOL is None, reason="amtool not installed (Debian: apt-get install prometheus-alertmanager)"
)
needs_alertmanager = pytest.mark.skipif(
    ALERTMANAGER is None, reason="needs the Debian package prometheus-alertmanager"
)

TEXT = '{{ template "trainguard.title" . }}\n---\n{{ template "trainguard.text" . }}'

RENDERED = """\
[FIRING:4] AllocatorOOM
---
CRITICAL AllocatorOOM: Run llama rank 3 hit CUDA out of memory.
Run: llama, rank 3
Host: gpu-node-1 (exporter node-1:9636) (cluster a, namespace train)
Step: 1812; newest complete checkpoint: step 1750; steps at risk: 62
Run llama rank 3 on gpu-node-1 recorded a CUDA out-of-memory in the last 30m and has not \
stepped in the last 5m, or its process is gone.
Runbook: http://node-1:9636/runbook#allocatoroom

CRITICAL GPUXidError: GPU 1 on node-2:9636 reported critical Xid 79.
Host: node-2:9636, GPU 1
GPU 1 fell off the bus.
Runbook: http://node-2:9636/runbook#gpuxiderror

CRITICAL TrainingJobRankDied: A rank of job 8812 (run llama) died.
Run: llama
Host: gpu-node-4
Step: 1812; newest complete checkpoint: step 1750; steps at risk: 62
Rank 12 on gpu-node-4 died first (cause: oom_killer).
Runbook: http://node-1:9636/runbook#trainingjobrankdied

CRITICAL TrainingLossNonFinite: The loss of training run llama on gpu-node-1 is NaN or infinite.
Run: llama
Host: gpu-node-1 (exporter node-1:9636)
Step: 1812; newest complete checkpoint saved with a finite loss: step 1500; steps at risk: 312
Run llama has reported a NaN loss.
Runbook: http://node-1:9636/runbook#traininglossnonfinite

RESOLVED TrainingStalled run llama on node-1:9636
"""


@needs_amtool
def test_notification_template_renders_what_on_call_needs() -> None:
    # a run's alert: run, rank, host (the processes' own name, with the exporter's address;
    # without the annotation, the address alone), step, newest complete checkpoint, steps at
    # risk, runbook;
    # a GPU's alert: host and GPU, no run lines; a resolved one in a line
    assert AMTOOL is not None
    result = subprocess.run(
        [
            AMTOOL,
            "template",
            "render",
            f"--template.glob={TEMPLATE}",
            f"--template.text={TEXT}",
            f"--template.data={ROOT / 'tests' / 'data' / 'alertmanager_notification.json'}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip("\n") == RENDERED.rstrip("\n")


def _alert(name: str, severity: str, instance: str, **labels: str) -> dict[str, Any]:
    return {
        "labels": {
            "alertname": name,
            "severity": severity,
            "job": "trainguard",
            "instance": instance,
            "run": "llama",
            **labels,
        },
        "annotations": {
            "summary": f"{name} of run llama on {instance}.",
            "description": f"{name} on {instance}.",
            "runbook_url": f"http://{instance}/runbook#{name.lower()}",
            "step": "1812",
            "checkpoint_step": "1750",
            "steps_at_risk": "62",
        },
    }


def _post(am: Alertmanager, alerts: list[dict[str, Any]]) -> None:
    """Send ``alerts`` to Alertmanager's API, as Prometheus does."""
    request = urllib.request.Request(
        am.url + "/api/v2/alerts",
        data=json.dumps(alerts).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200


def _no_instance(alert: dict[str, Any]) -> dict[str, Any]:
    """An alert about a run across its nodes (no ``instance`` label)."""
    del alert["labels"]["instance"]
    return alert


def _shipped_config(hook: Webhook, chat: Webhook) -> dict[str, Any]:
    """deploy/alertmanager.yml as shipped, its placeholder URLs on 127.0.0.1 and its waits
    short."""
    config = yaml.safe_load((DEPLOY / "alertmanager.yml").read_text(encoding="utf-8"))
    config["templates"] = [str(TEMPLATE)]
    for receiver in config["receivers"]:
        for webhook in receiver.get("webhook_configs", []):
            webhook["url"] = hook.url
        for slack in receiver.get("slack_configs", []):
            slack["api_url"] = chat.url
    for route in [config["route"], *config["route"]["routes"]]:
        route["group_wait"] = route["group_interval"] = "1s"
    return config


@needs_alertmanager
def test_shipped_config_inhibits_on_the_same_host_only_and_posts_the_template(
    tmp_path: Path,
) -> None:
    hook, chat = Webhook(), Webhook()
    am = Alertmanager(tmp_path / "am", hook.url, config=_shipped_config(hook, chat))
    try:
        alerts = [
            _alert("TrainingProcessDied", "critical", "node-1:9636"),
            _alert("TrainingStalled", "warning", "node-1:9636"),  # the dead run: inhibited
            _alert("TrainingStalled", "warning", "node-2:9636"),  # same run name, other host
            # its exporter down since: the death it last saw is not hidden, the rest is
            _alert("TrainguardExporterDown", "critical", "node-1:9636"),
            _alert("GPUXidError", "critical", "node-1:9636"),
        ]
        _post(am, alerts)
        seen: list[Any] = []

        def applied() -> dict[tuple[str, str], bool] | None:
            with urllib.request.urlopen(am.url + "/api/v2/alerts", timeout=30) as response:
                seen[:] = json.loads(response.read())
            inhibited = {
                (a["labels"]["alertname"], a["labels"]["instance"]): bool(
                    a["status"]["inhibitedBy"]
                )
                for a in seen
            }
            ok = len(inhibited) == 5 and inhibited[("GPUXidError", "node-1:9636")]
            return inhibited if ok else None

        # polling Alertmanager's API, not waiting out a duration
        inhibited = wait_for(applied, 60, 0.1, lambda: f"the inhibition applied: {seen}")
        assert inhibited == {
            ("TrainingProcessDied", "node-1:9636"): False,
            ("TrainingStalled", "node-1:9636"): True,
            ("TrainingStalled", "node-2:9636"): False,
            ("TrainguardExporterDown", "node-1:9636"): False,
            ("GPUXidError", "node-1:9636"): True,
        }
        # the chat receiver got the death rendered by deploy/trainguard.tmpl
        message = chat.wait_message(
            lambda m: "TrainingProcessDied" in json.dumps(m), 60, "the chat notification"
        )
        (attachment,) = message["attachments"]
        assert attachment["title"] == "[FIRING:1] TrainingProcessDied run llama on node-1:9636"
        assert attachment["text"] == (
            "CRITICAL TrainingProcessDied: TrainingProcessDied of run llama on node-1:9636.\n"
            "Run: llama\n"
            "Host: node-1:9636\n"
            "Step: 1812; newest complete checkpoint: step 1750; steps at risk: 62\n"
            "TrainingProcessDied on node-1:9636.\n"
            "Runbook: http://node-1:9636/runbook#trainingprocessdied"
        )
        # the machine receiver got the same alert as JSON
        delivered = hook.wait_message(
            lambda m: m.get("groupLabels", {}).get("alertname") == "TrainingProcessDied",
            60,
            "the webhook notification",
        )
        assert delivered["alerts"][0]["annotations"]["steps_at_risk"] == "62"
    finally:
        am.stop()
        hook.close()
        chat.close()


@needs_alertmanager
def test_shipped_config_groups_and_inhibits_by_the_job_and_keeps_clusters_apart(
    tmp_path: Path,
) -> None:
    # one job's page for all its nodes; the same run name and job id in another cluster is
    # another job: its own notification, and nothing of it inhibited. A job's stall is part of
    # its death's page; another job's stall is its own, and hides TrainingRankStuck of its job.
    hook, chat = Webhook(), Webhook()
    am = Alertmanager(tmp_path / "am", hook.url, config=_shipped_config(hook, chat))

    def job_alert(
        name: str, severity: str, cluster: str, job_id: str = "j1", **labels: str
    ) -> dict[str, Any]:
        alert = _alert(name, severity, "-", cluster=cluster, job_id=job_id, **labels)
        del alert["labels"]["instance"]
        return alert

    try:
        alerts = [
            job_alert("TrainingJobRankDied", "critical", "a"),
            job_alert("TrainingJobRankDied", "critical", "b"),
            # a node's alert of the dead job (job-aware: it carries job_id): part of the page
            _alert("TrainingStalled", "warning", "node-2:9636", cluster="a", job_id="j1"),
            # another job of the same run name in the same cluster, and a lone process's alert
            _alert("TrainingStalled", "warning", "node-3:9636", cluster="a", job_id="j2"),
            _alert("TrainingStalled", "warning", "node-4:9636", cluster="a"),
            # the dead job's stall: part of its page; another job's stall: its own page
            job_alert("TrainingJobStalled", "warning", "a"),
            job_alert("TrainingJobStalled", "warning", "a", job_id="j2"),
            # where the stalled job is stuck: said by its job's stall; another job of the run
            # (j3) is stuck on its own; in cluster c, no stall
            _no_instance(_alert("TrainingRankStuck", "warning", "-", cluster="a", job_id="j2")),
            _no_instance(_alert("TrainingRankStuck", "warning", "-", cluster="a", job_id="j3")),
            _no_instance(_alert("TrainingRankStuck", "warning", "-", cluster="c", job_id="j2")),
            # the dead job restarted while its page is held: news, not part of the page
            job_alert("TrainingJobRestarted", "warning", "a"),
        ]
        _post(am, alerts)
        seen: list[Any] = []

        def key(a: dict[str, Any]) -> tuple[str, str, str, str]:
            lbl = a["labels"]
            return (
                lbl["alertname"],
                lbl["cluster"],
                lbl.get("instance", ""),
                lbl.get("job_id", ""),
            )

        def applied() -> dict[tuple[str, str, str, str], bool] | None:
            with urllib.request.urlopen(am.url + "/api/v2/alerts", timeout=30) as response:
                seen[:] = json.loads(response.read())
            inhibited = {key(a): bool(a["status"]["inhibitedBy"]) for a in seen}
            ok = len(inhibited) == 11 and all(
                inhibited[k]
                for k in (
                    ("TrainingStalled", "a", "node-2:9636", "j1"),
                    ("TrainingJobStalled", "a", "", "j1"),
                    ("TrainingRankStuck", "a", "", "j2"),
                )
            )
            return inhibited if ok else None

        inhibited = wait_for(applied, 60, 0.1, lambda: f"the inhibition applied: {seen}")
        assert inhibited == {
            ("TrainingJobRankDied", "a", "", "j1"): False,
            ("TrainingJobRankDied", "b", "", "j1"): False,
            ("TrainingStalled", "a", "node-2:9636", "j1"): True,
            ("TrainingStalled", "a", "node-3:9636", "j2"): False,
            ("TrainingStalled", "a", "node-4:9636", ""): False,
            ("TrainingJobStalled", "a", "", "j1"): True,
            ("TrainingJobStalled", "a", "", "j2"): False,
            ("TrainingRankStuck", "a", "", "j2"): True,
            ("TrainingRankStuck", "a", "", "j3"): False,
            ("TrainingRankStuck", "c", "", "j2"): False,
            ("TrainingJobRestarted", "a", "", "j1"): False,
        }
        # one notification per job: cluster a's and cluster b's, each of one alert
        for cluster in ("a", "b"):
            message = hook.wait_message(
                lambda m, c=cluster: (
                    m.get("groupLabels", {}).get("alertname") == "TrainingJobRankDied"
                    and m["groupLabels"].get("cluster") == c
                ),
                60,
                f"cluster {cluster}'s job page",
            )
            assert message["groupLabels"]["job_id"] == "j1"
            assert len(message["alerts"]) == 1
        # the other job's stall: one notification of its own, for that job alone
        message = hook.wait_message(
            lambda m: (
                m.get("groupLabels", {}).get("alertname") == "TrainingJobStalled"
                and m["groupLabels"].get("job_id") == "j2"
            ),
            60,
            "job j2's stall page",
        )
        assert [a["labels"]["job_id"] for a in message["alerts"]] == ["j2"]
    finally:
        am.stop()
        hook.close()
        chat.close()


@needs_alertmanager
def test_shipped_config_notifies_a_nan_loss_every_node_sees_once_per_run(tmp_path: Path) -> None:
    # DDP spreads a NaN to every rank: each node's exporter fires TrainingLossNonFinite for the
    # run; one notification lists the nodes, not one per node (issue 40's "one incident")
    hook, chat = Webhook(), Webhook()
    am = Alertmanager(tmp_path / "am", hook.url, config=_shipped_config(hook, chat))
    try:
        alerts = [
            _alert("TrainingLossNonFinite", "critical", f"node-{n}:9636") for n in range(1, 4)
        ]
        _post(am, alerts)
        message = hook.wait_message(
            lambda m: m.get("groupLabels", {}).get("alertname") == "TrainingLossNonFinite",
            60,
            "the NaN notification",
        )
        assert message["groupLabels"] == {"alertname": "TrainingLossNonFinite", "run": "llama"}
        assert sorted(a["labels"]["instance"] for a in message["alerts"]) == [
            "node-1:9636",
            "node-2:9636",
            "node-3:9636",
        ]
    finally:
        am.stop()
        hook.close()
        chat.close()


@needs_alertmanager
def test_shipped_config_keeps_each_death_of_a_run_in_a_group_of_its_own(tmp_path: Path) -> None:
    # a relaunched run that dies again: the new death must not share a group with the previous
    # one (resolving while the new one fires), which re-notified the group at group_interval
    hook, chat = Webhook(), Webhook()
    am = Alertmanager(tmp_path / "am", hook.url, config=_shipped_config(hook, chat))
    try:
        alerts = [
            _alert("TrainingProcessDied", "critical", "node-1:9636", death="1"),
            _alert("TrainingProcessDied", "critical", "node-1:9636", death="2"),
        ]
        _post(am, alerts)

        def groups() -> list[Any] | None:
            with urllib.request.urlopen(am.url + "/api/v2/alerts/groups", timeout=30) as r:
                found = [
                    g
                    for g in json.loads(r.read())
                    if g["labels"].get("alertname") == "TrainingProcessDied"
                ]
            return found if sum(len(g["alerts"]) for g in found) == 2 else None

        found = wait_for(groups, 60, 0.1, "both deaths grouped")
        assert sorted(g["labels"]["death"] for g in found) == ["1", "2"]
    finally:
        am.stop()
        hook.close()
        chat.close()
