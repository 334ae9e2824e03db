"""A scrape's calls run one after another on one thread, handed on to another when one stalls.

Why not a thread per collector, all started at once: the collectors are Python, and Python
threads take turns holding the interpreter, so starting four threads per scrape buys no speed,
only the cost of waking each (measured in bench/RESULTS.md). What threads are for here is a
call that blocks: a
GPU driver that stopped answering, a network filesystem whose server went away. So the calls of
a scrape are run in turn by one thread taken from a pool; when the call it is in has run for
:data:`HAND_ON_SECONDS`, the calls not yet begun are taken up by another thread from the pool
(and so on, if that one stalls too), so that every call still starts within a fraction of the
scrape's deadline and one hung call costs the scrape only its own answer.

As with one thread per call: a call still running at the deadline is reported unfinished, and
the same call (a :class:`Slot`) is not started again while it runs (one outstanding call each,
no pile-up of threads); a scrape that arrives while another scrape's call of it is running
waits for that call's outcome rather than starting its own.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

A = TypeVar("A")
R = TypeVar("R")


class Unfinished(Exception):
    """A call did not return by the scrape's deadline, or is still hanging from an earlier one.

    The message says which call, and is the same at every scrape while it hangs (so that it is
    logged once).
    """


#: the one message for a call still running at the deadline and for one still hanging from an
#: earlier scrape, so that the error is logged when it starts, not at every scrape
UNFINISHED = (
    "a call is hanging (a GPU driver, or a network filesystem that stopped answering?), and is "
    "not started again until it returns"
)

#: a call that has run this long has the calls after it taken up by another thread
HAND_ON_SECONDS = 0.05
#: idle threads the pool keeps between scrapes (more are made when calls hang, and end)
KEEP_IDLE = 2
_LATE = "not begun by the scrape's deadline (the calls before it were slow)"


class Slot(Generic[A, R]):
    """One function's calls, one at a time; the outcome of the last that returned.

    The relay queues a slot's calls for its pooled threads; :meth:`call_here` makes one on
    the calling thread (the scrape's shared reads). Either way a call given up on while it
    runs (``abandoned``) is not waited for, nor started again, until it returns.
    """

    def __init__(self, fn: Callable[[A], R]) -> None:
        self.fn = fn
        self.lock = threading.Condition()  # notified when a call returns
        self.started = 0  # calls started (begun or waiting to be)
        self.finished = 0  # number of the last call that returned
        self.pending: tuple[int, A] | None = None
        self.outcome: tuple[R | None, Exception | None] = (None, None)
        self.seconds = 0.0  # how long the last call that returned took
        self.abandoned = False  # a caller gave up waiting for the call in progress

    def call(self, number: int, arg: A) -> tuple[R | None, Exception | None]:
        """Make call ``number`` on this thread; its outcome, recorded for every waiter."""
        began = time.monotonic()
        outcome: tuple[Any, Exception | None] = (None, RuntimeError("the call was interrupted"))
        try:
            outcome = (self.fn(arg), None)
        except Exception as exc:  # the call's outcome, handed to the waiters
            outcome = (None, exc)
        finally:
            self.finish(number, outcome, time.monotonic() - began)
        return outcome

    def finish(self, number: int, outcome: tuple[Any, Exception | None], seconds: float) -> None:
        """Record call ``number``'s outcome; it no longer hangs."""
        with self.lock:
            self.outcome, self.finished, self.seconds = outcome, number, seconds
            self.abandoned = False
            self.lock.notify_all()

    def give_up(self, ticket: int | None) -> Unfinished | None:
        """Why call ``ticket`` has no outcome for its waiter (None: it has). Under ``lock``."""
        if ticket is None:  # a call given up on earlier, still hanging when this began
            return Unfinished(UNFINISHED)
        if self.finished < ticket:
            self.abandoned = True  # until the call returns (which clears it, under the lock)
            return Unfinished(UNFINISHED)
        return None

    def call_here(self, arg: A, deadline: float | None) -> R:
        """A call's value: made now on this thread, or the one in progress, waited for.

        Waits until ``deadline`` (``time.monotonic()``; None: as long as it takes) for a call
        in progress on another thread; raises :class:`Unfinished` after that, or at once while
        a call given up on still hangs, and what the call raised.
        """
        outcome: tuple[R | None, Exception | None] | None = None
        with self.lock:
            if self.abandoned:
                raise Unfinished(UNFINISHED)
            if self.finished < self.started:  # in progress on another thread
                ticket = self.started
                timeout = None if deadline is None else max(deadline - time.monotonic(), 0.0)
                self.lock.wait_for(lambda: self.finished >= ticket, timeout)
                unfinished = self.give_up(ticket)
                if unfinished is not None:
                    raise unfinished
                outcome = self.outcome
            else:
                self.started += 1
                number = self.started
        if outcome is None:
            outcome = self.call(number, arg)
        value, exc = outcome
        if exc is not None:
            raise exc
        return value  # type: ignore[return-value]


class _Pool:
    """Threads that wait between scrapes for work, rather than one started anew per scrape."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._tasks: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._idle = 0

    def submit(self, task: Callable[[], None]) -> None:
        with self._lock:
            if self._idle:
                self._idle -= 1
                self._tasks.put(task)
                return
        threading.Thread(target=self._loop, args=(task,), name=self._name, daemon=True).start()

    def _loop(self, task: Callable[[], None]) -> None:
        while True:
            task()
            with self._lock:
                if self._idle >= KEEP_IDLE:
                    return
                self._idle += 1
            task = self._tasks.get()


class _Round(Generic[A, R]):
    """One scrape's calls: those not begun yet, in order, and when the last was begun."""

    def __init__(self, slots: list[Slot[A, R]], deadline: float) -> None:
        self.cond = threading.Condition()
        self.queue = collections.deque(slots)
        self.deadline = deadline
        self.last_begun = time.monotonic()

    def drain(self) -> None:
        """Run this round's calls not begun yet, in order, until none is left."""
        while True:
            with self.cond:
                if not self.queue:
                    return
                slot = self.queue.popleft()
                self.last_begun = now = time.monotonic()
            with slot.lock:
                assert slot.pending is not None
                number, arg = slot.pending
                slot.pending = None
            try:
                if now < self.deadline:
                    slot.call(number, arg)
                else:
                    slot.finish(number, (None, Unfinished(_LATE)), 0.0)
            finally:
                with self.cond:
                    self.cond.notify_all()


class Relay(Generic[A, R]):
    """Runs ``fns`` once per :meth:`run`, in order, on pooled threads; see the module's doc."""

    def __init__(self, fns: Sequence[Callable[[A], R]], name: str) -> None:
        self.slots: tuple[Slot[A, R], ...] = tuple(Slot(fn) for fn in fns)
        self._pool = _Pool(name)

    def run(self, args: Sequence[A], deadline: float) -> list[tuple[R, float] | Exception]:
        """Each function's outcome for ``args``: its value and seconds, or the exception it raised.

        Waits until ``deadline`` (``time.monotonic()``) at most: a call not returned by then is
        an :class:`Unfinished`.
        """
        tickets: list[int | None] = []
        todo: list[Slot[A, R]] = []
        for slot, arg in zip(self.slots, args, strict=True):
            with slot.lock:
                if slot.abandoned:
                    tickets.append(None)
                    continue
                if slot.finished == slot.started:
                    slot.started += 1
                    slot.pending = (slot.started, arg)
                    todo.append(slot)
                tickets.append(slot.started)
        round_ = _Round(todo, deadline)
        if todo:
            self._pool.submit(round_.drain)
        waits = [(s, t) for s, t in zip(self.slots, tickets, strict=True) if t is not None]
        with round_.cond:
            while True:
                if all(s.finished >= t for s, t in waits):
                    break
                now = time.monotonic()
                if now >= deadline:
                    break
                if round_.queue and now - round_.last_begun >= HAND_ON_SECONDS:
                    round_.last_begun = now
                    self._pool.submit(round_.drain)
                # a call of another scrape's round is not notified here: looked at again soon
                round_.cond.wait(min(HAND_ON_SECONDS, deadline - now))
        return [self._outcome(s, t) for s, t in zip(self.slots, tickets, strict=True)]

    @staticmethod
    def _outcome(slot: Slot[A, R], ticket: int | None) -> tuple[R, float] | Exception:
        with slot.lock:
            unfinished = slot.give_up(ticket)
            if unfinished is not None:
                return unfinished
            value, exc = slot.outcome
            if exc is not None:
                return exc if isinstance(exc, Exception) else RuntimeError(str(exc))
            return value, slot.seconds  # type: ignore[return-value]
