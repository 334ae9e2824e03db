"""The .window groups: evaluated every window_rules_interval, they hold only what may wait.

An alert evaluated every minute fires up to a minute later than at 15 s. That is fine for an
alert judged over minutes (a window or a ``for`` of 5 minutes or more) and wrong for a page
promised at once: a death, a stall, an OOM, an Xid, failing GPU memory, a damaged checkpoint,
memory left behind by a death. A record of a window group is as old as one interval when a
faster group reads it, so only window groups read them. promtool (2.42) evaluates every group at
its test file's ``evaluation_interval`` whatever the group's own: the cases of the window alerts
judge the shipped cadence only where that is the window groups' interval, so it must be.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from alerts import build, kinds, site
from helpers.paths import REPO

TEST_FILES = sorted((REPO / "alerts" / "tests").glob("*.yml"))
WINDOW_INTERVAL = str(site.resolve()["window_rules_interval"])

#: pages promised at once (the runbook: "within one scrape", "fires at once", a death or a stall)
PROMPT = {
    "TrainingProcessDied",
    "TrainingStalled",
    "TrainingNoFirstStep",
    "TrainingProcessTerminated",
    "TrainingProcessRestarted",
    "TrainingJobRankDied",
    "TrainingJobStalled",
    "TrainingLossNonFinite",
    "TrainingRestartLoop",
    "AllocatorOOM",
    "AllocatorOOMCaught",
    "GPUXidError",
    "GPUMemoryNotReleased",
    "GPUUncorrectableMemoryErrors",
    "GPURowRemapFailure",
    "GPURowRemapPending",
    "GPURetiredPagesPending",
    "CheckpointTruncated",
    "CheckpointHashMismatch",
    "CheckpointSavesFailing",
    "TrainguardExporterDown",
}
#: a judgement over this long may wait one more interval
MINUTES_S = 300
RANGE = re.compile(r"\[(\d+[smhdw])(?::\d+[smhdw])?\]")


def _seconds(duration: str) -> int:
    return kinds.parse_duration(duration)


def _groups() -> list[dict[str, Any]]:
    return list(yaml.safe_load(build.render())["groups"])


def _window_groups() -> list[dict[str, Any]]:
    return [g for g in _groups() if g["name"].endswith(".window")]


def test_window_groups_hold_only_alerts_judged_over_minutes() -> None:
    window = _window_groups()
    assert [g["interval"] for g in window] == [WINDOW_INTERVAL] * len(window) == ["1m"] * 4
    names = set()
    for group in window:
        for rule in group["rules"]:
            if "alert" not in rule:
                continue
            names.add(rule["alert"])
            longest = max(
                [_seconds(rule["for"]) if "for" in rule else 0]
                + [_seconds(r) for r in RANGE.findall(rule["expr"])]
            )
            assert longest >= MINUTES_S, f"{rule['alert']}: judged over less than 5 minutes"
    assert not names & PROMPT, f"prompt pages in a window group: {sorted(names & PROMPT)}"
    # each is named in the setting's documentation (the added latency is written there)
    doc = site.BY_NAME["window_rules_interval"].doc
    assert set(re.findall(r"\b(?:[A-Z]+[a-z]+){2,}\b", doc)) == names


def test_window_records_are_read_only_in_window_groups() -> None:
    groups = _groups()
    records = {r["record"] for g in _window_groups() for r in g["rules"] if "record" in r}
    assert "gpu:trainguard_gpu_memory_ghost_bytes:sum" in records
    assert "run_rank:trainguard_run_gpu_memory_ghost_bytes:sum" in records
    for group in groups:
        if group["name"].endswith(".window"):
            continue
        text = yaml.safe_dump(group["rules"], width=10**6)
        for record in records:
            assert not re.search(re.escape(record) + r"\b", text), (
                f"{group['name']} reads {record}, up to one window interval old"
            )


def test_promtool_cases_of_window_alerts_run_at_the_window_interval() -> None:
    window = {r["alert"] for g in _window_groups() for r in g["rules"] if "alert" in r}
    tested: set[str] = set()
    for path in TEST_FILES:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        cases = {
            case["alertname"]
            for test in doc["tests"]
            for case in test.get("alert_rule_test") or []
            if case["alertname"] in window
        }
        if cases:
            tested |= cases
            assert doc.get("evaluation_interval") == WINDOW_INTERVAL, (
                f"{Path(path).name}: cases of {sorted(cases)} at another cadence than shipped"
            )
    assert tested == window, f"window alerts with no promtool case: {sorted(window - tested)}"


def test_window_interval_is_a_site_setting() -> None:
    def intervals(config: dict[str, object]) -> set[str]:
        text = build.render(config)
        return {g["interval"] for g in yaml.safe_load(text)["groups"] if ".window" in g["name"]}

    assert intervals({}) == {"1m"}
    assert intervals({"window_rules_interval": "2m"}) == {"2m"}
    # never less often than the slow group, whose records some of them read
    assert intervals({"window_rules_interval": "3m", "slow_rules_interval": "2m"}) == {"2m"}
    assert "window_rules_interval: 1m" in build.render({})
    with pytest.raises(site.ThresholdError, match=r"ghost_window .* window_rules_interval"):
        build.render({"window_rules_interval": "3m"})  # GPUGhostMemory's 5m minimum
    with pytest.raises(site.ThresholdError, match="window_rules_interval"):
        build.render({"window_rules_interval": "soon"})
