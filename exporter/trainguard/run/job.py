"""Which job a rank belongs to, and where it sits in it, from the launcher's environment.

A training job of many ranks over many nodes (torchrun ``--nnodes``, Slurm ``srun``, a
Kubernetes Job/JobSet/PyTorchJob, ``mpirun``) has one exporter per node; for the rules to judge
the job as one (one page when a rank dies, naming the first death) every rank must carry the
same job identity on every node, with no user code. The launchers' own variables give it:

* ``Run(job=...)``: the script's own choice, first of all (launcher ``user``).
* ``$TRAINGUARD_JOB``: set in a Kubernetes pod template from the Job/JobSet/PyTorchJob's label
  through the downward API (docs/integrations.md; launcher ``kubernetes`` in a pod, else
  ``user``), or by hand around any launcher.
* torchrun: ``$TORCHELASTIC_RUN_ID`` (``--rdzv-id``). Without ``--rdzv-id`` it is the literal
  ``none`` on every node of every job, so then Slurm's job id, else the rendezvous store's
  address (``$MASTER_ADDR:$MASTER_PORT``, the same on all nodes of one launch and across its
  restarts) stands in.
* Slurm: ``$SLURM_JOB_ID`` (an array task: ``<array job>_<task>``).
* MPI: the PMIx namespace (Open MPI 5, ``srun --mpi=pmix``) or Open MPI's job id.

The attempt: the launcher's restart count (``$TORCHELASTIC_RESTART_COUNT``, else
``$SLURM_RESTART_COUNT``; Slurm sets the latter only once a job was requeued, so inside a Slurm
job its absence is attempt 0) and, in a Kubernetes pod, the pod's uid (``$TRAINGUARD_POD_UID``
from the downward API) as ``attempt_id``: a rescheduled pod keeps its name, its uid is new.

A run name reused by a new job is then a new job: its id differs. The ranks come from the
same variables (global rank, node rank, local rank, world size; :func:`global_rank`,
:func:`world_size`), the launcher's first, so that ``Run.rank`` and the job agree.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Mapping

from trainguard.run.options import RANK_VARS, WORLD_VARS, env_int
from trainguard.shared.heartbeat.record import MAX_RANK, text_problem
from trainguard.shared.jobinfo import MAX_JOB_ID, MAX_JOB_INT, JobInfo

log = logging.getLogger("trainguard.reporter")

#: the variable to set (from the downward API in Kubernetes) when the launcher gives no id
JOB_VAR = "TRAINGUARD_JOB"

LOCAL_VARS = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")
#: torchrun's node rank, Slurm's, then NODE_RANK (Kubeflow's PyTorchJob, Lightning) and the
#: completion index of a Kubernetes Indexed Job (one pod per node)
NODE_VARS = ("GROUP_RANK", "SLURM_NODEID", "NODE_RANK", "JOB_COMPLETION_INDEX")
RESTART_VARS = ("TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT")
#: the pod's uid, set in the pod template from the downward API (``metadata.uid``)
POD_UID_VAR = "TRAINGUARD_POD_UID"
#: Open MPI's job identity: the PMIx namespace (Open MPI 5), the job id of Open MPI 3/4
MPI_ID_VARS = ("PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_ess_jobid")


def _first_int(env: Mapping[str, str], names: tuple[str, ...], lo: int, hi: int) -> int | None:
    for name in names:
        value = env_int(name, lo, hi, env)
        if value is not None:
            return value
    return None


def global_rank(env: Mapping[str, str] | None = None) -> int | None:
    """The rank in the whole job from the launcher's variables (:data:`RANK_VARS`), or None."""
    return _first_int(os.environ if env is None else env, RANK_VARS, 0, MAX_RANK)


def world_size(env: Mapping[str, str] | None = None) -> int | None:
    """The number of ranks of the job from the launcher's variables, or None."""
    return _first_int(os.environ if env is None else env, WORLD_VARS, 1, MAX_RANK + 1)


