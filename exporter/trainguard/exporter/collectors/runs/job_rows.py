"""The job of each run and rank, for rules that judge a job's ranks together across nodes.

One exporter runs per node, so a job of many nodes is many Prometheus ``instance``s; this series
carries what joins them (the job's id, the same on every node) and where the rank sits in it.
Host and pid stay in ``trainguard_run_info``; the restart count stays out of the labels (a label
that changes at every restart would make a new series each time): it is the value of
``trainguard_run_job_attempt``, one series per run and rank, so that the ranks of a requeued
or restarted job's newest attempt are told apart from the heartbeats its older attempts left
on other nodes. The pod uid a heartbeat may carry (``attempt_id``) is not published at all.
"""

from __future__ import annotations

from typing import Any

from trainguard.exporter.runs.rows import RunRow
from trainguard.exporter.scrape.collector import MetricSpec

JOB_INFO = MetricSpec(
    "trainguard_run_job_info",
    "gauge",
    ("run", "rank", "job_id", "node_rank", "local_rank", "launcher"),
    "Always 1 for each run and rank whose process told its job (torchrun, Slurm, Kubernetes, "
    "MPI or Run(job=...)): job_id is the same on every node of the job; node_rank and "
    "local_rank are empty when the launcher does not say.",
)
JOB_ATTEMPT = MetricSpec(
    "trainguard_run_job_attempt",
    "gauge",
    ("run", "rank"),
    "The attempt of the job this run and rank's (last) process belongs to: the launcher's "
    "restart count (torchrun's TORCHELASTIC_RESTART_COUNT, Slurm's SLURM_RESTART_COUNT; 0 for "
    "a Slurm job never requeued); absent when the launcher does not say.",
)
JOB_METRICS = (JOB_INFO, JOB_ATTEMPT)


def add_job_rows(fam: dict[str, Any], row: RunRow) -> None:
    """The row's job series, when its heartbeat names a job."""
    hb = row.heartbeat
    job = None if hb is None else hb.job
    if job is None:
        return
    node = "" if job.node_rank is None else str(job.node_rank)
    local = "" if job.local_rank is None else str(job.local_rank)
    fam[JOB_INFO.name].add_metric([row.run, row.rank, job.id, node, local, job.launcher], 1)
    if job.restart_count is not None:
        fam[JOB_ATTEMPT.name].add_metric([row.run, row.rank], job.restart_count)
