"""The signals that end a training process, recorded before it dies.

A scheduler stops a run with a signal (Slurm's ``scancel``, a time limit or a preemption,
torchrun's agent stopping the surviving ranks, a Kubernetes pod deleted or evicted: SIGTERM;
Slurm's ``--signal=USR1@60`` warning: SIGUSR1). Without a handler the process just vanishes and
its death reads ``unknown``, like a ``kill -9``. :class:`SignalGuard` records the signal in the
heartbeat and then always passes it on to what was installed before, so the script behaves as
it did without trainguard:

- default action (``SIG_DFL``): the final heartbeat is written (state ``failed``, ``signal``),
  then the default is restored and the signal sent again: the process still dies of it (exit
  status -15 for SIGTERM).
- a Python handler (the script's, or SIGINT's KeyboardInterrupt): it is called. SIGTERM and
  SIGHUP, which ask the process to end, make its end a death by that signal whatever the handler
  then does (saves a checkpoint and exits 0: the run was stopped, not finished); SIGINT does
  when its KeyboardInterrupt ends the process; SIGUSR1/2 are only recorded (``last_signal``).
- ignored (``SIG_IGN``), or a handler installed outside Python: left alone, nothing recorded.

Python runs a signal's handler in the main thread between two bytecodes, never while that
thread waits inside a C call (an NCCL collective that will never complete, which is where
torchrun's SIGTERM finds the surviving ranks). The guard therefore also listens on the
interpreter's wakeup fd from a thread of its own, which records the signal at once and, for a
default action, ends the process the way the signal would have. A handler the script installs
after ``trainguard.Run()`` replaces the guard's (its signal is then not recorded).

A handler runs in the main thread wherever that thread was interrupted, which may be inside the
very lock the handler is about to take: ``threading.Event.set`` (a plain lock) or
``Thread.join`` of the heartbeat writer (its end-of-thread lock, held between the acquire and
the release). So the writer is woken through :class:`SignalSafeEvent` (a re-entrant lock), and a
signal that comes while the main thread is itself closing the run is not made to wait for the
final heartbeat there: ``finish()`` answers False, and the signal is passed on by
:meth:`SignalGuard.remove` once the close is done.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading
import time
import weakref
from collections.abc import Callable
from types import FrameType
from typing import Any

from trainguard.shared.heartbeat.record import MAX_TIME

#: the signals watched, where the platform has them
WATCHED = ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2")
#: signals that ask the process to end: once caught, its end is a death by that signal
ENDING = ("SIGTERM", "SIGHUP")
#: where the scheduler's end time for the job is read, first found first
END_TIME_VARIABLES = ("TRAINGUARD_JOB_END_TIME", "SLURM_JOB_END_TIME")
#: an ending signal this many seconds before the job's end time, or later, is its time limit
TIME_LIMIT_SLACK = 180.0

Handler = Callable[[int, FrameType | None], Any] | int | None

_guards: weakref.WeakSet[SignalGuard] = weakref.WeakSet()


def job_end_time(env: Any = None) -> float | None:
    """When the scheduler will end this job, in seconds since the epoch; None when not told.

    Slurm exports ``SLURM_JOB_END_TIME`` at the job's start (a limit changed later with
    ``scontrol update`` is not seen); ``TRAINGUARD_JOB_END_TIME`` is for a site that knows
    its own (a Kubernetes Job's ``activeDeadlineSeconds`` added to its start).
    """
    env = os.environ if env is None else env
    for key in END_TIME_VARIABLES:
        raw = env.get(key)
        if not raw:
            continue
        try:
            value = float(raw)
        except ValueError:
            continue
        if 0 < value < MAX_TIME:
            return value
    return None


def signal_cause(when: float, end_time: float | None) -> str:
    """``time_limit`` for a signal at the job's end time (less the slack), else ``signal``."""
    if end_time is not None and when >= end_time - TIME_LIMIT_SLACK:
        return "time_limit"
    return "signal"


class SignalSafeEvent:
    """An event a signal's handler may set while the main thread it interrupted was setting it.

    ``threading.Event`` guards its flag with a plain lock: a handler calling ``set()`` on the
    main thread interrupted inside ``set()`` would wait on itself for ever. This one's lock is
    re-entrant, and ``Condition.notify_all`` bears being re-entered (gh-92530).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.RLock())
        self._flag = False

    def set(self) -> None:
        """Set the flag and wake the waiter."""
        with self._cond:
            self._flag = True
            self._cond.notify_all()

    def clear(self) -> None:
        """Clear the flag (the waiter, before looking at what changed)."""
        with self._cond:
            self._flag = False

    def wait(self, timeout: float) -> bool:
        """Wait until the flag is set, at most ``timeout`` seconds; the flag."""
        with self._cond:
            if not self._flag:
                self._cond.wait(timeout)
            return self._flag


class SignalGuard:
    """The handlers of one ``trainguard.Run`` for :data:`WATCHED`, chained to the previous ones.

    ``wake()`` is called after the guard's state changed (the writer thread rewrites the
    heartbeat), ``finish()`` when a signal's default action is about to end the process (the
    final heartbeat): it answers False when the thread it runs on is already closing the run,
    which then passes the signal on in :meth:`remove`. :meth:`install` does nothing outside the
    main thread (Python's rule): the guard then records nothing.
    """

    def __init__(self, wake: Callable[[], None], finish: Callable[[], bool]) -> None:
        self._wake = wake
        self._finish = finish
        self._pid = os.getpid()
        self._end_time = job_end_time()
        self._previous: dict[int, Handler] = {}
        self._handlers: dict[int, Callable[[int, FrameType | None], None]] = {}
        self._lock = threading.RLock()  # a handler may interrupt the main thread holding it
        self._closed = False
        #: (name, cause) of the signal ending the process; (name, time) of the last other one
        self.ending: tuple[str, str] | None = None
        self.last: tuple[str, float] | None = None
        self.version = 0  # bumped at each change, for the writer thread
        self._pipe: tuple[int, int] | None = None
        self._deferred: int | None = None  # a signal to pass on once the run's close is done

    def install(self) -> None:
        """Install the handlers (and the wakeup fd's reader); nothing outside the main thread."""
        if threading.current_thread() is not threading.main_thread():
            return
        for name in WATCHED:
            self._install(name)
        if self._handlers:
            self._listen()
            _guards.add(self)

    # -- what the heartbeat says ---------------------------------------------------------

    def fields(self) -> dict[str, Any]:
        """The heartbeat's ``signal``, ``exit_cause``, ``last_signal``, ``last_signal_time``."""
        ending, last = self.ending, self.last
        return {
            "signal": ending[0] if ending else None,
            "exit_cause": ending[1] if ending else None,
            "last_signal": last[0] if last else None,
            "last_signal_time": last[1] if last else None,
        }

    def end_state(self, state: str, error: str | None) -> str:
        """The final state of a run ending as ``state`` (with exception ``error``).

        ``failed`` after an ending signal; a KeyboardInterrupt that a caught SIGINT raised is
        then recorded as that signal.
        """
        if (
            self.ending is None
            and state == "failed"
            and error == "KeyboardInterrupt"
            and self.last is not None
            and self.last[0] == "SIGINT"
        ):
            self.ending = ("SIGINT", signal_cause(self.last[1], self._end_time))
        return "failed" if self.ending is not None else state

    # -- installing and removing ---------------------------------------------------------

    def _install(self, name: str) -> None:
        sig = getattr(signal, name, None)
        if sig is None:
            return
        try:
            previous = signal.getsignal(sig)
        except (ValueError, OSError):
            return
        if previous is None or previous == signal.SIG_IGN:
            return  # installed outside Python (cannot be chained), or ignored: left alone

        def handler(signum: int, frame: FrameType | None) -> None:
            self._on_signal(signum, frame)

        handler.trainguard_guard = self  # type: ignore[attr-defined]
        try:
            signal.signal(sig, handler)
        except (ValueError, OSError):
            return
        self._previous[sig] = previous
        self._handlers[sig] = handler

    def _listen(self) -> None:
        """Take the interpreter's wakeup fd unless someone uses it, and read it on a thread."""
        read, write = os.pipe()
        os.set_blocking(write, False)
        try:
            taken = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        except (ValueError, OSError):
            taken = -2
        if taken != -1:  # someone else's (asyncio's): put it back, rely on the handlers
            if taken >= 0:
                with contextlib.suppress(ValueError, OSError):
                    signal.set_wakeup_fd(taken)
            os.close(read)
            os.close(write)
            return
        self._pipe = (read, write)
        threading.Thread(
            target=self._read_wakeups, args=(read,), name="trainguard-signals", daemon=True
        ).start()

    def remove(self) -> None:
        """The run ended: restore the previous handlers (from the main thread only).

        From another thread the guard's handlers stay and only pass signals on. A signal that
        came during the close on this thread is passed on now, to the handler restored.
        """
        with self._lock:
            self._closed = True
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, handler in self._handlers.items():
            with contextlib.suppress(ValueError, OSError):
                if signal.getsignal(sig) is handler:
                    signal.signal(sig, self._previous[sig])
        self._drop_wakeup()
        deferred, self._deferred = self._deferred, None
        if deferred is not None:
            os.kill(os.getpid(), deferred)  # dies of it, as without trainguard

    def _drop_wakeup(self) -> None:
        pipe, self._pipe = self._pipe, None
        if pipe is None:
            return
        with contextlib.suppress(ValueError, OSError):
            current = signal.set_wakeup_fd(-1)
            if current not in (-1, pipe[1]):
                signal.set_wakeup_fd(current)  # someone took it since: theirs
        os.close(pipe[1])  # the reader sees the end of the pipe and closes its side

    def _forked(self) -> None:
        """In a forked child: the parent's wakeup pipe is not this process's to write."""
        pipe, self._pipe = self._pipe, None
        if pipe is None:
            return
        with contextlib.suppress(ValueError, OSError):
            signal.set_wakeup_fd(-1)
        for fd in pipe:
            with contextlib.suppress(OSError):
                os.close(fd)

    # -- a signal ------------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        """The Python handler: record, then pass on (main thread)."""
        previous = self._previous.get(signum, signal.SIG_DFL)
        if os.getpid() == self._pid:
            with self._lock:
                if not self._closed:
                    self._record(signum)
                    if _default_kills(previous) and not self._finish():
                        self._deferred = signum  # this thread is closing: remove() passes it on
                        return
        _pass_on(signum, previous, frame)

    def _read_wakeups(self, read: int) -> None:
        """The wakeup fd's reader: records a signal while the main thread may be stuck in C."""
        try:
            while True:
                data = os.read(read, 64)
                if not data:
                    return
                for signum in data:
                    if signum in self._previous:
                        self._early(signum)
        except OSError:
            return
        finally:
            with contextlib.suppress(OSError):
                os.close(read)

    def _early(self, signum: int) -> None:
        if os.getpid() != self._pid:
            return
        with self._lock:
            if self._closed:
                self._dropped(signum)
                return
            self._record(signum)
            if not _default_kills(self._previous[signum]):
                return  # the handler runs when the main thread gets to it
            self._finish()
            if _restore_default_in_c(signum):
                os.kill(os.getpid(), signum)  # dies of it, as without trainguard

    def _dropped(self, signum: int) -> None:
        """Pass on a signal caught before :meth:`remove` and due on the main thread after it.

        Python looks a caught signal's handler up when the main thread gets to it, and drops
        the signal when the handler is then the default: the process would go on as if it had
        never come. Its default action is taken here instead.
        """
        with contextlib.suppress(ValueError, OSError):
            if signal.getsignal(signum) == signal.SIG_DFL and _default_kills(
                self._previous[signum]
            ):
                os.kill(os.getpid(), signum)

    def _record(self, signum: int) -> None:
        name = signal.Signals(signum).name
        now = time.time()
        if self.ending is None and (name in ENDING or _default_kills(self._previous[signum])):
            self.ending = (name, signal_cause(now, self._end_time))
        elif self.ending is None:
            self.last = (name, now)
        self.version += 1
        self._wake()


def _default_kills(previous: Handler) -> bool:
    """Whether ``previous`` is the default action (every watched signal's ends the process).

    Another guard's handler (a second ``trainguard.Run``) stands for what it passes on to.
    """
    seen = 0
    while callable(previous) and seen < 16:
        guard = getattr(previous, "trainguard_guard", None)
        if not isinstance(guard, SignalGuard):
            return False
        previous = guard._previous.get(_signum_of(guard, previous), signal.SIG_DFL)
        seen += 1
    return previous == signal.SIG_DFL


def _signum_of(guard: SignalGuard, handler: Any) -> int:
    for signum, mine in guard._handlers.items():
        if mine is handler:
            return signum
    return -1


def _pass_on(signum: int, previous: Handler, frame: FrameType | None) -> None:
    """Do what would have happened without the guard (main thread)."""
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_DFL:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _restore_default_in_c(signum: int) -> bool:
    """Set ``signum`` back to its default action from a thread other than the main one.

    ``signal.signal`` refuses other threads; libc's ``signal`` does not. Python's table still
    names the guard's handler, which no longer runs: the process is about to die of it.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.restype = ctypes.c_void_p
        libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
        return bool(libc.signal(signum, None) != ctypes.c_void_p(-1).value)
    except (OSError, AttributeError):
        return False


def _after_fork_in_child() -> None:
    for guard in list(_guards):
        guard._forked()


os.register_at_fork(after_in_child=_after_fork_in_child)
