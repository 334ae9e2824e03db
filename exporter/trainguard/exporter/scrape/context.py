"""One scrape as the collectors see it: its deadline, shared reads and failed parts.

The shared reads are what they read from a shared source once per scrape; the failed parts are
recorded so that a collector reports a partial failure with one call (``scrape.error(...)``)
rather than passing an error list through every function.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from trainguard.exporter.scrape.relay import Slot, Unfinished

T = TypeVar("T")


class SharedReads:
    """The shared sources' reads across scrapes: at most one in progress per source, ever.

    A read is made by the thread that first asks for it while none is in progress (in the
    exporter, a call of its own at the head of each scrape's relay, so that it holds no
    collector when it hangs); one that asks meanwhile waits for it until its deadline. A read
    given up on while it hangs (the state directory on a network filesystem whose server went
    away) is not waited for again, nor started again, until it returns: it holds one thread,
    not the collectors that need it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reads: dict[object, Slot[None, Any]] = {}

    def read(self, key: object, read: Callable[[], Any]) -> Slot[None, Any]:
        """The reads of source ``key`` (made by ``read``), across scrapes."""
        with self._lock:
            shared = self._reads.get(key)
            if shared is None:
                shared = self._reads[key] = Slot(lambda _: read())
            return shared


class _Read:
    """One shared read as one scrape sees it: the source's reads, then its value or error."""

    def __init__(self, shared: Slot[None, Any]) -> None:
        self.shared = shared
        self.done = False
        self.value: Any = None
        self.error: Exception | None = None


class _Shared:
    """What all collectors of one scrape read once (collectors run on threads of their own)."""

    def __init__(self, reads: SharedReads | None, deadline: float | None) -> None:
        self.lock = threading.Lock()
        self.memo: dict[object, Any] = {}
        self.reads = reads
        self.deadline = deadline


class Scrape:
    """One scrape, handed to every collector's ``gather``.

    :meth:`once` reads a source several collectors share (the run table) once per scrape, so
    that they all see the same snapshot and the state directory is not listed and every pid
    checked again for each of them; :meth:`error` records a part that failed (one GPU, one
    heartbeat file, one checkpoint location): the collector reports
    ``trainguard_collector_success 0`` and still publishes the rest.

    The exporter's scrapes carry ``reads`` and a ``deadline`` (``time.monotonic()``): a shared
    read is then made by the first thread that asks while none is in progress (the exporter
    asks in a call of its own before the collectors', :class:`SharedReads`), and a collector
    that asks meanwhile waits for it until the deadline at most
    (:class:`~trainguard.exporter.scrape.relay.Unfinished` after that), so that one that can do
    without it (the GPU collector, without the runs its processes belong to) still answers with
    the rest; the exporter passes a ``deadline`` for the reads somewhat before the scrape's
    own, to leave it the time to. Without them (the terminal view, tests) the first caller
    reads.
    """

    def __init__(
        self,
        shared: _Shared | None = None,
        *,
        reads: SharedReads | None = None,
        deadline: float | None = None,
    ) -> None:
        self._shared = shared if shared is not None else _Shared(reads, deadline)
        self.errors: list[str] = []

    def for_collector(self) -> Scrape:
        """The same scrape for another collector: shared reads, errors of its own."""
        return Scrape(self._shared)

    def once(self, key: object, read: Callable[[], T], what: str = "a shared read") -> T:
        """``read()``'s result, read at the first call with this key in this scrape.

        Raises :class:`~trainguard.exporter.scrape.relay.Unfinished` (saying ``what``) when the read
        has not returned by the scrape's deadline.
        """
        shared = self._shared
        if shared.reads is None:
            with shared.lock:
                if key not in shared.memo:
                    shared.memo[key] = read()
                result: T = shared.memo[key]
                return result
        with shared.lock:
            entry = shared.memo.get(key)
            if entry is None:
                entry = shared.memo[key] = _Read(shared.reads.read(key, read))
        if not entry.done:
            try:
                value, error = entry.shared.call_here(None, shared.deadline), None
            except Unfinished as exc:
                raise Unfinished(f"{what} did not finish by the scrape's deadline: {exc}") from None
            except Exception as exc:  # the read failed: the same error for every collector
                value, error = None, exc
            with shared.lock:
                if not entry.done:  # the first outcome wins: one snapshot per scrape
                    entry.value, entry.error, entry.done = value, error, True
        if entry.error is not None:
            raise entry.error
        answer: T = entry.value
        return answer

    def error(self, message: str) -> None:
        """One part of this collector's work failed; ``message`` says which and why."""
        self.errors.append(message)
