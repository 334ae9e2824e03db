"""The job identity the Lightning callback gives DDP ranks that no launcher variable names:
the rendezvous address, unless the environment already names the job. The launcher itself
is run for real in test_launchers.py; here, which variable wins."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher

from trainguard.integrations.lightning import launcher_job
from trainguard.run.job import JOB_VAR, MPI_ID_VARS

#: every variable trainguard.run.job reads a job identity from
JOB_VARS = (JOB_VAR, "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", *MPI_ID_VARS, "KUBERNETES_SERVICE_HOST")
DDP = SimpleNamespace(launcher=_SubprocessScriptLauncher(LightningEnvironment(), 2, 1))


@pytest.fixture(autouse=True)
def no_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in JOB_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.7")
    monkeypatch.setenv("MASTER_PORT", "29511")


def test_lightnings_own_launcher_is_named_by_its_rendezvous() -> None:
    assert launcher_job(DDP) == "lightning@10.0.0.7:29511"


@pytest.mark.parametrize(
    ("var", "value"),
    [(JOB_VAR, "llama-7"), ("TORCHELASTIC_RUN_ID", "abc"), ("SLURM_JOB_ID", "991")],
)
def test_a_job_the_environment_names_wins(
    monkeypatch: pytest.MonkeyPatch, var: str, value: str
) -> None:
    monkeypatch.setenv(var, value)
    assert launcher_job(DDP) is None


def test_no_job_without_the_launcher_or_its_address(monkeypatch: pytest.MonkeyPatch) -> None:
    assert launcher_job(SimpleNamespace(launcher=None)) is None  # single device, ddp_spawn...
    monkeypatch.delenv("MASTER_PORT")
    assert launcher_job(DDP) is None
