"""trainguard_run_job_info: each rank's job as its heartbeat tells it, published by the real
exporter, and nothing for a lone process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from helpers.exporter_proc import Exporter, poll, select
from trainguard import Run


def test_job_info_per_rank_and_none_for_a_lone_process(tmp_path: Path, monkeypatch: Any) -> None:
    env = {"SLURM_JOB_ID": "884211", "SLURM_NODEID": "1", "SLURM_NTASKS": "4"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for rank, local in ((2, 0), (3, 1)):
        monkeypatch.setenv("SLURM_PROCID", str(rank))
        monkeypatch.setenv("SLURM_LOCALID", str(local))
        Run("llama", state_dir=tmp_path, interval=0.01).close()
    for name in (*env, "SLURM_PROCID", "SLURM_LOCALID"):
        monkeypatch.delenv(name)
    Run("lone", state_dir=tmp_path, interval=0.01).close()
    with Exporter(state_dir=tmp_path) as exp:
        samples = poll(exp, lambda s: len(select(s, "trainguard_run_info")) == 3)
    rows = {
        tuple(sorted(labels)): v for labels, v in select(samples, "trainguard_run_job_info").items()
    }
    assert rows == {
        tuple(
            sorted(
                {
                    "run": "llama",
                    "rank": str(rank),
                    "job_id": "884211",
                    "node_rank": "1",
                    "local_rank": str(local),
                    "launcher": "slurm",
                }.items()
            )
        ): 1.0
        for rank, local in ((2, 0), (3, 1))
    }


def test_job_attempt_per_rank_from_the_launchers_count_and_no_label_for_the_pod_uid(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """A requeued Slurm job keeps its id; the new attempt's rank says 1 while the heartbeat the
    first attempt left says 0. A pod's uid stays in the heartbeat, on no series."""
    for name in ("TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT", "TRAINGUARD_JOB"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "884211")
    monkeypatch.setenv("SLURM_NTASKS", "4")
    monkeypatch.setenv("SLURM_PROCID", "2")  # first attempt: Slurm sets no restart count
    Run("llama", state_dir=tmp_path, interval=0.01).close()
    monkeypatch.setenv("SLURM_PROCID", "3")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")  # after `scontrol requeue`
    Run("llama", state_dir=tmp_path, interval=0.01).close()
    for name in ("SLURM_JOB_ID", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_RESTART_COUNT"):
        monkeypatch.delenv(name)
    uid = "9b7e1d6a-52f0-4c3e-8a11-0d2f6c4b9e70"
    monkeypatch.setenv("TRAINGUARD_JOB", "pod-job")
    monkeypatch.setenv("TRAINGUARD_POD_UID", uid)
    Run("pod", state_dir=tmp_path, interval=0.01).close()
    with Exporter(state_dir=tmp_path) as exp:
        samples = poll(exp, lambda s: len(select(s, "trainguard_run_info")) == 3)
        page = exp.get()
    attempts = {
        tuple(sorted(labels)): v
        for labels, v in select(samples, "trainguard_run_job_attempt").items()
    }
    assert attempts == {
        (("rank", "2"), ("run", "llama")): 0.0,
        (("rank", "3"), ("run", "llama")): 1.0,
    }
    assert len(select(samples, "trainguard_run_job_info")) == 3  # the pod's rank is a job's
    assert uid not in page
