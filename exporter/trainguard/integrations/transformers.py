"""Report a Hugging Face ``Trainer`` run to the trainguard exporter in one line.

Add the callback::

    from trainguard.integrations.transformers import TrainguardCallback

    trainer = Trainer(model, args, train_dataset=data, callbacks=[TrainguardCallback()])

Every optimizer step is reported (``state.global_step``) with the last logged loss, learning
rate, grad norm and throughput; ``args.output_dir`` is announced as the checkpoint location
with the Trainer's ``checkpoint-{step}`` directories, each recorded (every file's size and
SHA-256, :func:`trainguard.checkpoint.adopt.record_dir`) by rank 0 at the Trainer's
``on_save``, once every rank has finished its part, so that it is complete at once and a file
of it cut short later is caught; a save that fails (the Trainer's own, which ends ``train()``,
or the record) is counted by reason for the exporter (:mod:`trainguard.checkpoint.outcomes`);
the end of ``train()`` is a clean finish; a ``train()`` that raises (nothing tells a callback:
seen at exit, or by the next ``train()``) a failure. The run
is named ``name``, else ``$TRAINGUARD_RUN``, else ``args.run_name``, else the last component of
``args.output_dir``; under ``torchrun`` or ``accelerate launch`` each process reports as its
global rank (``args.process_index``).
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
from typing import Any

from trainguard.checkpoint.adopt import forget_removed, record_dir
from trainguard.checkpoint.outcomes import record_failure, record_success
from trainguard.integrations._common import RunLife, missing_framework, run_name
from trainguard.integrations.timing import StepClock
from trainguard.run.reporter import Run
from trainguard.shared.manifest import ManifestError

try:
    from transformers import TrainerCallback
except ImportError as exc:  # transformers missing, or broken by its own dependencies
    raise missing_framework("transformers", "transformers", exc) from exc

__all__ = ["CHECKPOINT_LAYOUT", "CHECKPOINT_PATTERN", "TrainguardCallback"]

#: the Trainer's checkpoint directories, ``<output_dir>/checkpoint-<global step>``
CHECKPOINT_PATTERN = "checkpoint-{step}"
#: a step directory is complete once ``trainer_state.json``, written last, is in it (when
#: the callback did not record it)
CHECKPOINT_LAYOUT = "huggingface"

log = logging.getLogger("trainguard.reporter")


def _barrier() -> None:
    """Wait for every rank (each saves its own ``rng_state_<rank>.pth``), when several run."""
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - transformers' Trainer needs torch
        return
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


class TrainguardCallback(TrainerCallback):
    """Report a Hugging Face Trainer's run to the trainguard exporter, with no change to the loop.

    The Trainer owns the training loop, so a callback is the one place that sees every step,
    log, checkpoint and the end of ``train()``. ``name`` overrides the run's name (else
    ``$TRAINGUARD_RUN``, the Trainer's ``run_name``, the last component of ``output_dir``); the
    other keyword arguments go to :class:`trainguard.Run` (``mirrors``, ``log_file``,
    ``state_dir``, ``oom_snapshots``, ``interval``...). ``run`` is the ``Run`` once the
    Trainer is built. The ``output_dir``'s ``checkpoint-{step}`` directories are announced to the
    exporter, and each is recorded when the Trainer has saved it (``on_save``: every rank
    waits for the others, rank 0 fsyncs, hashes and records every file;
    ``checkpoint_hashes=False`` records sizes only, for models too large to hash at each
    save); records of directories the Trainer rotated away (``save_total_limit``) are
    removed (docs/integrations.md). The run reports from the end of ``Trainer(...)``, starting
    (not judged on progress) until ``train()`` begins: a resume that dies loading its
    checkpoint is a death, a script that only evaluates finishes (docs/heartbeat.md#starting).

    Example::

        from trainguard import checkpoint
        from trainguard.integrations.transformers import TrainguardCallback

        trainer = Trainer(model, args, train_dataset=data, callbacks=[TrainguardCallback()])
        found = checkpoint.latest(args.output_dir, pattern="checkpoint-{step}")
        trainer.train(resume_from_checkpoint=str(found.path) if found else None)
    """

    def __init__(
        self, name: str | None = None, *, checkpoint_hashes: bool = True, **run_kwargs: Any
    ) -> None:
        for key in ("checkpoint_dir", "checkpoint_pattern", "checkpoint_layout", "rank"):
            if key in run_kwargs:
                raise TypeError(
                    f"TrainguardCallback: {key} comes from the Trainer's arguments, not from "
                    "the callback"
                )
        self._name = name
        self._hashes = checkpoint_hashes
        self._life = RunLife(run_kwargs)
        #: the output_dir of a save the Trainer is about to make (None: none pending), and
        #: whether an evaluation comes before it: see _save_aborted
        self._pending_save: str | None = None
        self._evaluating = False
        atexit.register(lambda: self._save_aborted(getattr(sys, "last_value", None)))
        self._clock = StepClock()
        self._in_step = False  # between on_step_begin and on_step_end: forwards are training's
        self._cuda = False
        self._hooks: list[Any] = []

    @property
    def run(self) -> Run | None:
        return self._life.run

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # the end of Trainer(...): report before train() loads a checkpoint (before
        # on_train_begin), so that a relaunch dying there is seen; starting, so that a script
        # that only evaluates is not judged on training (docs/heartbeat.md#starting)
        self._life.prepare(*self._identity(args))

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._save_aborted(None)  # a train() before this one raised inside its save
        if self._life.run is not None and not self._life.ended and not self._life.starting:
            self._life.fail(None)  # a train() before this one raised, and the script went on
        self._life.start(*self._identity(args))
        self._hook_forward(kwargs.get("model"), args)

    def _identity(self, args: Any) -> tuple[str, int, str | None, str, str]:
        """(name, rank, checkpoint dir, pattern, layout) of the run, from the Trainer's args."""
        output_dir = os.fspath(args.output_dir) if args.output_dir else None
        name = run_name(self._name, args.run_name, output_dir)
        return name, int(args.process_index), output_dir, CHECKPOINT_PATTERN, CHECKPOINT_LAYOUT

    # Who is slow: the Trainer has no hook between forward and backward, so computing is timed
    # by forward hooks on the model (the part of a step surely before the gradient all-reduce);
    # the wait for data runs from one step's end to the next one's first forward, unless a log,
    # save or evaluation came between (docs/metrics.md#who-is-slow).
    def _hook_forward(self, model: Any, args: Any) -> None:
        self._unhook()
        if model is None or not hasattr(model, "register_forward_pre_hook"):
            return
        self._cuda = getattr(getattr(args, "device", None), "type", None) == "cuda"
        self._clock = StepClock()
        self._hooks = [
            model.register_forward_pre_hook(self._forward_start),
            model.register_forward_hook(self._forward_end),
        ]

    def _unhook(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks = []

    def _forward_start(self, module: Any, inputs: Any) -> None:
        if self._in_step:
            self._clock.compute_started(cuda=self._cuda)

    def _forward_end(self, module: Any, inputs: Any, output: Any) -> None:
        if self._in_step:
            self._clock.compute_ended()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._in_step = True

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._in_step = False
        self._life.step(state.global_step, self._clock.take())
        self._clock.step_ended()
        self._expect_save(args, control)

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._expect_save(args, control)

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._evaluating = False
        self._clock.interrupted()

    def _expect_save(self, args: Any, control: Any) -> None:
        """The Trainer saves right after this callback when ``should_save`` is set.

        A save still pending at the next step went nowhere (``save_strategy="best"`` changed
        its mind), since a failed one ends ``train()``.
        """
        save = bool(getattr(control, "should_save", False)) and bool(args.output_dir)
        self._pending_save = os.fspath(args.output_dir) if save else None
        self._evaluating = save and bool(getattr(control, "should_evaluate", False))

    def _save_aborted(self, exc: BaseException | None) -> None:
        """Count a failed save if ``train()`` ended inside the Trainer's save.

        The Trainer's own save raises out of ``train()`` and no callback hears of it: a save
        announced (``should_save``) whose ``on_save`` never came, with no evaluation still
        running before it, failed. Seen at the next ``train()`` (the script caught it and
        went on; the reason then from the disk's state) or at exit (``exc``: the uncaught
        exception, if any).
        """
        pending, self._pending_save = self._pending_save, None
        if pending is not None and not self._evaluating:
            reason = record_failure(pending, exc)
            log.warning(
                "trainguard: the Trainer's save into %s failed (%s); counted", pending, reason
            )

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any
    ) -> None:
        self._clock.interrupted()
        if logs:
            self._life.log(logs)
            self._life.step(state.global_step)  # with the scalars just logged

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # after the Trainer's _save_checkpoint (model, optimizer, RNG, trainer_state.json and
        # the rotation); each rank saved its own RNG state, so all wait for all
        self._pending_save = None
        self._clock.interrupted()
        _barrier()
        if not state.is_world_process_zero or not args.output_dir:
            return
        output_dir = os.fspath(args.output_dir)
        step_dir = os.path.join(output_dir, f"checkpoint-{state.global_step}")
        try:
            if os.path.isdir(step_dir):  # not under a hyperparameter search's run directory
                record_dir(step_dir, pattern=CHECKPOINT_PATTERN, hashing=self._hashes)
            forget_removed(output_dir, pattern=CHECKPOINT_PATTERN)
        except (OSError, ValueError, ManifestError) as exc:  # training goes on, unrecorded
            record_failure(output_dir, exc)  # its record is part of a complete save
            log.warning(
                "trainguard: %s not recorded (complete only once settled): %s", step_dir, exc
            )
        else:
            record_success(output_dir)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._unhook()
        self._life.finish()
