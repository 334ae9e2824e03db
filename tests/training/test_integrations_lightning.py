"""Lightning's checkpoints through trainguard, in process with the real Lightning on CPU (a
one-layer model, a few steps): the callback installs ``TrainguardCheckpointIO``, every
``step=N.ckpt`` is recorded and verifiable, ``save_top_k`` removes a record with its file,
``fit(ckpt_path=latest(...))`` resumes there, and a custom ``CheckpointIO`` is left alone with
a warning. Killed mid-save: tests/training/test_integrations_e2e.py."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

L = pytest.importorskip("lightning")

import torch  # noqa: E402
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO  # noqa: E402
from lightning.pytorch.callbacks import Callback, ModelCheckpoint  # noqa: E402
from lightning.pytorch.plugins.io import AsyncCheckpointIO  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from trainguard import checkpoint  # noqa: E402
from trainguard.integrations.lightning import (  # noqa: E402
    TrainguardCallback,
    TrainguardCheckpointIO,
)
from trainguard.shared.manifest import read_all_records  # noqa: E402

PATTERN = "step={step}"


class Module(L.LightningModule):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class StartStep(Callback):  # type: ignore[misc]
    """The global step training starts from (after any checkpoint was restored)."""

    step: int | None = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.step = trainer.global_step


def fit(
    root: Path,
    max_steps: int,
    *,
    top_k: int = -1,
    plugins: list[Any] | None = None,
    ckpt_path: str | None = None,
) -> tuple[Any, StartStep]:
    torch.manual_seed(0)
    x = torch.randn(32, 4)
    start = StartStep()
    trainer = L.Trainer(
        default_root_dir=root,
        max_steps=max_steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        plugins=plugins,
        callbacks=[
            ModelCheckpoint(
                dirpath=root / "ckpt",
                filename="{step}",
                every_n_train_steps=2,
                save_top_k=top_k,
                monitor="step" if top_k > 0 else None,
                mode="max",
            ),
            TrainguardCallback(state_dir=root / "state", interval=0.05),
            start,
        ],
    )
    data = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=4)
    trainer.fit(Module(), data, ckpt_path=ckpt_path)
    return trainer, start


def test_checkpoints_are_recorded_pruned_with_their_records_and_resumed_from(
    tmp_path: Path,
) -> None:
    trainer, _ = fit(tmp_path, 6, top_k=2)
    assert type(trainer.strategy.checkpoint_io) is TrainguardCheckpointIO
    ckpt = tmp_path / "ckpt"
    # step=2.ckpt removed by save_top_k: its record with it
    assert sorted(p.name for p in ckpt.glob("*.ckpt")) == ["step=4.ckpt", "step=6.ckpt"]
    records = read_all_records(ckpt)
    assert sorted(records) == ["step=4.ckpt", "step=6.ckpt"]
    assert records["step=6.ckpt"].size == (ckpt / "step=6.ckpt").stat().st_size
    found = checkpoint.latest(ckpt, pattern=PATTERN, verify_hash=True, grace=0)
    assert found is not None and found.step == 6
    _, start = fit(tmp_path, 8, top_k=2, ckpt_path=str(found.path))
    assert start.step == 6  # restored from what latest() returned


def test_a_wrapped_default_checkpoint_io_gets_trainguard_as_its_base(tmp_path: Path) -> None:
    trainer, _ = fit(tmp_path, 2, plugins=[AsyncCheckpointIO()])
    io = trainer.strategy.checkpoint_io
    assert isinstance(io, AsyncCheckpointIO)
    assert type(io.checkpoint_io) is TrainguardCheckpointIO
    assert sorted(read_all_records(tmp_path / "ckpt")) == ["step=2.ckpt"]  # teardown waited


class CustomIO(TorchCheckpointIO):  # type: ignore[misc]
    pass


def test_a_custom_checkpoint_io_is_left_alone_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    custom = CustomIO()
    with caplog.at_level(logging.WARNING, logger="trainguard.reporter"):
        trainer, _ = fit(tmp_path, 2, plugins=[custom])
    assert trainer.strategy.checkpoint_io is custom
    (warning,) = [r.getMessage() for r in caplog.records if "CheckpointIO" in r.getMessage()]
    assert "CustomIO" in warning and "trainguard.checkpoint.save" in warning
    assert (tmp_path / "ckpt" / "step=2.ckpt").exists()
    assert read_all_records(tmp_path / "ckpt") == {}


def test_a_name_the_pattern_does_not_give_is_written_by_lightning(tmp_path: Path) -> None:
    io = TrainguardCheckpointIO()
    io.save_checkpoint({"a": 1}, tmp_path / "last.ckpt")
    io.save_checkpoint({"a": 2}, tmp_path / "step=3.ckpt")
    assert sorted(read_all_records(tmp_path)) == ["step=3.ckpt"]
    assert io.load_checkpoint(tmp_path / "step=3.ckpt") == {"a": 2}
    io.remove_checkpoint(tmp_path / "step=3.ckpt")
    assert read_all_records(tmp_path) == {} and not (tmp_path / "step=3.ckpt").exists()
    with pytest.raises(ValueError, match="pattern"):
        TrainguardCheckpointIO("no-step")
