"""``trainguard.Run``: the in-process side. A training script creates one per process (rank)
and calls ``run.step(step, loss=...)`` in its loop; a background thread turns the latest
values into a heartbeat file that the exporter reads at scrape time.

The training loop must never pay for this: ``step()`` only stores a tuple (no lock, no I/O,
no syscall beyond reading the clock); the daemon writer thread wakes every ``interval``
seconds, writes only when something changed (or ``keepalive`` seconds passed), and swallows
disk errors (a full or read-only disk is logged once). torch is never imported unless the
script already imported it (or asked for OOM snapshots).

How a run ends, as the exporter will see it (``trainguard_run_finished``):

- ``close()``, leaving the ``with`` block normally, ``sys.exit(0)`` inside it, or a normal
  interpreter exit (atexit) record ``finished``.
- An exception leaving the ``with`` block (``KeyboardInterrupt`` and ``sys.exit(1)``
  included), ``close(finished=False)``, or an uncaught exception reaching the top level
  (seen through ``sys.excepthook`` before atexit runs) record ``failed`` with the
  exception's type name: the process is expected to be gone soon, and that is a death.
- SIGKILL, SIGTERM (Python's default action ends the process without running atexit), the
  OOM killer, a reboot or ``os._exit`` record nothing: the heartbeat stays
  ``running`` with a pid that is gone, which is exactly what the exporter reports as a death.
  When the run starts again under the same name and rank, the new process adds that death to
  the history it carries forward (step, last heartbeat time, cause).

Known blind spot: ``sys.exit(1)`` outside any ``with`` block looks like a normal exit to
atexit and is recorded ``finished``.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import logging
import math
import os
import socket
import sys
import threading
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import psutil

from trainguard._version import __version__
from trainguard.run.allocator import DeviceUuids, read_allocator
from trainguard.run.deaths import DeathHistory, Identity, death_of
from trainguard.run.oom import OomGuard
from trainguard.run.options import (
    abspath,
    checked_scalars,
    checked_step,
    env_int,
    mirror_dirs,
    resolve_rank,
    type_name,
)
from trainguard.run.snapshots import (
    Identity as SnapshotOwner,
)
from trainguard.run.snapshots import (
    MemorySnapshots,
    check_config,
    check_schedule,
)
from trainguard.shared import procinfo
from trainguard.shared.heartbeat import (
    MAX_RANK,
    SUFFIX,
    Heartbeat,
    HeartbeatError,
    check_run_name,
    heartbeat_filename,
    write_heartbeat,
)
from trainguard.shared.heartbeat_read import read_heartbeat
from trainguard.shared.pattern import checkpoint_pattern_problem
from trainguard.shared.statedir import default_state_dir
from trainguard.shared.steps import layout_problem

log = logging.getLogger("trainguard.reporter")

#: seconds between re-reads of this process's create time (each read is a few syscalls)
CREATE_TIME_REFRESH = 60.0
_QUIET_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.EDQUOT}


class Run:
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
        rank: default ``$RANK``, else ``$LOCAL_RANK``, else 0.
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
    ) -> None:
        problem = check_run_name(name)
        if problem:
            raise ValueError(f"trainguard.Run: name: {problem}")
        for label, value in (
            ("interval", interval),
            ("keepalive", keepalive),
            ("close_timeout", close_timeout),
        ):
            if not isinstance(value, (int, float)) or not 0 < value < 86400:
                raise ValueError(f"trainguard.Run: {label}: expected seconds > 0, got {value!r}")
        schedule = check_schedule(
            snapshot_steps, snapshot_seconds, snapshot_keep, bool(oom_snapshots)
        )
        experiment = check_config(config)
        self.name = name
        self.rank = resolve_rank(rank)
        self.world_size = env_int("WORLD_SIZE", 1, MAX_RANK + 1)
        base = Path(state_dir).expanduser() if state_dir is not None else default_state_dir()
        self.state_dir = Path(os.path.abspath(base))  # the exporter runs in another cwd
        self.path = self.state_dir / heartbeat_filename(name, self.rank)
        self._checkpoint_dir = abspath(checkpoint_dir)
        if checkpoint_pattern is not None:
            problem = checkpoint_pattern_problem(checkpoint_pattern)
            if problem:
                raise ValueError(f"trainguard.Run: checkpoint_pattern: {problem}")
        if checkpoint_layout is not None:
            problem = layout_problem(checkpoint_layout)
            if problem:
                raise ValueError(f"trainguard.Run: checkpoint_layout: {problem}")
        self._checkpoint_pattern = checkpoint_pattern
        self._checkpoint_layout = checkpoint_layout
        self._mirrors = mirror_dirs(mirrors)
        self._log_file = abspath(log_file)
        self._interval = float(interval)
        self._keepalive = max(float(keepalive), self._interval)
        self._close_timeout = float(close_timeout)
        self._pid = os.getpid()
        self._host = socket.gethostname()[:255]
        self._started = time.time()
        try:
            self._create_time = procinfo.own_create_time()
        except Exception:
            self._create_time = self._started
        self._create_time_read = time.monotonic()
        self._start_ticks = procinfo.own_start_ticks()  # exact, and fixed for life
        # (step, wall time, scalars): replaced whole by step(), read by the writer thread
        self._latest: tuple[Any, float, dict[str, Any]] | None = None
        self._step: int | None = None
        self._step_time: float | None = None
        self._scalars: dict[str, float] = {}
        self._final: tuple[str, str | None] | None = None
        self._uncaught: str | None = None
        self._closed = False
        self._close_lock = threading.Lock()
        self._wake = threading.Event()
        self._ready = threading.Event()  # previous heartbeat read: history known
        self._warned: set[str] = set()
        self._warn_lock = threading.Lock()
        self._boot_id: str | None = None
        self._boot_time: float | None = None
        self._pid_ns: int | None = None
        self._deaths = DeathHistory()
        self._device_uuids: DeviceUuids = {}  # CUDA device -> its GPU's UUID and size
        self._snapshots = MemorySnapshots(
            self.state_dir,
            self.path.name[: -len(SUFFIX)],
            SnapshotOwner(self.name, self.rank, self._pid, self._host),
            self._warn_once,
            lambda: self._ready.wait(2.0),
            enabled=bool(oom_snapshots),
            schedule=schedule,
            config=experiment,
            devices=self._snapshot_devices,
        )
        self._snapshots.start()
        self._thread = threading.Thread(
            target=self._writer, name="trainguard-heartbeat", daemon=True
        )
        self._thread.start()
        atexit.register(self._at_exit)
        self._hook_excepthook()

    # -- the training loop's side -------------------------------------------------------

    def step(self, step: int, **scalars: float) -> None:
        """Record the current step and numeric scalars (loss, tokens/s...). Costs well under
        a microsecond: the values are converted and written by the background thread."""
        self._latest = (step, time.time(), scalars)

    def close(self, *, finished: bool = True) -> None:
        """Write the final heartbeat (waiting at most ``close_timeout`` seconds for a slow
        disk). ``finished=False`` records the run as failed."""
        self._finish("finished" if finished else "failed", None)

    @property
    def last_oom_snapshot(self) -> Path | None:
        """The OOM snapshot this process wrote last, if any."""
        return self._snapshots.last

    def capture_oom(self) -> OomGuard:
        """``with run.capture_oom(): train_step()``: on ``torch.cuda.OutOfMemoryError``,
        dump a CUDA memory snapshot next to the heartbeat
        (``<name>-<hash>.rank<N>.oom-<n>.pickle``, open it at https://pytorch.org/memory_viz;
        the newest periodic one is kept beside it as ``oom-<n>.before.pickle``) and re-raise.
        Needs ``oom_snapshots=True`` and CUDA; otherwise it only passes exceptions through."""
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

    # -- ending -------------------------------------------------------------------------

    def _finish(self, state: str, error: str | None) -> None:
        if os.getpid() != self._pid:
            return  # a forked child (DataLoader worker) must never end the parent's run
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        atexit.unregister(self._at_exit)
        if sys.excepthook is self._hook:
            sys.excepthook = self._previous_hook
        self._final = (state, error)
        self._wake.set()
        self._thread.join(self._close_timeout)
        if self._thread.is_alive():
            log.warning(
                "trainguard: final heartbeat for run %r rank %d not written within %.1fs "
                "(slow or hung disk at %s)",
                self.name,
                self.rank,
                self._close_timeout,
                self.state_dir,
            )

    def _at_exit(self) -> None:
        if self._uncaught is not None:
            self._finish("failed", self._uncaught)
        else:
            self._finish("finished", None)

    def _hook_excepthook(self) -> None:
        """An uncaught exception runs sys.excepthook before atexit: remember it so that
        atexit records a failure, not a clean finish. Chains to the previous hook."""
        previous = self._previous_hook = sys.excepthook
        ref = weakref.ref(self)

        def hook(
            exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None
        ) -> None:
            run = ref()
            if run is not None and os.getpid() == run._pid:
                run._uncaught = type_name(exc_type)
            previous(exc_type, exc, tb)

        self._hook = hook
        sys.excepthook = hook

    # -- the writer thread --------------------------------------------------------------

    def _writer(self) -> None:
        try:
            self._startup()
        except Exception as exc:
            self._warn_once("startup", "trainguard: cannot prepare %s: %s", self.state_dir, exc)
        finally:
            self._ready.set()
        written: object = None  # the _latest tuple last written (compared by identity:
        written_snapshots = -1  # the script's scalars may be tensors with a strange __eq__)
        last_write = -math.inf
        snapshots_on = self._snapshots.enabled
        while self._final is None:
            if snapshots_on:
                self._snapshots.tick(self._progress)
            latest, snapshots = self._latest, self._snapshots.version
            now = time.monotonic()
            if (
                latest is not written
                or snapshots != written_snapshots
                or now - last_write >= self._keepalive
            ):
                self._write("running", None)
                written, written_snapshots, last_write = latest, snapshots, now
            self._wake.wait(self._interval)
        self._write(*self._final)

    def _startup(self) -> None:
        """Runs on the writer thread so that a slow or hung disk never delays the script."""
        self._boot_id = procinfo.boot_id()
        self._boot_time = procinfo.boot_time()
        self._pid_ns = procinfo.pid_namespace()
        try:
            os.makedirs(self.state_dir, exist_ok=True)
        except OSError as exc:
            self._warn_write(exc)
            return
        self._remove_stale_temps()
        if not os.path.lexists(self.path):
            self._snapshots.carry(None, None)
            return
        try:
            prev = read_heartbeat(self.path)
        except HeartbeatError as exc:
            self._warn_once("previous", "trainguard: previous heartbeat ignored: %s", exc)
            self._snapshots.carry(None, None)
            return
        self._deaths = DeathHistory.carried_from(prev)
        me = Identity(self._pid, self._host, self._boot_id, self._boot_time, self._pid_ns)
        death = death_of(prev, me, self._warn_duplicate)
        self._snapshots.carry(prev, None if death is None else self._deaths.count + 1)
        if death is not None:
            self._deaths = self._deaths.plus(death)
            log.warning(
                "trainguard: run %r rank %d: the previous process (pid %d) died at step %s "
                "without finishing (cause: %s); death %d recorded",
                self.name,
                self.rank,
                prev.pid,
                death.step,
                death.cause,
                self._deaths.count,
            )

    def _warn_duplicate(self, prev: Heartbeat) -> None:
        self._warn_once(
            "duplicate",
            "trainguard: pid %d is alive and already reports run %r rank %d; "
            "this process overwrites its heartbeat",
            prev.pid,
            self.name,
            self.rank,
        )

    def _remove_stale_temps(self) -> None:
        """Temp files of writers that were killed mid-write (``.<name>.<pid>.<rand>.tmp``)."""
        prefix = f".{self.path.name}."
        with os.scandir(self.state_dir) as entries:
            for entry in entries:
                if not (entry.name.startswith(prefix) and entry.name.endswith(".tmp")):
                    continue
                pid = entry.name[len(prefix) :].split(".", 1)[0]
                if pid.isdigit() and int(pid) != self._pid and not psutil.pid_exists(int(pid)):
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)

    def _write(self, state: str, error: str | None) -> None:
        try:
            try:
                write_heartbeat(self.path, self._heartbeat(state, error))
            except FileNotFoundError:
                # the state dir was removed under the running job (a cleanup, a remount):
                # make it again, or the run would vanish from the exporter for good
                os.makedirs(self.state_dir, exist_ok=True)
                write_heartbeat(self.path, self._heartbeat(state, error))
        except OSError as exc:
            self._warn_write(exc)
        except Exception as exc:  # a bug here must never reach the training loop
            self._warn_once(
                f"write:{type(exc).__name__}", "trainguard: heartbeat not written: %r", exc
            )

    def _heartbeat(self, state: str, error: str | None) -> Heartbeat:
        self._take_latest()
        now = time.monotonic()
        if now - self._create_time_read >= CREATE_TIME_REFRESH:
            # psutil derives it from the boot time, which moves when the clock is stepped:
            # re-read now and then so the exporter's comparison stays within tolerance
            with contextlib.suppress(Exception):
                self._create_time = procinfo.own_create_time()
            self._create_time_read = now
        return Heartbeat(
            run=self.name,
            rank=self.rank,
            pid=self._pid,
            create_time=self._create_time,
            start_ticks=self._start_ticks,
            host=self._host,
            started=self._started,
            time=time.time(),
            state=state,
            error=error,
            step=self._step,
            step_time=self._step_time,
            scalars=self._scalars,
            world_size=self.world_size,
            boot_id=self._boot_id,
            boot_time=self._boot_time,
            pid_ns=self._pid_ns,
            checkpoint_dir=self._checkpoint_dir,
            checkpoint_pattern=self._checkpoint_pattern,
            checkpoint_layout=self._checkpoint_layout,
            mirrors=self._mirrors,
            log_file=self._log_file,
            allocator=read_allocator(self._warn_once, self._device_uuids),
            memory_snapshots=self._snapshots.oom_count,
            snapshots=self._snapshots.state(),
            deaths=self._deaths.count,
            death_history=self._deaths.recent,
            version=__version__,
        )

    def _progress(self) -> tuple[int | None, dict[str, float]]:
        """(step, scalars) as of the script's latest step() call, for a snapshot's metadata;
        runs on the reporter's thread, or the training thread at an OOM."""
        latest = self._latest
        if latest is None:
            return self._step, self._scalars
        step = checked_step(latest[0], self._warn_once)
        return (self._step if step is None else step), checked_scalars(latest[2], self._warn_once)

    def _snapshot_devices(self) -> list[dict[str, Any]]:
        """The allocator's view of each device, with its GPU's name, UUID and size."""
        out = []
        for a in read_allocator(self._warn_once, self._device_uuids):
            facts = self._device_uuids.get(a.device)
            out.append({**a.to_dict(), "name": None if facts is None else facts.name})
        return out

    def _take_latest(self) -> None:
        """Convert what step() stored; bad values are dropped and logged once."""
        latest = self._latest
        if latest is None:
            return
        raw_step, step_time, raw_scalars = latest
        step = checked_step(raw_step, self._warn_once)
        if step is not None:
            self._step, self._step_time = step, step_time
        self._scalars = checked_scalars(raw_scalars, self._warn_once)

    # -- logging --------------------------------------------------------------------------

    def _warn_write(self, exc: OSError) -> None:
        code = errno.errorcode.get(exc.errno or 0, "error")
        quiet = " (full, read-only or not writable disk)" if exc.errno in _QUIET_ERRNOS else ""
        self._warn_once(
            f"write:{code}",
            "trainguard: cannot write heartbeat %s: %s%s; training continues and "
            "trainguard keeps trying without logging this again",
            self.path,
            exc.strerror or exc,
            quiet,
        )

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        with self._warn_lock:
            if key in self._warned:
                return
            self._warned.add(key)
        log.warning(message, *args)
