"""A call that may hang, run on a thread of its own and waited for until a deadline.

This is what lets a scrape answer on time while a collector (or a read several collectors share) is
stuck in a GPU driver or on a network filesystem whose server went away.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

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
_INTERRUPTED = RuntimeError("the call was interrupted")


class Worker(Generic[A, R]):
    """Runs ``fn(arg)`` on one thread of its own, one call at a time.

    Callers wait for a call until a deadline. A call that hangs costs the first scrape that waits
    for it its deadline; while it still hangs, later scrapes are told at once instead of waiting
    again or queueing calls of their own (no pile-up of threads: one call outstanding, ever). When
    the call returns, the next :meth:`start` starts a new one. Callers that arrive while a call is
    in progress (concurrent scrapes) share its outcome rather than queueing calls of their own.
    ``fn`` raising is its outcome: :meth:`wait` raises it again.
    """

    def __init__(self, fn: Callable[[A], R], name: str) -> None:
        self._fn = fn
        self._name = name
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._pending: tuple[int, A] | None = None  # (call number, its argument) to start
        self._started = 0  # calls started
        self._finished = 0  # number of the last call that returned: calls are one at a time,
        # so one is in progress while _finished < _started
        self._outcome: tuple[R | None, BaseException | None] = (None, None)
        self._seconds = 0.0  # how long the last call that returned took
        self._abandoned = False  # a caller gave up waiting for the call in progress

    def start(self, arg: A) -> int | None:
        """Start a call (or join the one in progress); return the ticket to :meth:`wait` with.

        The ticket is None while a call a caller gave up on still hangs.
        """
        with self._cond:
            if self._abandoned:
                return None
            if self._finished == self._started:
                if self._thread is None or not self._thread.is_alive():
                    self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                    self._thread.start()
                self._started += 1
                self._pending = (self._started, arg)
                self._cond.notify_all()
            return self._started

    def wait(self, ticket: int | None, deadline: float | None) -> tuple[R, float]:
        """The outcome of call ``ticket`` (or of a later one) and how long it took.

        Waits until it returned; raises :class:`Unfinished` if it has not by ``deadline``
        (``time.monotonic()``; None waits as long as it takes) or is a call given up on
        earlier.
        """
        with self._cond:
            if ticket is not None:

                def done() -> bool:
                    return self._finished >= ticket

                timeout = None if deadline is None else max(deadline - time.monotonic(), 0.0)
                if self._cond.wait_for(done, timeout):
                    value, exc = self._outcome
                    if exc is not None:
                        raise exc
                    return value, self._seconds  # type: ignore[return-value]
                self._abandoned = True
        raise Unfinished(UNFINISHED)

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None)
                assert self._pending is not None
                number, arg = self._pending
                self._pending = None
            outcome: tuple[R | None, BaseException | None] = (None, _INTERRUPTED)
            began = time.perf_counter()
            try:
                outcome = (self._fn(arg), None)
            except Exception as exc:  # handed to the waiters, raised there
                outcome = (None, exc)
            finally:
                with self._cond:
                    self._outcome, self._finished = outcome, number
                    self._seconds = time.perf_counter() - began
                    self._abandoned = False
                    self._cond.notify_all()
