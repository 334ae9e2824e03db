"""``trainguard.Run``: the in-process side, reporting a training run to the exporter.

A training script creates one per process (rank) and calls ``run.step(step, loss=...)`` in its loop;
a background thread (:mod:`trainguard.run.reporter.writer`) turns the latest values into a
heartbeat file that the exporter reads at scrape time.

The training loop must never pay for this: ``step()`` only stores a tuple (no lock, no I/O,
no syscall beyond reading the clock). torch is never imported unless the script already imported
it (or asked for OOM snapshots).

How a run ends, as the exporter will see it (``finished``, ``failed``, or a death when
nothing was recorded): docs/heartbeat.md, "How a run ends".

``Run`` is the one public class of the training side: its docstring is the user's reference and
its constructor wires every part. The parts live in modules of their own (``run/signals.py``,
``run/stack.py``, ``run/timing.py``, ``run/scalar_health.py``, ``run/snapshots/``,
``run/deaths.py``, ``run/job.py``).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from trainguard.run.allocator import snapshot_devices
from trainguard.run.job import check_job_id, resolve_job, world_size
from trainguard.run.oom import OomGuard
from trainguard.run.options import (
    Schedule,
    abspath,
    check_config,
    check_naming,
    check_schedule,
    check_seconds,
    mirror_dirs,
    resolve_rank,
    type_name,
)
from trainguard.run.reporter.writer import _UNSET, HeartbeatWriter
from trainguard.run.snapshots.capture import Identity as SnapshotOwner
from trainguard.run.snapshots.capture import MemorySnapshots
from trainguard.shared import procinfo
from trainguard.shared.heartbeat.record import SUFFIX, heartbeat_filename
from trainguard.shared.statedir import default_state_dir


def _checked_options(
    name: str,
    checkpoint_pattern: str | None,
    checkpoint_layout: str | None,
    *,
    interval: float,
    keepalive: float,
    close_timeout: float,
    snapshot_steps: int | None,
    snapshot_seconds: float | None,
    snapshot_keep: int,
    oom_snapshots: bool,
    config: Any,
) -> tuple[Schedule, Any]:
    """Check :class:`Run`'s options; return the snapshots' schedule and the config as data.

    First, so that a bad argument raises a clear error in the script before anything is
    started or written (no thread, no signal handler, no heartbeat): the rank and the job are
    checked next, as they are resolved, still before the thread starts.
    """
    check_naming(name, checkpoint_pattern, checkpoint_layout)
    for label, value in (
        ("interval", interval),
        ("keepalive", keepalive),
        ("close_timeout", close_timeout),
    ):
        check_seconds(label, value)
    schedule = check_schedule(snapshot_steps, snapshot_seconds, snapshot_keep, oom_snapshots)
    return schedule, check_config(config)


class Run(HeartbeatWriter):
    """Report one training process (one rank of a run) to the trainguard exporter.

    A dead process cannot report its own death, so the run writes a heartbeat (its pid, step
    and scalars) from a background thread, and the exporter, watching from outside, reports a
    death when that pid is gone without a clean finish recorded.

    Args:
        name: the run's name, any printable text up to 128 characters; keep it the same
            across restarts (deaths are counted per name and rank).
        checkpoint_dir: where the run writes its checkpoints, for the exporter to watch.
        mirrors: ``{location name: directory}`` of the copies made with
            ``checkpoint.mirror``, watched as well.
        log_file: the training log, whose age the exporter publishes.
        state_dir: the heartbeat directory; default ``$TRAINGUARD_STATE_DIR``, else the
            per-user state directory (the exporter's default too).
        interval: seconds between the writer thread's wake-ups (default 1).
        rank: default the launcher's global rank (``$RANK``, ``$SLURM_PROCID``, MPI's),
            else ``$LOCAL_RANK``, else 0.
        job: the job of many ranks this one belongs to, the same on every node; default
            the launcher's (torchrun, Slurm, ``$TRAINGUARD_JOB``, MPI: docs/heartbeat.md).
        oom_snapshots: record the CUDA allocator's history, dump a memory snapshot at an OOM
            inside ``capture_oom()`` and answer ``trainguard snapshot RUN``
            (docs/snapshots.md).
        keepalive: rewrite an unchanged heartbeat at least this often, in seconds (default
            10).
        close_timeout: seconds ``close()`` waits for the final heartbeat on a slow disk
            (default 10).
        snapshot_steps: with ``oom_snapshots``, keep a rolling snapshot every N steps.
        snapshot_seconds: with ``oom_snapshots``, keep a rolling snapshot every N seconds.
        snapshot_keep: how many rolling (and requested) snapshots to keep (default 2).
        config: a mapping, an ``argparse.Namespace`` or a dataclass (at most 64 KiB as JSON),
            written into each snapshot's metadata, with its ``batch_size`` if it has one.
        checkpoint_pattern: the checkpoints' names, default ``step_{step}``;
            ``checkpoint-{step}`` for the Hugging Face Trainer's directories,
            ``epoch={epoch}-step={step}.ckpt`` for Lightning's default names (the grammar:
            docs/checkpoints.md#checkpoint-names).
        checkpoint_layout: how a step directory is committed, default ``auto``
            (docs/checkpoints.md).
        starting: the process has not begun training yet (a framework callback reporting
            before the framework loads a checkpoint): its death counts, its progress is not
            judged until :meth:`begin` (docs/heartbeat.md#starting).

    Example::

        with trainguard.Run("llama-ft", checkpoint_dir="/data/ckpt") as run:
            for step in range(1, total_steps + 1):
                loss = train_one_step()
                run.step(step, loss=loss)     # no I/O here: the writer thread does it

    Leaving the ``with`` block normally records a clean finish, an exception a failure; a
    ``kill -9`` records nothing, which the exporter reports as a death.
    """

    def __init__(
        self,
        name: str,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        mirrors: Mapping[str, str | os.PathLike[str]] | None = None,
        log_file: str | os.PathLike[str] | None = None,
        state_dir: str | os.PathLike[str] | None = None,
        *,
        interval: float = 1.0,
        rank: int | None = None,
        oom_snapshots: bool = False,
        keepalive: float = 10.0,
        close_timeout: float = 10.0,
        snapshot_steps: int | None = None,
        snapshot_seconds: float | None = None,
        snapshot_keep: int = 2,
        config: Any = None,
        checkpoint_pattern: str | None = None,
        checkpoint_layout: str | None = None,
        job: str | None = None,
        starting: bool = False,
    ) -> None:
        schedule, experiment = _checked_options(
            name,
            checkpoint_pattern,
            checkpoint_layout,
            interval=interval,
            keepalive=keepalive,
            close_timeout=close_timeout,
            snapshot_steps=snapshot_steps,
            snapshot_seconds=snapshot_seconds,
            snapshot_keep=snapshot_keep,
            oom_snapshots=bool(oom_snapshots),
            config=config,
        )
        self._place(name, rank, job, state_dir)
        self._checkpoint_dir = abspath(checkpoint_dir)
        self._checkpoint_pattern = checkpoint_pattern
        self._checkpoint_layout = checkpoint_layout
        self._mirrors = mirror_dirs(mirrors)
        self._log_file = abspath(log_file)
        self._identify_process(bool(starting))
        super().__init__(interval, keepalive, close_timeout)
        self._snapshots = self._memory_snapshots(bool(oom_snapshots), schedule, experiment)
        self._snapshots.start()
        self._start_writer()

    def _place(
        self, name: str, rank: int | None, job: str | None, state_dir: str | os.PathLike[str] | None
    ) -> None:
        """Who this process is in its run and job, and the heartbeat file that says so.

        Resolved once, from the arguments or else the launcher's environment: the heartbeat's
        name is derived from the run's name and rank, and must not move while the run lives.
        """
        self.name = name
        self.rank = resolve_rank(rank)
        self.world_size = world_size()
        self.job = resolve_job(None if job is None else check_job_id(job))
        base = Path(state_dir).expanduser() if state_dir is not None else default_state_dir()
        self.state_dir = Path(os.path.abspath(base))  # the exporter runs in another cwd
        self.path = self.state_dir / heartbeat_filename(name, self.rank)

    def _memory_snapshots(self, enabled: bool, schedule: Schedule, config: Any) -> MemorySnapshots:
        """The OOM and periodic snapshots part, named after this rank's heartbeat.

        Made after the writer's state: it warns through the writer's once-only log, and before
        it numbers a dump it waits (briefly) for the writer to have read the previous process's
        heartbeat, whose snapshot counts it continues.
        """
        return MemorySnapshots(
            self.state_dir,
            self.path.name[: -len(SUFFIX)],
            SnapshotOwner(self.name, self.rank, self._pid, self._host),
            self._warn_once,
            lambda: self._ready.wait(2.0),
            enabled=enabled,
            schedule=schedule,
            config=config,
            devices=lambda: snapshot_devices(self._warn_once, self._device_uuids),
        )

    def _identify_process(self, starting: bool) -> None:
        """This process as the exporter tells it from another with the same pid after it.

        A pid alone is reused; the exporter compares the start time too (exact ticks where
        they can be read, else psutil's create time), and the host.
        """
        self._pid = os.getpid()
        self._host = socket.gethostname()[:255]
        self._started = time.time()
        self._starting = starting
        self._relaunch = False  # the previous process of this run and rank died: see begin()
        try:
            self._create_time = procinfo.own_create_time()
        except Exception:
            self._create_time = self._started
        self._create_time_read = time.monotonic()
        self._start_ticks = procinfo.own_start_ticks()  # exact, and fixed for life

    # -- the training loop's side -------------------------------------------------------

    def step(
        self,
        step: int,
        *,
        data_seconds: float | None = None,
        compute_seconds: float | None = None,
        **scalars: float,
    ) -> None:
        """Record the current step and numeric scalars (loss, tokens/s...).

        Costs well under a microsecond: the values are converted and written by the background
        thread. ``data_seconds`` and ``compute_seconds`` (this step's time waiting for its
        batch and computing before the gradient all-reduce) are added to the rank's totals,
        which tell a slow rank apart (docs/metrics.md#who-is-slow); they are not scalars.
        """
        self._latest = (step, time.time(), scalars)
        if self._first_raw is _UNSET:  # where this process began: the steps a death lost
            self._first_raw = step
        if data_seconds is not None or compute_seconds is not None:
            self._timing.add(data_seconds, compute_seconds)

    def close(self, *, finished: bool = True) -> None:
        """Write the final heartbeat; ``finished=False`` records the run as failed.

        Waits at most ``close_timeout`` seconds for a slow disk.
        """
        self._finish("finished" if finished else "failed", None)

    def begin(
        self,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        checkpoint_pattern: str | None = None,
        checkpoint_layout: str | None = None,
    ) -> None:
        """Training begins now: the end of a ``starting=True`` run's starting phase.

        A checkpoint directory given replaces the constructor's (a framework resolves it late).
        The start (``trainguard_run_start_age_seconds``) is now, unless the starting heartbeat
        was already judged as training: a relaunch after a death, which is no evaluation.
        """
        if checkpoint_dir is not None:
            check_naming(self.name, checkpoint_pattern, checkpoint_layout)
            self._checkpoint_pattern, self._checkpoint_layout = (
                checkpoint_pattern,
                checkpoint_layout,
            )
            self._checkpoint_dir = abspath(checkpoint_dir)
        if self._starting and not self._relaunch:
            self._started = time.time()
            self._stuck.restart()
        self._starting = False
        self._wake.set()

    @property
    def last_oom_snapshot(self) -> Path | None:
        """The OOM snapshot this process wrote last, if any."""
        return self._snapshots.last

    def capture_oom(self) -> OomGuard:
        """Dump a CUDA memory snapshot on ``torch.cuda.OutOfMemoryError``, and re-raise.

        ``with run.capture_oom(): train_step()``. The snapshot goes next to the heartbeat
        (``<name>-<hash>.rank<N>.oom-<n>.pickle``, open it at https://pytorch.org/memory_viz;
        the newest periodic one is kept beside it as ``oom-<n>.before.pickle``).
        Needs ``oom_snapshots=True`` and CUDA; otherwise it only passes exceptions through.
        """
        return OomGuard(lambda exc: self._snapshots.on_exception(exc, self._progress))

    def __enter__(self) -> Run:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None or (
            issubclass(exc_type, SystemExit) and getattr(exc, "code", None) in (0, None)
        ):
            self._finish("finished", None)
        else:
            self._finish("failed", type_name(exc_type))
