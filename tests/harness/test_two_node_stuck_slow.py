"""A stuck rank and a slow rank of a job over two "nodes", for real, then paged over simulated time.

One job (two torchrun agents, ``--nnodes=2 --nproc-per-node=2``, each node with its own state
directory and exporter, helpers/two_nodes.py) serves both tests: global rank 1 computes about
ten times longer per step than the others, then, on the test's signal, global rank 3 hangs in
its data function ``load_batch`` while the others wait for it in ``all_reduce``. The two real
exporters are scraped while the job steps and once it is stuck; those series, stretched over
simulated minutes (helpers/sim_series.py), go through promtool with the shipped rules: the job's
stall page must name rank 3, its host, its exporter and ``load_batch``, the slow-rank warning
rank 1 and no other.
"""

from __future__ import annotations

import contextlib
import os
import signal
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers.exporter_proc import Samples, select, value
from helpers.promtool_alerts import PROMTOOL, firing
from helpers.sim_series import Phase, input_series
from helpers.two_nodes import TwoNodes
from helpers.wait import wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(PROMTOOL is None, reason="needs promtool (Debian package prometheus)"),
]

RUN = "job-stuck-slow"
SLOW_RANK, STUCK_RANK = 1, 3

TRAIN = textwrap.dedent(
    """
    import os, sys, time
    import torch
    import torch.distributed as dist
    import trainguard
    name, slow_rank, stuck_rank, flag = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    dist.init_process_group("gloo")
    rank = dist.get_rank()

    def load_batch():
        if rank == stuck_rank and os.path.exists(flag):
            while True:  # a data source that never answers
                time.sleep(1)
        return torch.ones(4)

    def compute(batch):
        time.sleep(0.12 if rank == slow_rank else 0.01)
        return batch * 2

    with trainguard.Run(name, interval=0.2) as run:  # job, rank, state dir: from the env
        step = 0
        while True:
            step += 1
            t0 = time.perf_counter()
            batch = load_batch()
            t1 = time.perf_counter()
            out = compute(batch)
            t2 = time.perf_counter()
            dist.all_reduce(out)
            run.step(step, loss=1.0 / step, data_seconds=t1 - t0, compute_seconds=t2 - t1)
    """
)


@dataclass
class Job:
    """What the real job gave: its nodes, ranks, and the scrapes of both phases."""

    nodes: TwoNodes
    ranks: dict[int, tuple[int, int]]  # global rank: (node, pid)
    stepping: list[tuple[float, dict[str, Samples]]]
    stuck: list[tuple[float, dict[str, Samples]]]
    workdir: Path

    def instance(self, rank: int) -> str:
        return self.nodes.instance(self.ranks[rank][0])


def _scrape(nodes: TwoNodes) -> tuple[float, dict[str, Samples]]:
    return time.monotonic(), {nodes.instance(n): e.scrape() for n, e in enumerate(nodes.exporters)}


def _steps(scrape: dict[str, Samples]) -> float:
    return min(
        [v for s in scrape.values() for v in select(s, "trainguard_run_step", run=RUN).values()]
        or [0.0]
    )


def _stuck_info(scrape: dict[str, Samples]) -> dict[str, dict[str, str]]:
    """{rank: labels} of every trainguard_run_stuck_info series, across the nodes."""
    out = {}
    for instance, samples in scrape.items():
        for labels in select(samples, "trainguard_run_stuck_info", run=RUN):
            out[dict(labels)["rank"]] = {**dict(labels), "instance": instance}
    return out


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Job]:
    workdir = tmp_path_factory.mktemp("two-node-stuck-slow")
    flag = workdir / "hang-now"
    nodes = TwoNodes(workdir, TRAIN, stack=False)
    ranks: dict[int, tuple[int, int]] = {}
    try:
        # overdue after 2 s without a step (the default 30 s is for real jobs)
        nodes.launch(RUN, SLOW_RANK, STUCK_RANK, flag, env={"TRAINGUARD_STUCK_AFTER": "2"})
        ranks = wait_for(
            lambda: found if len(found := nodes.ranks(RUN)) == 4 else None,
            300,
            0.5,
            lambda: f"four ranks stepping\n{nodes.logs()}",
        )
        # stepping: scrapes a few steps apart, once every rank has timed steps to show
        stepping = [
            wait_for(
                lambda: (
                    s
                    if _steps((s := _scrape(nodes))[1]) >= 5
                    and all(
                        select(x, "trainguard_run_timed_steps_total", run=RUN)
                        for x in s[1].values()
                    )
                    else None
                ),
                120,
                0.5,
                lambda: f"timed steps on both nodes\n{nodes.logs()}",
            )
        ]
        for _ in range(5):
            floor = _steps(stepping[-1][1]) + 3
            stepping.append(
                wait_for(
                    lambda f=floor: s if _steps((s := _scrape(nodes))[1]) >= f else None,
                    120,
                    0.2,
                    "three more steps",
                )
            )
        # stuck: rank 3 hangs in load_batch, the others wait for it in all_reduce
        flag.touch()
        first = wait_for(
            lambda: s if len(_stuck_info((s := _scrape(nodes))[1])) == 4 else None,
            120,
            0.5,
            lambda: f"where the four ranks are stuck\n{nodes.logs()}",
        )
        again = wait_for(
            lambda: s if (s := _scrape(nodes))[0] >= first[0] + 1 else None,
            10,
            0.5,
            "a second scrape of the stuck job",
        )
        yield Job(nodes, ranks, stepping, [first, again], workdir)
    finally:
        for _, pid in ranks.values():  # the hung ranks would hold gloo's 30 min timeout
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        nodes.close()


