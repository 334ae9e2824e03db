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
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from typing import Any

from trainguard.integrations._common import RunLife, as_float, missing_framework, run_name
from trainguard.run.reporter import Run
from trainguard.shared.pattern import checkpoint_pattern_problem

try:
    from lightning.pytorch.callbacks import Callback, ModelCheckpoint
except ImportError as exc:  # lightning missing, or broken by its own dependencies
    raise missing_framework("lightning", "lightning", exc) from exc

__all__ = ["TrainguardCallback", "checkpoint_pattern"]

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


class TrainguardCallback(Callback):
    """``callbacks=[TrainguardCallback()]``. ``name`` overrides the run's name; the other
    keyword arguments go to :class:`trainguard.Run` (``mirrors``, ``log_file``, ``state_dir``,
    ``oom_snapshots``, ``interval``...). ``run`` is the ``Run`` once ``fit()`` started."""

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
