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