def test_stuck_rank_named_by_each_node_and_by_the_one_job_page(job: Job) -> None:
    where = _stuck_info(job.stuck[-1][1])
    # each node's exporter names where its ranks are: rank 3 in its data function...
    culprit = where[str(STUCK_RANK)]
    assert culprit["collective"] == "", where
    assert culprit["where"].startswith("train.py:"), where
    assert " load_batch" in culprit["where"].split(" <- ")[0], where
    assert culprit["instance"] == job.instance(STUCK_RANK)
    # ...the others in the collective, on both nodes
    for rank in {0, 1, 2, 3} - {STUCK_RANK}:
        assert where[str(rank)]["collective"] == "all_reduce", where
        assert where[str(rank)]["instance"] == job.instance(rank)
    assert {job.ranks[r][0] for r in range(4)} == {0, 1}

    # 20 simulated minutes stepping, then 25 stuck: the stall threshold is learnt from the pace
    series = input_series([Phase(20, True, job.stepping), Phase(25, False, job.stuck)])
    got = firing(
        series,
        [("TrainingJobStalled", 19), ("TrainingJobStalled", 44), ("TrainingStalled", 44)],
        job.workdir,
    )
    assert got[("TrainingJobStalled", 19)] == []
    assert got[("TrainingStalled", 44)] == []  # the job's ranks page once per job, not per node
    (alert,) = got[("TrainingJobStalled", 44)]
    labels, annotations = alert
    assert "instance" not in labels and labels["run"] == RUN
    host = os.uname().nodename
    named = f"rank {STUCK_RANK} on {host} ({job.instance(STUCK_RANK)}) in `{culprit['where']}`"
    assert annotations["summary"].endswith(f"held up by {named}."), annotations
    assert annotations["stuck"] == (
        f"Stuck apart from the rest: {named}. Where the others are: [3 rank(s) in all_reduce]."
    ), annotations


def test_slow_rank_shown_by_its_node_and_named_alone(job: Job) -> None:
    first, last = job.stepping[0][1], job.stepping[-1][1]

    def per_step(rank: int, counter: str) -> float:
        samples = last[job.instance(rank)]
        before = first[job.instance(rank)]
        lbl = {"run": RUN, "rank": str(rank)}
        steps = value(samples, "trainguard_run_timed_steps_total", **lbl)
        steps0 = value(before, "trainguard_run_timed_steps_total", **lbl)
        total, total0 = value(samples, counter, **lbl), value(before, counter, **lbl)
        assert None not in (steps, steps0, total, total0), (rank, counter, samples)
        assert steps > steps0  # type: ignore[operator]
        return (total - total0) / (steps - steps0)  # type: ignore[operator]

    compute = {r: per_step(r, "trainguard_run_compute_seconds_total") for r in range(4)}
    data = {r: per_step(r, "trainguard_run_data_wait_seconds_total") for r in range(4)}
    # its own node's exporter shows rank 1 computing ~0.12 s a step, the others ~0.01 s
    assert compute[SLOW_RANK] >= 0.1, compute
    for rank in {0, 2, 3}:
        assert compute[SLOW_RANK] >= 3 * compute[rank], compute
        assert data[rank] < 0.05, data

    # 40 simulated minutes at the measured rates: past slow_rank_window and slow_rank_for
    series = input_series([Phase(40, True, job.stepping)])
    got = firing(series, [("TrainingRankSlow", 12), ("TrainingRankSlow", 39)], job.workdir)
    assert got[("TrainingRankSlow", 12)] == []  # not yet 15 min
    (alert,) = got[("TrainingRankSlow", 39)]
    labels, annotations = alert
    assert "instance" not in labels and labels["run"] == RUN
    host = os.uname().nodename
    description = annotations["description"]
    assert f"is rank {SLOW_RANK} on {host} ({job.instance(SLOW_RANK)}), " in description
    others = [f"rank {r} " for r in (0, 2, 3)]
    assert not [o for o in others if o in description], description
