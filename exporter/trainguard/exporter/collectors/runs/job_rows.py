"""The job of each run and rank, for rules that judge a job's ranks together across nodes.

One exporter runs per node, so a job of many nodes is many Prometheus ``instance``s; this series
carries what joins them (the job's id, the same on every node) and where the rank sits in it.
Host and pid stay in ``trainguard_run_info``; the restart count stays out (a label that changes
at every restart would make a new series each time): deaths are counted by
``trainguard_run_deaths_total``.
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
JOB_METRICS = (JOB_INFO,)


def add_job_rows(fam: dict[str, Any], row: RunRow) -> None:
    """The row's job series, when its heartbeat names a job."""
    hb = row.heartbeat
    job = None if hb is None else hb.job
    if job is None:
        return
    node = "" if job.node_rank is None else str(job.node_rank)
    local = "" if job.local_rank is None else str(job.local_rank)
    fam[JOB_INFO.name].add_metric([row.run, row.rank, job.id, node, local, job.launcher], 1)