def local_rank(env: Mapping[str, str] | None = None) -> int | None:
    """The rank on this node from the launcher's variables, or None."""
    return _first_int(os.environ if env is None else env, LOCAL_VARS, 0, MAX_JOB_INT)


def check_job_id(job: object) -> str:
    """``Run(job=...)`` checked: printable text, 1-128 characters."""
    if not isinstance(job, str) or not 1 <= len(job) <= MAX_JOB_ID or text_problem(job):
        raise ValueError(
            f"trainguard.Run: job: expected 1-{MAX_JOB_ID} printable characters, got {job!r}"
        )
    return job


def _usable(name: str, raw: str | None) -> str | None:
    """A job id from a variable: stripped, printable (else ignored, logged), at most 128.

    A longer one keeps its start and a hash of the whole, so two long ids stay apart.
    """
    if raw is None or not raw.strip():
        return None
    value = raw.strip()
    if text_problem(value):
        log.warning("trainguard: ignoring $%s: it contains control characters", name)
        return None
    if len(value) > MAX_JOB_ID:
        digest = hashlib.sha256(value.encode("utf-8")).hexdigest()[:12]
        value = f"{value[: MAX_JOB_ID - 13]}~{digest}"
    return value


def _identity(job: str | None, env: Mapping[str, str]) -> tuple[str, str] | None:
    """(id, launcher) by the order in the module's docstring, or None when nothing says."""
    if job is not None:
        return job, "user"
    mine = _usable(JOB_VAR, env.get(JOB_VAR))
    if mine is not None:
        return mine, "kubernetes" if env.get("KUBERNETES_SERVICE_HOST") else "user"
    run_id = _usable("TORCHELASTIC_RUN_ID", env.get("TORCHELASTIC_RUN_ID"))
    if run_id is not None and run_id != "none":
        return run_id, "torchrun"
    slurm = _usable("SLURM_JOB_ID", env.get("SLURM_JOB_ID"))
    if slurm is not None:
        array, task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
        if array and task:  # each task of an array is its own job (SLURM_JOB_ID differs too)
            slurm = _usable("SLURM_ARRAY_JOB_ID", f"{array}_{task}") or slurm
        return slurm, "slurm"
    if run_id == "none":
        store = f"{env.get('MASTER_ADDR', '')}:{env.get('MASTER_PORT', '')}"
        if store != ":":
            return _usable("MASTER_ADDR", f"torchrun@{store}") or "torchrun", "torchrun"
    for name in MPI_ID_VARS:
        mpi = _usable(name, env.get(name))
        if mpi is not None:
            return mpi, "mpi"
    return None


def resolve_job(job: str | None = None, env: Mapping[str, str] | None = None) -> JobInfo | None:
    """This rank's job from ``job`` (``Run(job=...)``) or the environment; None when none.

    None for a lone process started by no launcher: it is its own job, judged per node.
    """
    env = os.environ if env is None else env
    found = _identity(job, env)
    if found is None:
        return None
    job_id, launcher = found
    return JobInfo(
        id=job_id,
        launcher=launcher,
        node_rank=_first_int(env, NODE_VARS, 0, MAX_JOB_INT),
        local_rank=local_rank(env),
        restart_count=restart_count(env),
        attempt_id=_usable(POD_UID_VAR, env.get(POD_UID_VAR)),
    )


def restart_count(env: Mapping[str, str]) -> int | None:
    """The launcher's restarts of the job so far, or None when no launcher says.

    Slurm sets ``$SLURM_RESTART_COUNT`` only from the first requeue on: in a Slurm job
    (``$SLURM_JOB_ID``) without it, the job runs its first attempt.
    """
    count = _first_int(env, RESTART_VARS, 0, MAX_JOB_INT)
    in_slurm = bool(env.get("SLURM_JOB_ID", "").strip())
    if count is None and in_slurm and env.get("SLURM_RESTART_COUNT") is None:
        return 0
    return count
