"""Wait for a condition with a deadline: the one way the tests wait.

Why one helper: these tests run on machines shared by many jobs, 5-10 times slower than a quiet
one, so a wait must never be a fixed sleep, must have a generous deadline, and when it runs out
must say what it waited for and what it saw last (the only clue to a failure on a busy CI
machine). Hand-written loops each got a different part of that wrong or missing."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: the default deadline, in seconds: generous, since a busy machine is many times slower. A
#: wait returns as soon as its condition holds, so a long deadline costs nothing when all is well
TIMEOUT = 60.0


class WaitTimeout(AssertionError):
    """A condition did not hold within its deadline. ``last`` is the last value the condition
    returned, or the last exception of an ``ignore`` type it raised."""

    def __init__(self, message: str, last: object) -> None:
        super().__init__(message)
        self.last = last


def wait_for(
    condition: Callable[[], T],
    timeout: float = TIMEOUT,
    interval: float = 0.05,
    what: str | Callable[[], str] = "the condition",
    ignore: type[BaseException] | tuple[type[BaseException], ...] = (),
) -> T:
    """Call ``condition`` until it returns something truthy, and return that value.

    It is called at once, then every ``interval`` seconds; once ``timeout`` seconds have
    passed since the first call, one more falsy answer raises :class:`WaitTimeout` (an
    AssertionError) naming ``what`` (a callable is asked only then, so it can describe state
    gathered meanwhile) and the last value or exception seen. An exception of an ``ignore``
    type counts as "not yet" (a server not listening yet: ``ignore=OSError``); any other
    propagates at once, so a condition can fail the wait early (a child that died)."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = condition()
        except ignore as exc:
            last = exc
        else:
            if value:
                return value
            last = value
        if time.monotonic() >= deadline:
            said = what() if callable(what) else what
            seen = f"{type(last).__name__}: {last}" if isinstance(last, BaseException) else last
            raise WaitTimeout(f"waited {timeout:g} s for {said}; last seen: {seen!r}", last)
        if interval > 0:
            time.sleep(interval)
