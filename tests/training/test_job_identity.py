"""Job identity from the launcher's environment, with no user code: torchrun, Slurm (srun, arrays),
a Kubernetes pod given the job's name by the downward API, MPI, or ``Run(job=...)``; and the
heartbeat's ``job`` object, written by a real ``Run`` and checked field by field by the reader."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trainguard import Run
from trainguard.run.job import global_rank, resolve_job, world_size
from trainguard.shared.heartbeat.read import parse_heartbeat, read_heartbeat
from trainguard.shared.heartbeat.record import HeartbeatError
from trainguard.shared.jobinfo import JobInfo

#: what torchrun's agent gives worker 3 of `--nnodes=2 --nproc-per-node=2`, on the second node
TORCHRUN = {
    "RANK": "3",
    "LOCAL_RANK": "1",
    "GROUP_RANK": "1",
    "WORLD_SIZE": "4",
    "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29500",
    "TORCHELASTIC_RUN_ID": "llama-70b-0412",
    "TORCHELASTIC_RESTART_COUNT": "2",
}
#: what srun gives task 13 of `srun -N4 --ntasks-per-node=8` (no torchrun)
SLURM = {
    "SLURM_JOB_ID": "884211",
    "SLURM_PROCID": "13",
    "SLURM_NODEID": "1",
    "SLURM_LOCALID": "5",
    "SLURM_NTASKS": "32",
}
#: a pod of an Indexed Job / JobSet whose manifest sets TRAINGUARD_JOB from the job's label
#: (docs/integrations.md), and Kubeflow's PyTorchJob variables
KUBERNETES = {
    "KUBERNETES_SERVICE_HOST": "10.96.0.1",
    "TRAINGUARD_JOB": "3f1c9a52-0b8e-4b55-9d0c-1c2e0f6a7b11",
    "JOB_COMPLETION_INDEX": "2",
    "RANK": "2",
    "WORLD_SIZE": "4",
}
OPENMPI = {
    "OMPI_COMM_WORLD_RANK": "6",
    "OMPI_COMM_WORLD_SIZE": "16",
    "OMPI_COMM_WORLD_LOCAL_RANK": "2",
    "PMIX_NAMESPACE": "prterun-node1-40213@1",
}


def test_torchrun() -> None:
    assert resolve_job(env=TORCHRUN) == JobInfo("llama-70b-0412", "torchrun", 1, 1, 2)
    assert (global_rank(TORCHRUN), world_size(TORCHRUN)) == (3, 4)


def test_torchrun_without_rdzv_id_is_told_apart_by_its_rendezvous_store() -> None:
    # torchrun's default --rdzv-id is the literal "none", on every node of every job
    env = {**TORCHRUN, "TORCHELASTIC_RUN_ID": "none"}
    job = resolve_job(env=env)
    assert job is not None
    assert (job.id, job.launcher) == ("torchrun@10.0.0.1:29500", "torchrun")
    other = resolve_job(env={**env, "MASTER_PORT": "41877"})  # another launch
    assert other is not None and other.id != job.id
    # inside a Slurm allocation the Slurm job id is the better name
    inside = resolve_job(env={**env, **{"SLURM_JOB_ID": "884211", "SLURM_PROCID": "1"}})
    assert inside is not None and (inside.id, inside.launcher) == ("884211", "slurm")
    # torchrun's ranks win over srun's (one srun task per node runs torchrun)
    assert global_rank({**env, "SLURM_PROCID": "1"}) == 3


def test_slurm_and_job_arrays() -> None:
    # Slurm sets SLURM_RESTART_COUNT only from the first requeue on: without it, attempt 0
    assert resolve_job(env=SLURM) == JobInfo("884211", "slurm", 1, 5, 0)
    assert (global_rank(SLURM), world_size(SLURM)) == (13, 32)
    array = {**SLURM, "SLURM_ARRAY_JOB_ID": "884200", "SLURM_ARRAY_TASK_ID": "11"}
    job = resolve_job(env=array)
    assert job is not None and job.id == "884200_11"
    requeued = resolve_job(env={**SLURM, "SLURM_RESTART_COUNT": "1"})
    assert requeued is not None and requeued.restart_count == 1
    # garbage is not a count (and not attempt 0 either)
    bad = resolve_job(env={**SLURM, "SLURM_RESTART_COUNT": "x"})
    assert bad is not None and bad.restart_count is None
    # torchrun inside an allocation: torchrun's count; no launcher at all: none
    inside = resolve_job(
        env={**SLURM, "TORCHELASTIC_RUN_ID": "r", "TORCHELASTIC_RESTART_COUNT": "3"}
    )
    assert inside is not None and inside.restart_count == 3
    assert resolve_job(env={"TRAINGUARD_JOB": "nightly"}) == JobInfo("nightly", "user")


def test_kubernetes_pod_uid_is_the_attempt_id() -> None:
    uid = "9b7e1d6a-52f0-4c3e-8a11-0d2f6c4b9e70"
    job = resolve_job(env={**KUBERNETES, "TRAINGUARD_POD_UID": uid})
    assert job is not None and (job.attempt_id, job.restart_count) == (uid, None)
    assert job.to_dict()["attempt_id"] == uid
    # absent (or blank, or with control characters): no attempt id, and none written
    for env in (KUBERNETES, {**KUBERNETES, "TRAINGUARD_POD_UID": " "}):
        job = resolve_job(env=env)
        assert job is not None and job.attempt_id is None
        assert "attempt_id" not in job.to_dict()
    job = resolve_job(env={**KUBERNETES, "TRAINGUARD_POD_UID": "a\nb"})
    assert job is not None and job.attempt_id is None


def test_kubernetes_downward_api() -> None:
    assert resolve_job(env=KUBERNETES) == JobInfo(KUBERNETES["TRAINGUARD_JOB"], "kubernetes", 2)
    assert (global_rank(KUBERNETES), world_size(KUBERNETES)) == (2, 4)
    # TRAINGUARD_JOB outside a pod: the user's own name for the job
    job = resolve_job(env={"TRAINGUARD_JOB": "nightly-42", **SLURM})
    assert job is not None and (job.id, job.launcher) == ("nightly-42", "user")
    # and it names a torchrun job too (PyTorchJob runs torchrun in each pod)
    job = resolve_job(env={**TORCHRUN, **KUBERNETES, "RANK": "3"})
    assert job is not None and (job.id, job.launcher, job.node_rank) == (
        KUBERNETES["TRAINGUARD_JOB"],
        "kubernetes",
        1,  # torchrun's GROUP_RANK before the pod's index
    )


def test_mpi() -> None:
    assert resolve_job(env=OPENMPI) == JobInfo("prterun-node1-40213@1", "mpi", None, 2)
    assert (global_rank(OPENMPI), world_size(OPENMPI)) == (6, 16)
    hydra = {"PMI_RANK": "4", "PMI_SIZE": "8", "MPI_LOCALRANKID": "0"}
    assert (global_rank(hydra), world_size(hydra)) == (4, 8)
    assert resolve_job(env=hydra) is None  # no job id: set TRAINGUARD_JOB (docs)


def test_user_job_wins_and_a_lone_process_has_none() -> None:
    assert resolve_job("exp-7", env=TORCHRUN) == JobInfo("exp-7", "user", 1, 1, 2)
    assert resolve_job(env={}) is None
    assert resolve_job(env={"RANK": "0", "WORLD_SIZE": "1"}) is None


def test_bad_and_long_values() -> None:
    # control characters: ignored (logged), the next source is used
    job = resolve_job(env={**SLURM, "TRAINGUARD_JOB": "a\nb"})
    assert job is not None and job.id == "884211"
    # out of range ranks are ignored, not fatal
    job = resolve_job(env={**SLURM, "SLURM_NODEID": "-1", "SLURM_LOCALID": "x"})
    assert job is not None and (job.node_rank, job.local_rank) == (None, None)
    # a long id keeps its start and a hash of the whole: two of them stay apart
    long_a = resolve_job(env={"TRAINGUARD_JOB": "j" * 300 + "a"})
    long_b = resolve_job(env={"TRAINGUARD_JOB": "j" * 300 + "b"})
    assert long_a is not None and long_b is not None
    assert len(long_a.id) == len(long_b.id) == 128 and long_a.id != long_b.id


def test_run_writes_the_job_and_the_reader_checks_it(tmp_path: Path, monkeypatch: Any) -> None:
    for name, value in TORCHRUN.items():
        monkeypatch.setenv(name, value)
    with Run("ddp", state_dir=tmp_path, interval=0.01) as run:
        assert (run.rank, run.world_size) == (3, 4)
        run.step(1)
    hb = read_heartbeat(run.path)
    assert hb.job == JobInfo("llama-70b-0412", "torchrun", 1, 1, 2)
    assert (hb.rank, hb.world_size) == (3, 4)
    doc = json.loads(run.path.read_text())
    assert doc["job"] == {
        "id": "llama-70b-0412",
        "launcher": "torchrun",
        "node_rank": 1,
        "local_rank": 1,
        "restart_count": 2,
    }
    # Run(job=...) wins; a bad one is an error in the script
    with Run("ddp", state_dir=tmp_path, interval=0.01, job="exp-7") as run:
        pass
    assert read_heartbeat(run.path).job == JobInfo("exp-7", "user", 1, 1, 2)
    with pytest.raises(ValueError, match="job"):
        Run("ddp", state_dir=tmp_path, job="")
    # srun without torchrun: SLURM_PROCID is the rank (each task its own heartbeat file)
    for name in TORCHRUN:
        monkeypatch.delenv(name)
    for name, value in SLURM.items():
        monkeypatch.setenv(name, value)
    with Run("srun", state_dir=tmp_path, interval=0.01) as run:
        assert (run.rank, run.world_size) == (13, 32)
    assert read_heartbeat(run.path).job == JobInfo("884211", "slurm", 1, 5, 0)
    # a pod's uid travels in the heartbeat as the attempt id
    monkeypatch.setenv("TRAINGUARD_POD_UID", "9b7e1d6a-52f0-4c3e-8a11-0d2f6c4b9e70")
    with Run("srun", state_dir=tmp_path, interval=0.01) as run:
        pass
    job = read_heartbeat(run.path).job
    assert job is not None and job.attempt_id == "9b7e1d6a-52f0-4c3e-8a11-0d2f6c4b9e70"


def test_a_heartbeat_without_job_reads_as_none_and_bad_ones_name_the_field(
    tmp_path: Path,
) -> None:
    with Run("lone", state_dir=tmp_path, interval=0.01) as run:
        pass
    doc = json.loads(run.path.read_text())
    if "job" in doc:  # a launcher around this test run (srun pytest): not a lone process
        pytest.skip("the test itself runs under a launcher")
    assert read_heartbeat(run.path).job is None
    good = {"id": "j1", "launcher": "slurm", "node_rank": 0, "local_rank": 0}
    assert parse_heartbeat({**doc, "job": good}).job == JobInfo("j1", "slurm", 0, 0)
    pod = {**good, "attempt_id": "9b7e1d6a"}
    assert parse_heartbeat({**doc, "job": pod}).job == JobInfo(
        "j1", "slurm", 0, 0, None, "9b7e1d6a"
    )
    for bad, field in (
        ("x", "job"),
        ({**good, "id": ""}, "job.id"),
        ({**good, "id": "x" * 129}, "job.id"),
        ({**good, "id": "a\x00b"}, "job.id"),
        ({**good, "launcher": "pbs"}, "job.launcher"),
        ({**good, "node_rank": -1}, "job.node_rank"),
        ({**good, "local_rank": True}, "job.local_rank"),
        ({**good, "restart_count": 1.5}, "job.restart_count"),
        ({**good, "attempt_id": 7}, "job.attempt_id"),
        ({**good, "attempt_id": "x" * 129}, "job.attempt_id"),
        ({**good, "attempt_id": "a\tb"}, "job.attempt_id"),
        ({"launcher": "slurm"}, "job.id"),
    ):
        with pytest.raises(HeartbeatError, match=f"field '{field}'"):
            parse_heartbeat({**doc, "job": bad})
