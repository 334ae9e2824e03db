"""Saves that fail are counted by reason, also when the script catches the error and trains on.

Real processes save into a real 2 MiB tmpfs (skipped where mounting one is not permitted): a
training process whose ``checkpoint.save`` and ``torch.save`` fail with ENOSPC shows them on a
real exporter's /metrics; a DCP ``async_save`` that fails in its writer thread is counted; so is
Lightning's save through ``TrainguardCheckpointIO``, synchronous and under ``AsyncCheckpointIO``.
The reason's classification and the status file's checks are tested in process.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from helpers.exporter_proc import Exporter, child_env, free_port, value
from helpers.paths import HELPERS
from helpers.tmpfs import tmpfs
from helpers.wait import wait_for
from helpers.zygote import Zygote
from trainguard.checkpoint import outcomes, save
from trainguard.exporter.collectors.checkpoints.saves import read_status
from trainguard.exporter.runs.targets import CheckpointTarget
from trainguard.shared.save_status import SaveStatus, SaveStatusError, parse_status, status_path

CHILD = HELPERS / "save_fail_child.py"
FAILURES = "trainguard_checkpoint_save_failures_total"
LAST_SUCCESS = "trainguard_checkpoint_last_save_success_timestamp_seconds"
LAST_FAILURE = "trainguard_checkpoint_last_save_failure_timestamp_seconds"


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs, or a skip where this process may not mount one."""
    with tmpfs(tmp_path / "small", "2m") as mnt:
        yield mnt


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's state directory, where the checkpoint library records the outcomes."""
    path = tmp_path / "state"
    monkeypatch.setenv("TRAINGUARD_STATE_DIR", str(path))
    return path


def status(state: Path, directory: Path) -> SaveStatus:
    return parse_status(status_path(state, directory).read_bytes())


