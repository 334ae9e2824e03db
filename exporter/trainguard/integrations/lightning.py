"""Report a Lightning run to the trainguard exporter in one line::

    import lightning as L
    from trainguard.integrations.lightning import TrainguardCallback

    trainer = L.Trainer(max_steps=1000, callbacks=[TrainguardCallback()])

Every optimizer step is reported (``trainer.global_step``); every ``log_every_n_steps`` the
loss (what ``training_step`` returned), the learning rate and what the module logged under a
known name (``loss``, ``train/loss``, ``lr``, ``*samples_per_sec``...) come with it, read when
Lightning itself reads its logged values, so a GPU is not synchronised at every step. The
``ModelCheckpoint``'s ``dirpath`` is announced with its file pattern when its file name holds
no value other than the step (``ModelCheckpoint(filename="{step}")`` writes
``step=500.ckpt``); ``fit()`` ending is a clean finish, an exception (``on_exception``) a
failure. The run is named ``name``, else ``$TRAINGUARD_RUN``, else the last component of the
trainer's ``default_root_dir``; each process reports as ``trainer.global_rank``.

Checkpoints: in ``setup()`` the callback puts :class:`TrainguardCheckpointIO` in place of
Lightning's default ``TorchCheckpointIO`` (single device and DDP, where only rank 0 saves), so
that every ``.ckpt`` the pattern names is written by :func:`trainguard.checkpoint.save`
(``.part``, fsync, rename, a record with size and SHA-256) and can be judged complete.
Lightning's own writer pickles into memory and moves a temporary file from the system's
temporary directory with ``shutil.move`` (a copy in place across filesystems), with no fsync.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from typing import Any

from trainguard.checkpoint.save import save
from trainguard.integrations._common import RunLife, as_float, missing_framework, run_name
from trainguard.run.reporter import Run
from trainguard.shared.manifest import remove_record
from trainguard.shared.pattern import CheckpointPattern, checkpoint_pattern_problem

try:
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
    from lightning.fabric.utilities.cloud_io import _is_local_file_protocol
    from lightning.pytorch.callbacks import Callback, ModelCheckpoint
    from lightning.pytorch.plugins.io.wrapper import _WrappingCheckpointIO
    from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, SingleDeviceStrategy
except ImportError as exc:  # lightning missing, or broken by its own dependencies
    raise missing_framework("lightning", "lightning", exc) from exc

__all__ = ["TrainguardCallback", "TrainguardCheckpointIO", "checkpoint_pattern"]

#: what ``ModelCheckpoint(filename="{step}")`` names its files (``step=500.ckpt``)
DEFAULT_PATTERN = "step={step}"

log = logging.getLogger("trainguard.reporter")

#: a step no real run reaches, formatted through the ModelCheckpoint to find the step's place
_PROBE_STEP = 918273645


def checkpoint_pattern(mc: Any) -> tuple[str | None, str | None]:
    """(trainguard's pattern for ``mc``'s files, None) or (None, why there is none): the
    pattern must tell a checkpoint's step from its name and nothing else may vary in it."""
    filename = mc.filename or "{epoch}" + mc.CHECKPOINT_JOIN_CHAR + "{step}"
    fields = {name.strip("{") for name in re.findall(r"(\{.*?)[:\}]", filename)}
    if fields != {"step"}:
        other = sorted(fields - {"step"}) or ["no {step}"]
        return None, (
            f"its file name {filename!r} holds {', '.join(other)} besides the step: "
            "use ModelCheckpoint(filename='{step}') so that each checkpoint is named by its step"
        )
    name = os.path.basename(mc.format_checkpoint_name({"step": _PROBE_STEP}))
    if name.count(str(_PROBE_STEP)) != 1:
        return None, f"cannot tell the step's place in its file name {name!r}"
    pattern = name.replace(str(_PROBE_STEP), "{step}")
    problem = checkpoint_pattern_problem(pattern)
    return (None, problem) if problem else (pattern, None)


class TrainguardCheckpointIO(TorchCheckpointIO):
    """Lightning's ``CheckpointIO`` writing through :func:`trainguard.checkpoint.save`: a file
    whose name ``pattern`` gives a step (``step=500.ckpt``) is written to ``<name>.part``,
    fsynced, renamed and recorded (size, SHA-256), so that the exporter, ``latest`` and
    ``prune`` can call it complete; a save killed midway leaves a ``.part`` and nothing
    complete under its name. Other names (``last.ckpt``) and remote paths (``s3://``) are
    written by Lightning as before, unrecorded. Loading is Lightning's; removing a checkpoint
    (``save_top_k``) removes its record too. ``TrainguardCallback`` installs it by itself;
    pass it yourself as ``Trainer(plugins=[TrainguardCheckpointIO()])`` without the
    callback."""

    def __init__(self, pattern: str = DEFAULT_PATTERN) -> None:
        super().__init__()
        self._pattern = CheckpointPattern(pattern)  # raises on a pattern without one {step}

    @property
    def pattern(self) -> str:
        return self._pattern.pattern

    @pattern.setter
    def pattern(self, pattern: str) -> None:
        self._pattern = CheckpointPattern(pattern)

    def _recorded(self, path: Any) -> bool:
        """Whether trainguard writes (and records) ``path``: local, and named by the pattern."""
        text = os.fspath(path)
        return (
            _is_local_file_protocol(text) and self._pattern.step(os.path.basename(text)) is not None
        )

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        if storage_options is not None or not self._recorded(path):
            super().save_checkpoint(checkpoint, path, storage_options)  # its own TypeError too
            return
        os.makedirs(os.path.dirname(os.path.abspath(os.fspath(path))), exist_ok=True)
        save(checkpoint, os.fspath(path), pattern=self.pattern)

    def remove_checkpoint(self, path: Any) -> None:
        """The file first, then its record, as ``prune`` does: killed in between, a record
        without its file is ignored by the exporter and removed by the next ``prune``."""
        super().remove_checkpoint(path)
        if self._recorded(path):
            text = os.path.abspath(os.fspath(path))
            remove_record(os.path.dirname(text), os.path.basename(text))


