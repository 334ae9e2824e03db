"""Report a Hugging Face ``Trainer`` run to the trainguard exporter in one line::

    from trainguard.integrations.transformers import TrainguardCallback

    trainer = Trainer(model, args, train_dataset=data, callbacks=[TrainguardCallback()])

Every optimizer step is reported (``state.global_step``) with the last logged loss, learning
rate, grad norm and throughput; ``args.output_dir`` is announced as the checkpoint location
with the Trainer's ``checkpoint-{step}`` directories (layout ``huggingface``: complete once
``trainer_state.json`` is written); the end of ``train()`` is a clean
finish; a ``train()`` that raises (nothing tells a callback: seen at exit, or by the next
``train()``) a failure. The run is named ``name``, else ``$TRAINGUARD_RUN``, else
``args.run_name``, else the last component of ``args.output_dir``; under ``torchrun`` or
``accelerate launch`` each process reports as its global rank (``args.process_index``).
"""

from __future__ import annotations

import os
from typing import Any

from trainguard.integrations._common import RunLife, missing_framework, run_name
from trainguard.run.reporter import Run

try:
    from transformers import TrainerCallback
except ImportError as exc:  # transformers missing, or broken by its own dependencies
    raise missing_framework("transformers", "transformers", exc) from exc

__all__ = ["CHECKPOINT_LAYOUT", "CHECKPOINT_PATTERN", "TrainguardCallback"]

#: the Trainer's checkpoint directories, ``<output_dir>/checkpoint-<global step>``
CHECKPOINT_PATTERN = "checkpoint-{step}"
#: a step directory is complete once ``trainer_state.json``, written last, is in it
CHECKPOINT_LAYOUT = "huggingface"


class TrainguardCallback(TrainerCallback):
    """Report a Hugging Face Trainer's run to the trainguard exporter, with no change to the loop.

    The Trainer owns the training loop, so a callback is the one place that sees every step,
    log, checkpoint and the end of ``train()``. ``name`` overrides the run's name (else
    ``$TRAINGUARD_RUN``, the Trainer's ``run_name``, the last component of ``output_dir``); the
    other keyword arguments go to :class:`trainguard.Run` (``mirrors``, ``log_file``,
    ``state_dir``, ``oom_snapshots``, ``interval``...). ``run`` is the ``Run`` once training
    started. The ``output_dir``'s ``checkpoint-{step}`` directories are announced to the
    exporter (docs/integrations.md).

    Example::

        from trainguard import checkpoint
        from trainguard.integrations.transformers import TrainguardCallback

        trainer = Trainer(model, args, train_dataset=data, callbacks=[TrainguardCallback()])
        found = checkpoint.latest(args.output_dir, pattern="checkpoint-{step}")
        trainer.train(resume_from_checkpoint=str(found.path) if found else None)
    """

    def __init__(self, name: str | None = None, **run_kwargs: Any) -> None:
        for key in ("checkpoint_dir", "checkpoint_pattern", "checkpoint_layout", "rank"):
            if key in run_kwargs:
                raise TypeError(
                    f"TrainguardCallback: {key} comes from the Trainer's arguments, not from "
                    "the callback"
                )
        self._name = name
        self._life = RunLife(run_kwargs)

    @property
    def run(self) -> Run | None:
        return self._life.run

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._life.run is not None and not self._life.ended:
            self._life.fail(None)  # a train() before this one raised, and the script went on
        output_dir = os.fspath(args.output_dir) if args.output_dir else None
        name = run_name(self._name, args.run_name, output_dir)
        self._life.start(
            name, int(args.process_index), output_dir, CHECKPOINT_PATTERN, CHECKPOINT_LAYOUT
        )

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._life.step(state.global_step)

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any
    ) -> None:
        if logs:
            self._life.log(logs)
            self._life.step(state.global_step)  # with the scalars just logged

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._life.finish()
