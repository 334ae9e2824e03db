"""Report a Lightning run to the trainguard exporter in one line.

Add the callback::

    import lightning as L
    from trainguard.integrations.lightning import TrainguardCallback

    trainer = L.Trainer(max_steps=1000, callbacks=[TrainguardCallback()])

Every optimizer step is reported (``trainer.global_step``); every ``log_every_n_steps`` the
loss (what ``training_step`` returned), the learning rate and what the module logged under a
known name (``loss``, ``train/loss``, ``lr``, ``*samples_per_sec``...) come with it, read when
Lightning itself reads its logged values, so a GPU is not synchronised at every step. The
``ModelCheckpoint``'s ``dirpath`` is announced with the pattern of its file names, Lightning's
default ``epoch=0-step=500.ckpt`` (``epoch={epoch}-step={step}``) or any ``filename=`` holding
``{step}`` (metric values too: only the step orders checkpoints); ``fit()`` ending is a clean
finish, an exception (``on_exception``) a failure. The run is named ``name``, else
``$TRAINGUARD_RUN``, else the last component of the trainer's ``default_root_dir``; each
process reports as ``trainer.global_rank``.

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

from trainguard.checkpoint.outcomes import record_failure, tracked
from trainguard.checkpoint.save import save
from trainguard.integrations._common import RunLife, as_float, missing_framework, run_name
from trainguard.integrations.timing import StepClock
from trainguard.run.job import resolve_job
from trainguard.run.reporter import Run
from trainguard.shared.manifest import remove_record
from trainguard.shared.pattern import CheckpointPattern, checkpoint_pattern_problem

try:
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
    from lightning.fabric.utilities.cloud_io import _is_local_file_protocol
    from lightning.pytorch.callbacks import Callback, ModelCheckpoint
    from lightning.pytorch.plugins.io.wrapper import _WrappingCheckpointIO
    from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, SingleDeviceStrategy
    from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
except ImportError as exc:  # lightning missing, or broken by its own dependencies
    raise missing_framework("lightning", "lightning", exc) from exc

__all__ = ["TrainguardCallback", "TrainguardCheckpointIO", "checkpoint_pattern"]

#: Lightning's default names (``epoch=0-step=500.ckpt``) and ``filename="{step}"``'s
#: (``step=500.ckpt``)
DEFAULT_PATTERN = "*step={step}"

log = logging.getLogger("trainguard.reporter")

#: a field's name the pattern grammar takes as ``{name}``; any other becomes ``*``
_FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
#: marks a field's value in a probed name (no file name holds a NUL)
_MARK = re.compile("\x00([0-9]+)\x00")


class _Probe:
    """A metric value that formats as a mark whatever its format spec (``{val_loss:.2f}``).

    Then the name Lightning builds shows where each field's value goes.
    """

    def __init__(self, index: int) -> None:
        self.mark = f"\x00{index}\x00"

    def __format__(self, spec: str) -> str:
        return self.mark


def checkpoint_pattern(mc: Any) -> tuple[str | None, str | None]:
    """(trainguard's pattern for ``mc``'s files, None) or (None, why there is none).

    Lightning builds each name from its ``filename`` template (default ``{epoch}-{step}``,
    with ``auto_insert_metric_name`` giving ``epoch=0-step=3.ckpt``). The template is run
    through the ModelCheckpoint's own ``format_checkpoint_name`` with a mark for each field, so
    the pattern follows whatever this Lightning version does (the ``=``, the extension): the
    step's mark becomes ``{step}``, every other field's ``{name}`` (any value; only the step
    orders checkpoints), the ``.ckpt`` left to the pattern's implied extension:
    ``epoch={epoch}-step={step}``, ``step={step}`` for ``filename="{step}"``.
    """
    template = mc.filename or "{epoch}" + mc.CHECKPOINT_JOIN_CHAR + "{step}"
    fields = sorted({g[1:] for g in re.findall(r"(\{.*?)[:\}]", template)})
    if "step" not in fields:
        return None, (
            f"its file name {template!r} holds no {{step}}: add it, e.g. "
            "ModelCheckpoint(filename='{epoch}-{step}') (Lightning's default), so that "
            "checkpoints can be ordered by step"
        )
    probes = {name: _Probe(i) for i, name in enumerate(fields)}
    try:
        full = os.fspath(mc.format_checkpoint_name(dict(probes)))
    except (KeyError, ValueError, TypeError, IndexError, AttributeError) as exc:
        return None, f"cannot read its file name {template!r}: {exc}"
    prefix = os.path.join(os.fspath(mc.dirpath), "") if mc.dirpath else ""
    name = full[len(prefix) :] if full.startswith(prefix) else os.path.basename(full)
    if "/" in name or os.sep in name:
        return None, f"its file name {template!r} puts checkpoints in subdirectories"
    extension = getattr(mc, "FILE_EXTENSION", "")
    if extension and name.endswith(extension):  # a file's extension is implied by the pattern
        name = name[: -len(extension)]
    pieces = []
    for i, piece in enumerate(_MARK.split(name)):
        if i % 2 == 0:
            pieces.append(piece.replace("{", "{{").replace("}", "}}"))
            continue
        field = fields[int(piece)]
        if field == "step":
            pieces.append("{step}")
        else:
            pieces.append(f"{{{field}}}" if _FIELD_NAME.fullmatch(field) else "*")
    pattern = "".join(pieces)
    problem = checkpoint_pattern_problem(pattern)
    return (None, f"its file name {template!r}: {problem}") if problem else (pattern, None)


class TrainguardCheckpointIO(TorchCheckpointIO):
    """Lightning's ``CheckpointIO`` writing through :func:`trainguard.checkpoint.save`.

    A file whose name ``pattern`` gives a step (``step=500.ckpt``) is written to ``<name>.part``,
    fsynced, renamed and recorded (size, SHA-256), so that the exporter, ``latest`` and ``prune``
    can call it complete; a save killed midway leaves a ``.part`` and nothing complete under its
    name. Other names (``last.ckpt``) and remote paths (``s3://``) are written by Lightning as
    before, unrecorded. Loading is Lightning's; removing a checkpoint (``save_top_k``) removes its
    record too. Every local save's outcome is counted for the exporter (failures by reason,
    the last success: :mod:`trainguard.checkpoint.outcomes`), in the thread that writes: under
    Lightning's ``AsyncCheckpointIO`` (which wraps this one) a failure in its background
    thread is counted when it happens, not when Lightning re-raises it at the next save.
    ``TrainguardCallback`` installs it by itself; pass it yourself as
    ``Trainer(plugins=[TrainguardCheckpointIO()])`` without the callback.
    """

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
            text = os.fspath(path)
            if not _is_local_file_protocol(text):  # remote: no location to count it in
                super().save_checkpoint(checkpoint, path, storage_options)
                return
            with tracked(os.path.dirname(os.path.abspath(text))):  # last.ckpt: counted too
                super().save_checkpoint(checkpoint, path, storage_options)
            return
        directory = os.path.dirname(os.path.abspath(os.fspath(path)))
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as exc:
            record_failure(directory, exc)
            raise
        save(checkpoint, os.fspath(path), pattern=self.pattern)  # counts its own outcome

    def remove_checkpoint(self, path: Any) -> None:
        """Remove the file first, then its record, as ``prune`` does.

        Killed in between, a record without its file is ignored by the exporter and removed by
        the next ``prune``.
        """
        super().remove_checkpoint(path)
        if self._recorded(path):
            text = os.path.abspath(os.fspath(path))
            remove_record(os.path.dirname(text), os.path.basename(text))


def install_checkpoint_io(strategy: Any, pattern: str) -> str | None:
    """Put a :class:`TrainguardCheckpointIO` for ``pattern`` in ``strategy``.

    In place of Lightning's default ``TorchCheckpointIO``, or as the base of a wrapper around it
    (``AsyncCheckpointIO``); a ``TrainguardCheckpointIO`` already there gets ``pattern``. None when
    done, else why not (a custom ``CheckpointIO`` is left alone).
    """
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


def launcher_job(strategy: Any) -> str | None:
    """``lightning@<MASTER_ADDR>:<MASTER_PORT>`` for DDP ranks that no launcher identifies.

    ``Trainer(strategy="ddp", devices=N)`` run as a plain script starts the script again for
    each rank after 0 and sets none of the variables a job identity comes from
    (:mod:`trainguard.run.job`), so its ranks would each be a lone process to the rules (no
    TrainingJobRankDied for the job). Its rendezvous address, the same for every rank of one
    launch, names the job (launcher ``user``, as ``Run(job=...)``); as torchrun's fallback, a
    later launch on the same address gets the same id. None when the environment names the job
    (torchrun, Slurm, ``$TRAINGUARD_JOB``...), for other strategies (``ddp_spawn`` untested),
    or when the address is not set.
    """
    if not isinstance(getattr(strategy, "launcher", None), _SubprocessScriptLauncher):
        return None
    if resolve_job() is not None:
        return None
    addr, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
    return f"lightning@{addr}:{port}" if addr and port else None


class TrainguardCallback(Callback):
    """Report a Lightning run to the trainguard exporter, with crash-safe checkpoint files.

    Lightning owns the training loop, so a callback is the one place that sees every step, the
    checkpoints and the end of ``fit()``. ``name`` overrides the run's name (else
    ``$TRAINGUARD_RUN``, else the last component of ``default_root_dir``); the other keyword
    arguments go to :class:`trainguard.Run` (``mirrors``, ``log_file``, ``state_dir``,
    ``oom_snapshots``, ``interval``...). ``run`` is the ``Run`` once ``fit()`` set up: it
    reports from there, starting (not judged on progress) until ``on_fit_start``, so that a
    resume that dies loading ``ckpt_path`` is a death (docs/heartbeat.md#starting). Each
    checkpoint the ``ModelCheckpoint`` names by step (its default ``epoch=0-step=500.ckpt``)
    is written through ``TrainguardCheckpointIO`` and its location announced
    (docs/integrations.md).

    Example::

        from trainguard import checkpoint
        from trainguard.integrations.lightning import TrainguardCallback

        ckpt = ModelCheckpoint(dirpath="ckpt/", every_n_train_steps=500)
        trainer = L.Trainer(max_steps=10_000, callbacks=[ckpt, TrainguardCallback()])
        found = checkpoint.latest("ckpt/", pattern="epoch={epoch}-step={step}")
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
        self._clock = StepClock()

    @property
    def run(self) -> Run | None:
        return self._life.run

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        # before any checkpoint is saved or loaded; the ModelCheckpoint's dirpath may not be
        # resolved yet, but its file names are
        mc = trainer.checkpoint_callback
        if stage != "fit":
            return
        # report before fit(ckpt_path=...) loads the checkpoint (before on_fit_start), so that
        # a relaunch dying there is seen; starting until on_fit_start (docs/heartbeat.md)
        self._life.prepare(*self._identity(trainer, warn=False), job=launcher_job(trainer.strategy))
        if not isinstance(mc, ModelCheckpoint):
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
        self._life.start(*self._identity(trainer, warn=True), job=launcher_job(trainer.strategy))

    def _identity(self, trainer: Any, *, warn: bool) -> tuple[str, int, str | None, Any, str]:
        """(name, rank, checkpoint dir, pattern, layout): the dir once the ModelCheckpoint has it.

        Single files, written in place: no step directories to judge (layout ``files``).
        """
        name = run_name(self._name, trainer.default_root_dir)
        checkpoint_dir, pattern = None, None
        mc = trainer.checkpoint_callback
        if isinstance(mc, ModelCheckpoint) and mc.dirpath:
            pattern, why = checkpoint_pattern(mc)
            if pattern is None:
                if warn:
                    log.warning(
                        "trainguard: run %r: checkpoints in %s not announced: %s",
                        name,
                        mc.dirpath,
                        why,
                    )
            else:
                checkpoint_dir = os.fspath(mc.dirpath)
        return name, int(trainer.global_rank), checkpoint_dir, pattern, "files"

    # Who is slow: the wait for a batch runs from one batch's end to the next one's start;
    # computing from there to the backward, whose gradient all-reduce waits for the slowest
    # rank (docs/metrics.md#who-is-slow).
    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        self._clock.compute_started(cuda=pl_module.device.type == "cuda")

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        self._clock.compute_ended()

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._clock.interrupted()

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: Any) -> None:
        self._clock.interrupted()

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        every = trainer.log_every_n_steps
        if every and step % every == 0:
            self._life.log(self._logged(trainer, outputs))
        self._life.step(step, self._clock.take())
        self._clock.step_ended()

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