def install_checkpoint_io(strategy: Any, pattern: str) -> str | None:
    """Put a :class:`TrainguardCheckpointIO` for ``pattern`` in ``strategy``: in place of
    Lightning's default ``TorchCheckpointIO``, or as the base of a wrapper around it
    (``AsyncCheckpointIO``); a ``TrainguardCheckpointIO`` already there gets ``pattern``.
    None when done, else why not (a custom ``CheckpointIO`` is left alone)."""
    if isinstance(strategy, DeepSpeedStrategy) or not isinstance(
        strategy, (SingleDeviceStrategy, DDPStrategy)
    ):
        return (
            f"the strategy {type(strategy).__name__} saves its own way (only single-device and "
            "DDP strategies are covered)"
        )
    io = strategy.checkpoint_io
    holder = io if isinstance(io, _WrappingCheckpointIO) else None
    base = holder.checkpoint_io if holder is not None else io
    if isinstance(base, TrainguardCheckpointIO):
        base.pattern = pattern
        return None
    if type(base) is not TorchCheckpointIO:
        return (
            f"its CheckpointIO is {type(base).__name__}, not Lightning's default: write the "
            "files through trainguard.checkpoint.save in it (or subclass TrainguardCheckpointIO), "
            "or set trust_unrecorded for the location in the exporter's config"
        )
    ours = TrainguardCheckpointIO(pattern)
    if holder is None:
        strategy.checkpoint_io = ours
    else:  # its setter refuses once a base is set; the strategy's getter sets one
        holder._checkpoint_io = ours
    return None


class TrainguardCallback(Callback):
    """Report a Lightning run to the trainguard exporter, with crash-safe checkpoint files.

    Lightning owns the training loop, so a callback is the one place that sees every step, the
    checkpoints and the end of ``fit()``. ``name`` overrides the run's name (else
    ``$TRAINGUARD_RUN``, else the last component of ``default_root_dir``); the other keyword
    arguments go to :class:`trainguard.Run` (``mirrors``, ``log_file``, ``state_dir``,
    ``oom_snapshots``, ``interval``...). ``run`` is the ``Run`` once ``fit()`` started. With
    ``ModelCheckpoint(filename="{step}")`` each ``step=N.ckpt`` is written through
    ``TrainguardCheckpointIO`` and its location announced (docs/integrations.md).

    Example::

        from trainguard import checkpoint
        from trainguard.integrations.lightning import TrainguardCallback

        ckpt = ModelCheckpoint(dirpath="ckpt/", filename="{step}")
        trainer = L.Trainer(max_steps=10_000, callbacks=[ckpt, TrainguardCallback()])
        found = checkpoint.latest("ckpt/", pattern="step={step}")
        trainer.fit(model, data, ckpt_path=str(found.path) if found else None)
    """

    def __init__(self, name: str | None = None, **run_kwargs: Any) -> None:
        for key in ("checkpoint_dir", "checkpoint_pattern", "checkpoint_layout", "rank"):
            if key in run_kwargs:
                raise TypeError(
                    f"TrainguardCallback: {key} comes from the Trainer and its ModelCheckpoint, "
                    "not from the callback"
                )
        self._name = name
        self._life = RunLife(run_kwargs)

    @property
    def run(self) -> Run | None:
        return self._life.run

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        # before any checkpoint is saved or loaded; the ModelCheckpoint's dirpath may not be
        # resolved yet, but its file names are
        mc = trainer.checkpoint_callback
        if stage != "fit" or not isinstance(mc, ModelCheckpoint):
            return
        pattern, why = checkpoint_pattern(mc)
        if pattern is not None:
            why = install_checkpoint_io(trainer.strategy, pattern)
        if why is not None:
            log.warning(
                "trainguard: Lightning's checkpoints are written without a trainguard record, "
                "so none is ever called complete: %s",
                why,
            )

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        # after every callback's setup(): the ModelCheckpoint's dirpath is resolved by now
        name = run_name(self._name, trainer.default_root_dir)
        checkpoint_dir, pattern = None, None
        mc = trainer.checkpoint_callback
        if isinstance(mc, ModelCheckpoint) and mc.dirpath:
            pattern, why = checkpoint_pattern(mc)
            if pattern is None:
                log.warning(
                    "trainguard: run %r: checkpoints in %s not announced: %s", name, mc.dirpath, why
                )
            else:
                checkpoint_dir = os.fspath(mc.dirpath)
        # single files, written in place: no step directories to judge
        self._life.start(name, int(trainer.global_rank), checkpoint_dir, pattern, "files")

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        every = trainer.log_every_n_steps
        if every and step % every == 0:
            self._life.log(self._logged(trainer, outputs))
        self._life.step(step)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._life.finish()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._life.fail(exception)

    @staticmethod
    def _logged(trainer: Any, outputs: Any) -> Mapping[str, Any]:
        logged: dict[str, Any] = dict(trainer.callback_metrics)
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if loss is not None:
            logged["loss"] = loss
        optimizers = trainer.optimizers
        if optimizers and optimizers[0].param_groups:
            lr = as_float(optimizers[0].param_groups[0].get("lr"))
            if lr is not None:
                logged["lr"] = lr
        return logged
