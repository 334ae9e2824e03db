"""Goodput's verdict does not depend on how often its groups are evaluated.

The slow group sums blocks of ``slow_rules_interval``; a ruler that evaluates it at another
cadence (promtool evaluates every group at its ``evaluation_interval``; a Thanos or Mimir ruler
may use its own; an evaluation may be missed) must reach the same TrainingGoodputLow verdict.
The same series are run through the shipped rules at 5m (the group's own interval), 2m and 1m:
a healthy job that spends 8 minutes loading before its first step (start-up is not lost
goodput), a job hung before its first step (TrainingNoFirstStep's, not a goodput page too), and
a job that died and restarted (low goodput, paged at every cadence).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.promtool_alerts import PROMTOOL, firing

MINUTES = 180
CHECKS = (50, 65, 75, 100, 130, 150, 175)


def _rank(run: str, node: str, rank: int, **values: str) -> list[dict[str, str]]:
    labels = f'job="trainguard",instance="{node}:9636",run="{run}",rank="{rank}"'
    return [
        {"series": f"trainguard_run_{name}{{{labels}}}", "values": v} for name, v in values.items()
    ]


def _job(
    run: str, node: str, deaths: str, last_death_step: str | None = None
) -> list[dict[str, str]]:
    labels = f'job="trainguard",instance="{node}:9636",run="{run}"'
    out = [{"series": f"trainguard_run_deaths_total{{{labels}}}", "values": deaths}]
    if last_death_step is not None:
        out.append(
            {"series": f"trainguard_run_last_death_step{{{labels}}}", "values": last_death_step}
        )
    return out


def scenario() -> list[dict[str, str]]:
    n = MINUTES
    series = []
    # loader: 8 minutes loading its checkpoint (no step yet), then a step a second
    series += _rank(
        "loader",
        "node-a",
        0,
        process_up=f"1x{n}",
        finished=f"0x{n}",
        heartbeat_age_seconds=f"1x{n}",
        step=f"_x8 0+60x{n - 8}",
        step_age_seconds=f"_x8 5x{n - 8}",
    )
    series += _job("loader", "node-a", f"0x{n}")
    # hung: up and heartbeating, never a first step
    series += _rank(
        "hung",
        "node-b",
        0,
        process_up=f"1x{n}",
        finished=f"0x{n}",
        heartbeat_age_seconds=f"1x{n}",
    )
    series += _job("hung", "node-b", f"0x{n}")
    # crashy: dies at 60m at step 3540 (checkpoint 3000), restarted at 80m, first step at 85m
    for node, rank in (("node-c", 0), ("node-d", 1)):
        series += _rank(
            "crashy",
            node,
            rank,
            process_up=f"1x59 0x19 1x{n - 79}",
            finished=f"0x{n}",
            step=f"0+60x59 3540x19 stale _x3 3000+60x{n - 85}",
            step_age_seconds=f"5x59 65+60x19 stale _x3 5x{n - 85}",
            heartbeat_age_seconds=f"1x59 61+60x19 1x{n - 79}",
        )
        series += _job("crashy", node, f"0x79 1x{n - 79}", f"_x79 3540x{n - 79}")
    return series


def verdicts(tmp_path: Path, cadence: str) -> dict[int, set[str]]:
    work = tmp_path / cadence
    work.mkdir()
    got = firing(
        scenario(),
        [("TrainingGoodputLow", t) for t in CHECKS],
        work,
        evaluation_interval=cadence,
    )
    return {t: {labels["run"] for labels, _ in got[("TrainingGoodputLow", t)]} for t in CHECKS}


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not on PATH")
def test_goodput_verdict_is_the_same_at_every_cadence(tmp_path: Path) -> None:
    at = {cadence: verdicts(tmp_path, cadence) for cadence in ("5m", "2m", "1m")}
    for cadence, got in at.items():
        # start-up and a hang before the first step are never lost goodput
        assert all(not ({"loader", "hung"} & runs) for runs in got.values()), (cadence, got)
        # a job that died and restarted is paged once it has been accounted for an hour
        assert "crashy" in got[130] and "crashy" in got[175], (cadence, got)
    assert at["2m"] == at["5m"] and at["1m"] == at["5m"], at
