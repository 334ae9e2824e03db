"""The ``job`` object of a heartbeat: which job of many ranks (over many nodes) a rank belongs to.

The training side fills it from the launcher's environment (:mod:`trainguard.run.job`); the
exporter publishes it (``trainguard_run_job_info``) so that rules can judge a job's ranks
together across the nodes (one exporter, one Prometheus ``instance`` each). An optional field of
heartbeat format 1: older readers ignore it, and a heartbeat without it is a rank of no known job.
Read and checked by :meth:`trainguard.shared.heartbeat.fields.Fields.job`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: who gave the job its identity
LAUNCHERS = ("torchrun", "slurm", "kubernetes", "mpi", "user")
MAX_JOB_ID = 128
#: a Kubernetes uid is 36 characters; room for other launchers' attempt ids
MAX_ATTEMPT_ID = 128
#: node ranks, local ranks and restart counts above this are garbage
MAX_JOB_INT = 1_000_000


@dataclass(frozen=True)
class JobInfo:
    """One rank's job: its identity (the same on every node) and where the rank sits in it."""

    id: str
    launcher: str  # one of LAUNCHERS
    node_rank: int | None = None
    local_rank: int | None = None
    #: the launcher's restarts of the job so far (torchrun's TORCHELASTIC_RESTART_COUNT,
    #: Slurm's SLURM_RESTART_COUNT); None when the launcher does not say
    restart_count: int | None = None
    #: what tells this attempt of the job apart from the others when no count does: the
    #: Kubernetes pod's uid ($TRAINGUARD_POD_UID from the downward API; a rescheduled pod keeps
    #: its name and gets a new uid). Kept in the heartbeat, never published as a label (it
    #: changes at every attempt)
    attempt_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = vars(self).copy()
        if out["attempt_id"] is None:  # absent, as older writers left it
            del out["attempt_id"]
        return out
