"""Lightning's checkpoints through trainguard, in process with the real Lightning on CPU (a
one-layer model, a few steps): the callback installs ``TrainguardCheckpointIO``, every
``step=N.ckpt`` is recorded and verifiable, ``save_top_k`` removes a record with its file,
``fit(ckpt_path=latest(...))`` resumes there, and a custom ``CheckpointIO`` is left alone with
a warning. Lightning's default ``ModelCheckpoint`` (``epoch=0-step=8.ckpt``, ``last.ckpt``,
``save_top_k=1``) is announced with no warning and its newest checkpoint is complete on a real
exporter. Killed mid-save: tests/training/test_integrations_e2e.py."""

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

from helpers.exporter_proc import Exporter, value  # noqa: E402
from trainguard import checkpoint  # noqa: E402
from trainguard.integrations.lightning import (  # noqa: E402
    TrainguardCallback,
    TrainguardCheckpointIO,
    checkpoint_pattern,
)
from trainguard.shared.manifest import read_all_records  # noqa: E402
from trainguard.shared.pattern import CheckpointPattern  # noqa: E402

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


@pytest.mark.parametrize("save_last", [True, "link"])
def test_the_default_model_checkpoint_is_announced_and_complete_with_no_warning(
    tmp_path: Path, save_last: bool | str, caplog: pytest.LogCaptureFixture
) -> None:
    """What most users run: ``ModelCheckpoint`` with its default names (``{epoch}-{step}``),
    ``save_top_k=1`` (each save deletes the one before) and ``last.ckpt`` (a copy, or with
    ``"link"`` a symbolic link): no trainguard warning, the newest checkpoint is recorded and
    the exporter calls it complete; ``last.ckpt`` and the deleted one are not damage."""
    torch.manual_seed(0)
    x = torch.randn(32, 4)  # 8 steps an epoch
    state = tmp_path / "state"
    trainer = L.Trainer(
        default_root_dir=tmp_path / "run",
        max_epochs=2,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[
            ModelCheckpoint(save_last=save_last),
            TrainguardCallback(state_dir=state, interval=0.05),
        ],
    )
    data = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=4)
    with caplog.at_level(logging.WARNING, logger="trainguard.reporter"):
        trainer.fit(Module(), data)
    assert [r.getMessage() for r in caplog.records if r.name == "trainguard.reporter"] == []
    ckpt = tmp_path / "run" / "checkpoints"  # Lightning's default dirpath without a logger
    assert sorted(p.name for p in ckpt.iterdir() if not p.name.startswith(".")) == [
        "epoch=1-step=16.ckpt",
        "last.ckpt",
    ]
    assert (ckpt / "last.ckpt").is_symlink() == (save_last == "link")
    assert sorted(read_all_records(ckpt)) == ["epoch=1-step=16.ckpt"]  # step 8's went with it
    found = checkpoint.latest(ckpt, pattern="epoch={epoch}-step={step}", verify_hash=True)
    assert found is not None and found.step == 16
    with Exporter(state_dir=state) as exp:
        s = exp.scrape()
    where = {"run": "run", "location": "primary"}
    assert value(s, "trainguard_checkpoint_location_up", **where) == 1
    assert value(s, "trainguard_checkpoint_last_step", **where) == 16
    assert value(s, "trainguard_checkpoint_files", **where) == 1
    for bad in ("unrecorded", "truncated", "partial", "oversized"):
        assert value(s, f"trainguard_checkpoint_{bad}_files", **where) == 0, bad


@pytest.mark.parametrize(
    ("kwargs", "pattern", "metrics"),
    [
        ({}, "epoch={epoch}-step={step}", {"epoch": 3}),  # Lightning's default
        ({"filename": "{step}"}, "step={step}", {}),
        (
            {"filename": "{epoch}-{step}-{val_loss:.2f}"},
            "epoch={epoch}-step={step}-val_loss={val_loss}",
            {"epoch": 1, "val_loss": torch.tensor(-0.1234)},
        ),
        (
            {"filename": "e{epoch:02d}_s{step:05d}", "auto_insert_metric_name": False},
            "e{epoch}_s{step}",
            {"epoch": 7},
        ),
    ],
)
def test_the_pattern_follows_lightnings_own_names(
    tmp_path: Path, kwargs: dict[str, Any], pattern: str, metrics: dict[str, Any]
) -> None:
    """The pattern announced for a ModelCheckpoint gives back the step of the names that
    ModelCheckpoint itself writes, whatever else they hold."""
    mc = ModelCheckpoint(dirpath=tmp_path, **kwargs)
    assert checkpoint_pattern(mc) == (pattern, None)
    name = Path(mc.format_checkpoint_name({"step": 1234, **metrics})).name
    assert CheckpointPattern(pattern).step(name) == 1234


@pytest.mark.parametrize(
    ("filename", "why"), [("{epoch}", "holds no {step}"), ("{val/loss}-{step}", "subdirectories")]
)
def test_names_without_a_step_are_not_announced(tmp_path: Path, filename: str, why: str) -> None:
    pattern, problem = checkpoint_pattern(ModelCheckpoint(dirpath=tmp_path, filename=filename))
    assert pattern is None and problem is not None and why in problem