def test_a_caught_enospc_shows_on_the_exporter(
    tmp_path: Path, full_disk: Path, state: Path, framework_zygote: Zygote
) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    log = tmp_path / "child.log"
    with open(log, "w") as out:
        child = framework_zygote.spawn(
            [str(CHILD), "full", str(full_disk), str(gate)],
            child_env({"TRAINGUARD_STATE_DIR": str(state), "OMP_NUM_THREADS": "1"}),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        with Exporter(state_dir=state) as exporter:
            run = {"run": "saves-full", "location": "primary"}

            def counted() -> Any:
                if child.poll() is not None:
                    raise AssertionError(f"child exited: {log.read_text()}")
                got = exporter.scrape()
                return (value(got, FAILURES, **run, reason="enospc") or 0) >= 4 and got

            got = wait_for(counted, what="four enospc failures on /metrics")
            assert (gate / "saved").exists()
            assert value(got, FAILURES, **run, reason="enospc") == 4
            assert value(got, FAILURES, **run, reason="other") == 0
            assert value(got, FAILURES, **run, reason="eio") == 0
            success = value(got, LAST_SUCCESS, **run)
            failure = value(got, LAST_FAILURE, **run)
            assert success is not None and failure is not None and failure >= success
            # the age the rules judge: this host's clock, from the same success
            before = time.time()
            age = value(got, "trainguard_checkpoint_last_save_success_age_seconds", **run)
            assert age is not None and 0 <= age <= before - success + 1
            assert child.poll() is None  # the script caught every failure and trains on
            assert log.read_text().count("caught 28") == 3 and "caught torch" in log.read_text()
            # the step goes on while the saves fail: what CheckpointSavesFailing pages on
            step = value(exporter.scrape(), "trainguard_run_step", run="saves-full", rank="0")
            assert step is not None and step >= 5
    finally:
        (gate / "release").write_text("")
        child.wait(60)
    assert child.returncode == 0, log.read_text()


def test_a_failed_dcp_async_save_is_counted(
    tmp_path: Path, full_disk: Path, state: Path, framework_zygote: Zygote
) -> None:
    code, out = framework_zygote.run(
        [str(CHILD), "dcp", str(full_disk), str(free_port())],
        child_env(
            {"TRAINGUARD_STATE_DIR": str(state), "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
        ),
        timeout=120,
    )
    assert code == 0, out
    assert "failed CheckpointException" in out  # raised from the writer thread, not the call
    got = status(state, full_disk)
    assert got.failures == {"enospc": 1}  # DCP lost the errno: told by the full filesystem
    assert got.last_failure is not None and got.last_success is None


def _fit(root: Path, ckpt: Path, plugins: list[Any]) -> None:
    L = pytest.importorskip("lightning")
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torch.utils.data import DataLoader, TensorDataset

    from trainguard.integrations.lightning import TrainguardCallback

    class Module(L.LightningModule):  # type: ignore[name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(4, 1)
            self.register_buffer("pad", torch.zeros(1 << 20))  # 4 MiB: never fits in 2 MiB

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    x = torch.randn(16, 4)
    trainer = L.Trainer(
        default_root_dir=root,
        max_steps=2,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        plugins=plugins,
        callbacks=[
            ModelCheckpoint(dirpath=ckpt, filename="{step}", every_n_train_steps=2),
            TrainguardCallback(state_dir=root / "state", interval=0.05),
        ],
    )
    data = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=4)
    trainer.fit(Module(), data)


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_failed_lightning_save_is_counted(
    tmp_path: Path, full_disk: Path, state: Path, asynchronous: bool
) -> None:
    pytest.importorskip("lightning")
    from lightning.pytorch.plugins.io import AsyncCheckpointIO

    plugins = [AsyncCheckpointIO()] if asynchronous else []
    with pytest.raises(Exception) as raised:  # Lightning's own wrapping
        _fit(tmp_path, full_disk, plugins)
    assert "unexpected pos" in str(raised.value) or "No space" in str(raised.value)
    assert status(state, full_disk).failures == {"enospc": 1}


HF_TRAIN = """
import sys
import torch
from torch import nn
from transformers import Trainer, TrainingArguments
from trainguard.integrations.transformers import TrainguardCallback

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.big = nn.Linear(1024, 1024)  # 4 MiB of weights: more than the 2 MiB disk

    def forward(self, x, labels=None):
        out = self.big(x).sum(dim=1, keepdim=True)
        return {"loss": nn.functional.mse_loss(out, labels), "logits": out}

class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return {"x": torch.ones(1024), "labels": torch.zeros(1)}

args = TrainingArguments(
    output_dir=sys.argv[1], max_steps=3, save_steps=2, per_device_train_batch_size=4,
    report_to=[], use_cpu=True, logging_steps=1,
)
Trainer(Model(), args, train_dataset=Data(), callbacks=[TrainguardCallback("hf-full")]).train()
"""


def test_a_failed_hugging_face_save_is_counted(
    tmp_path: Path, full_disk: Path, state: Path
) -> None:
    """The Trainer's own save fails on the full disk and ends ``train()``; no callback hears
    of it, so the callback counts the announced save that never reached ``on_save`` at exit."""
    pytest.importorskip("transformers")
    out = full_disk / "out"
    env = child_env({"TRAINGUARD_STATE_DIR": str(state), "OMP_NUM_THREADS": "1"})
    env.update({"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    got = subprocess.run(
        [sys.executable, "-c", HF_TRAIN, str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert got.returncode != 0, got.stdout[-2000:] + got.stderr[-2000:]
    assert "failed" in got.stderr and "counted" in got.stderr, got.stderr[-3000:]
    assert status(state, out).failures == {"enospc": 1}, got.stderr[-3000:]


# ---------------------------------------------------------------- in process


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (errno.ENOSPC, "enospc"),
        (errno.EDQUOT, "edquot"),
        (errno.EIO, "eio"),
        (errno.EROFS, "erofs"),
        (errno.EACCES, "other"),
    ],
)
def test_the_reason_is_the_errno_behind_the_error(tmp_path: Path, code: int, reason: str) -> None:
    err = OSError(code, os.strerror(code))
    assert outcomes.reason_of(err, tmp_path) == reason
    try:
        try:
            raise err
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc] unexpected pos") from None
    except RuntimeError as wrapped:  # torch.save: the OSError is only the context
        wrapped.__suppress_context__ = False
        wrapped.__context__ = err
        assert outcomes.reason_of(wrapped, tmp_path) == reason

    class CheckpointException(Exception):  # DCP's: the rank's error and its traceback
        failures: ClassVar[dict[int, tuple[OSError, list[Any]]]] = {0: (err, [])}

    assert outcomes.reason_of(CheckpointException(), tmp_path) == reason
    # only the message kept: its text
    assert outcomes.reason_of(RuntimeError(f"write: {os.strerror(code)}"), None) == reason


def test_an_error_without_errno_on_a_roomy_disk_is_other(tmp_path: Path) -> None:
    assert outcomes.reason_of(ValueError("cannot pickle"), tmp_path) == "other"
    assert outcomes.reason_of(None, tmp_path) == "other"


def test_save_counts_failures_and_successes_in_the_state_directory(
    tmp_path: Path, state: Path
) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "step_2.pt.part").mkdir()  # the .part cannot be opened: EISDIR, "other"
    with pytest.raises(IsADirectoryError):
        save(b"x", ckpt / "step_2.pt")
    with pytest.raises(ValueError):
        save(b"x", ckpt / "no-step-here.pt")  # a name without a step: a failed save too
    got = status(state, ckpt)
    assert got.failures == {"other": 2} and got.last_success is None
    save(b"x", ckpt / "step_1.pt")
    got = status(state, ckpt)
    assert got.failures == {"other": 2} and got.last_success is not None
    assert got.directory == str(ckpt)


