"""The writer of ``trainguard.Run``: the background thread that writes heartbeats, and the close.

The training loop must never pay for reporting: ``Run.step()`` only stores a tuple, and this
thread wakes every ``interval`` seconds, converts what was stored, writes only when something
changed (or ``keepalive`` seconds passed), and swallows disk errors (a full or read-only disk is
logged once).

Closing is the delicate part, so it lives here beside the thread it waits for: the final
heartbeat must record a signal that ends the process while the run closes, and that signal's
handler may interrupt the closing thread inside ``join`` (``_finish``; run/signals.py).

:class:`HeartbeatWriter` is the base of :class:`~trainguard.run.reporter.run.Run`: it makes its
own state, and its class body declares the run's identity and place, which ``Run.__init__`` sets
before the thread starts.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
from pathlib import Path
from typing import Any

from trainguard._version import __version__
from trainguard.run.allocator import DeviceUuids, read_allocator
from trainguard.run.deaths import DeathHistory, Identity, predecessor
from trainguard.run.exits import ExitHooks
from trainguard.run.options import checked_scalars, checked_step
from trainguard.run.scalar_health import ScalarHealth
from trainguard.run.signals import SignalGuard, SignalSafeEvent
from trainguard.run.snapshots.capture import MemorySnapshots
from trainguard.run.stack import StuckWatch, stuck_after
from trainguard.run.timing import StepTiming
from trainguard.run.warn_once import WarnOnce, warn_write_failure
from trainguard.shared import loss_at_save, procinfo
from trainguard.shared.fileio import remove_orphan_temps
from trainguard.shared.heartbeat.record import Heartbeat, write_heartbeat
from trainguard.shared.jobinfo import JobInfo
from trainguard.shared.nonfinite import LOSS

log = logging.getLogger("trainguard.reporter")

#: no step() call yet; the first one's step already converted
_UNSET, _CONVERTED = object(), object()
#: seconds between re-reads of this process's create time (each read is a few syscalls)
CREATE_TIME_REFRESH = 60.0


class HeartbeatWriter:
    """The heartbeat thread and the closing protocol of a :class:`~trainguard.Run`.

    A base class rather than a part of its own because the heartbeat is the whole run's state.
    Its ``__init__`` makes the writer's own state; the fields declared below are the run's
    identity and place, set by ``Run.__init__`` (their meaning is documented there) before
    :meth:`_start_writer` starts the thread.
    """

    # who and where: fixed for the process's life, except what begin() replaces
    name: str
    rank: int
    world_size: int | None
    job: JobInfo | None
    state_dir: Path
    path: Path
    _checkpoint_dir: str | None
    _checkpoint_pattern: str | None
    _checkpoint_layout: str | None
    _mirrors: dict[str, str]
    _log_file: str | None
    # this process as the exporter tells it from a successor with the same pid
    _pid: int
    _host: str
    _started: float
    _starting: bool
    _relaunch: bool
    _create_time: float
    _create_time_read: float
    _start_ticks: int | None
    # the snapshots part, which the heartbeat reports and the thread ticks
    _snapshots: MemorySnapshots

    def __init__(self, interval: float, keepalive: float, close_timeout: float) -> None:
        self._interval = float(interval)
        self._keepalive = max(float(keepalive), self._interval)
        self._close_timeout = float(close_timeout)
        # (step, wall time, scalars): replaced whole by step(), read by the writer thread
        self._latest: tuple[Any, float, dict[str, Any]] | None = None
        self._step: int | None = None
        self._step_time: float | None = None
        self._first_raw: Any = _UNSET  # the first step() call's step, as given
        self._first_step: int | None = None
        self._scalars: dict[str, float] = {}
        self._health = ScalarHealth()  # non-finite scalars, counted where they are converted
        self._final: tuple[str, str | None] | None = None
        self._closed = False
        self._closing_on: int | None = None  # the thread closing the run
        self._close_lock = threading.RLock()  # a signal's handler may end the run inside
        self._wake = SignalSafeEvent()  # set by signal handlers too: run/signals.py
        self._ready = threading.Event()  # previous heartbeat read: history known
        self._final_written = threading.Event()  # the writer's last act (tried, at least)
        self._warn_once = WarnOnce(log)
        self._timing = StepTiming(self._warn_once)
        self._boot_id: str | None = None
        self._boot_time: float | None = None
        self._pid_ns: int | None = None
        self._deaths = DeathHistory()
        self._device_uuids: DeviceUuids = {}  # CUDA device -> its GPU's UUID and size

    def _start_writer(self) -> None:
        """Start the thread, then what ends the run through it: the exit hooks, the signal guard.

        The order matters: an exit hook or a signal's handler closes the run by waking and
        joining the thread, so it goes in only once there is a thread to join. Called on the
        training thread, whose stack the stuck watch samples.
        """
        self._stuck = StuckWatch(threading.get_ident(), stuck_after())  # run.stack: where stuck
        self._signals = SignalGuard(self._wake.set, lambda: self._finish("failed", None))
        self._thread = threading.Thread(
            target=self._writer, name="trainguard-heartbeat", daemon=True
        )
        self._thread.start()
        self._exits = ExitHooks(self._finish)
        self._signals.install()
        loss_at_save.register(self._loss_finite)  # asked by trainguard.checkpoint at each save

    # -- ending -------------------------------------------------------------------------

    def _finish(self, state: str, error: str | None) -> bool:
        """End the run with the final heartbeat; False when this thread is already ending it.

        A second call comes from a signal whose default action is about to end the process
        while the run closes (a launcher's SIGTERM as an exception unwinds): the final heartbeat,
        which reads the signal when written, must go out first. From another thread it is waited
        for here, on an event of its own, not by ``join``: the closing thread may hold the
        writer's end-of-thread lock, taken inside ``join`` just before a handler interrupted it.
        On the closing thread itself (that handler) it cannot be waited for at all, so the signal
        is passed on when the close is done (run/signals.py).
        """
        if os.getpid() != self._pid:
            return True  # a forked child (DataLoader worker) must never end the parent's run
        me = threading.get_ident()
        with self._close_lock:
            closing = self._closed
            if not closing:
                self._closing_on = me  # first: a handler that sees _closed knows who closes
                self._closed = True
        if closing:
            if self._closing_on == me:
                return False
            if threading.current_thread() is not self._thread:
                self._final_written.wait(self._close_timeout)
            return True
        state = self._signals.end_state(state, error)  # a signal ends it: run/signals.py
        self._exits.remove()
        self._final = (state, error)
        self._wake.set()
        try:
            self._thread.join(self._close_timeout)
        finally:
            # only now: a signal until the final heartbeat is written is recorded in it
            self._signals.remove()
        if self._thread.is_alive():
            log.warning(
                "trainguard: final heartbeat for run %r rank %d not written within %.1fs "
                "(slow or hung disk at %s)",
                self.name,
                self.rank,
                self._close_timeout,
                self.state_dir,
            )
        return True

    # -- the writer thread --------------------------------------------------------------

    def _writer(self) -> None:
        try:
            self._startup()
        except Exception as exc:
            self._warn_once("startup", "trainguard: cannot prepare %s: %s", self.state_dir, exc)
        finally:
            self._ready.set()
        written: object = None  # the _latest tuple last written (compared by identity:
        # the script's scalars may be tensors with a strange __eq__)
        written_snapshots = written_stuck = written_signals = -1
        written_starting = self._starting
        last_write = -math.inf
        snapshots_on = self._snapshots.enabled
        while self._final is None:
            self._wake.clear()  # set again by a signal (run/signals.py) or the end
            if snapshots_on:
                self._snapshots.tick(self._progress)
            latest, snapshots = self._latest, self._snapshots.version
            self._stuck.tick(latest)
            signals, starting = self._signals.version, self._starting
            now = time.monotonic()
            if (
                latest is not written
                or starting != written_starting
                or snapshots != written_snapshots
                or self._stuck.version != written_stuck
                or signals != written_signals
                or now - last_write >= self._keepalive
            ):
                self._write("running", None)
                written, written_snapshots, last_write = latest, snapshots, now
                written_stuck = self._stuck.version
                written_signals, written_starting = signals, starting
            self._wake.wait(self._interval)
        try:
            self._write(*self._final)
        finally:
            self._final_written.set()

    def _startup(self) -> None:
        """Runs on the writer thread so that a slow or hung disk never delays the script."""
        self._boot_id = procinfo.boot_id()
        self._boot_time = procinfo.boot_time()
        self._pid_ns = procinfo.pid_namespace()
        try:
            os.makedirs(self.state_dir, exist_ok=True)
        except OSError as exc:
            warn_write_failure(self._warn_once, self.path, exc)
            return
        remove_orphan_temps(self.path, self._pid)
        me = Identity(self._pid, self._host, self._boot_id, self._boot_time, self._pid_ns)
        who = f"run {self.name!r} rank {self.rank}"
        prev, self._deaths, died = predecessor(self.path, me, who, self._warn_once)
        self._relaunch = died is not None  # a relaunch is judged at once, starting or not
        self._snapshots.carry(prev, died)

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
            warn_write_failure(self._warn_once, self.path, exc)
        except Exception as exc:  # a bug here must never reach the training loop
            self._warn_once(
                f"write:{type(exc).__name__}", "trainguard: heartbeat not written: %r", exc
            )

    def _heartbeat(self, state: str, error: str | None) -> Heartbeat:
        self._take_latest()
        starting = self._starting and not self._relaunch
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
            first_step=self._first_step,
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
            nonfinite=self._health.state(),
            stuck=self._stuck.current if state == "running" and not starting else None,
            **self._signals.fields(),
            job=self.job,
            timing=self._timing.totals,
            starting=starting,
        )

    def _progress(self) -> tuple[int | None, dict[str, float]]:
        """(step, scalars) as of the script's latest step() call, for a snapshot's metadata.

        Runs on the reporter's thread, or the training thread at an OOM.
        """
        latest = self._latest
        if latest is None:
            return self._step, self._scalars
        step = checked_step(latest[0], self._warn_once)
        return (self._step if step is None else step), checked_scalars(latest[2], self._warn_once)

    def _loss_finite(self) -> bool | None:
        """Whether the loss of the latest step() call was finite; None when none had a loss.

        Runs on the thread saving a checkpoint: a tensor loss is read here (the save waits for
        the GPU anyway), the step() call itself never reads it.
        """
        if os.getpid() != self._pid:
            return None  # a forked child saving: not this run's loss
        latest = self._latest
        if latest is not None and LOSS in latest[2]:
            value = checked_scalars({LOSS: latest[2][LOSS]}, self._warn_once).get(LOSS)
            if value is not None:
                return math.isfinite(value)
        value = self._scalars.get(LOSS)
        return None if value is None else math.isfinite(value)

    def _take_latest(self) -> None:
        """Convert what step() stored; bad values are dropped and logged once."""
        latest = self._latest
        if latest is None:
            return
        raw_step, step_time, raw_scalars = latest
        first = self._first_raw
        if first is not _UNSET and first is not _CONVERTED:  # converted once, good or bad
            self._first_raw = _CONVERTED
            self._first_step = checked_step(first, self._warn_once)
        step = checked_step(raw_step, self._warn_once)
        if step is not None:
            self._step, self._step_time = step, step_time
        self._scalars = checked_scalars(raw_scalars, self._warn_once)
        self._health.observe(latest, self._scalars, step)