def test_an_unwritable_state_directory_keeps_the_count_for_later(
    tmp_path: Path, state: Path
) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    state.write_text("")  # a file where the directory should be: nothing can be written
    outcomes.record_failure(ckpt, OSError(errno.ENOSPC, "full"))
    outcomes.record_failure(ckpt, OSError(errno.EIO, "io"))
    state.unlink()
    outcomes.record_success(ckpt)
    got = status(state, ckpt)
    assert got.failures == {"enospc": 1, "eio": 1} and got.last_success is not None


def test_the_exporter_refuses_a_status_file_about_another_directory(
    tmp_path: Path, state: Path
) -> None:
    ckpt = tmp_path / "ckpt"
    path = status_path(state, ckpt)
    path.parent.mkdir(parents=True)
    path.write_bytes(SaveStatus("/elsewhere", {"enospc": 1}).encode())
    with pytest.raises(SaveStatusError, match="another directory"):
        read_status(state, CheckpointTarget("r", "primary", ckpt))
    path.write_bytes(SaveStatus(str(ckpt), {"enospc": 1}).encode())
    got = read_status(state, CheckpointTarget("r", "primary", ckpt))
    assert got is not None and got.failures == {"enospc": 1}


@pytest.mark.parametrize(
    "doc",
    [
        {"format": 2},
        {"failures": {"enoent": 1}},
        {"failures": {"enospc": -1}},
        {"failures": {"enospc": True}},
        {"last_success": "yesterday"},
        {"last_failure": float("inf")},
        {"directory": ""},
        {"extra": 1},
    ],
)
def test_a_bad_status_file_is_refused(doc: dict[str, Any]) -> None:
    good = json.loads(SaveStatus("/ckpt", {"enospc": 1}, 1.0, 2.0).encode())
    assert parse_status(json.dumps(good).encode()).failures == {"enospc": 1}
    with pytest.raises(SaveStatusError):
        parse_status(json.dumps({**good, **doc}).encode())
