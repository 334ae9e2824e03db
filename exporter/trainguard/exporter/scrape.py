"""One scrape as the collectors see it: its deadline, shared reads and failed parts.

The shared reads are what they read from a shared source once per scrape; the failed parts are
recorded so that a collector reports a partial failure with one call (``scrape.error(...)``)
rather than passing an error list through every function.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from trainguard.exporter.worker import Unfinished, Worker

T = TypeVar("T")


class SharedReads:
    """The shared sources' reads across scrapes, each on a :class:`Worker` of its own.

    A read that hangs (the state directory on a network filesystem whose server went away)
    holds one thread, not the collectors that wait for it, and is not started again while it
    hangs.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._workers: dict[object, Worker[None, Any]] = {}

    def worker(self, key: object, read: Callable[[], Any]) -> Worker[None, Any]:
        with self._lock:
            worker = self._workers.get(key)
            if worker is None:
                worker = self._workers[key] = Worker(lambda _: read(), "trainguard-shared-read")
            return worker


class _Read:
    """One shared read as one scrape sees it: the call it waits for, then its value."""

    def __init__(self, worker: Worker[None, Any], ticket: int | None) -> None:
        self.worker = worker
        self.ticket = ticket
        self.done = False
        self.value: Any = None


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
    read then runs on a thread of its own, and a collector waits for it until the deadline at
    most (:class:`~trainguard.exporter.worker.Unfinished` after that), so that one that can
    do without it (the GPU collector, without the runs its processes belong to) still answers
    with the rest; the exporter passes a ``deadline`` for the reads somewhat before the
    scrape's own, to leave it the time to. Without them (the terminal view, tests) the first
    caller reads.
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

        Raises :class:`~trainguard.exporter.worker.Unfinished` (saying ``what``) when the read
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
                worker = shared.reads.worker(key, read)
                entry = shared.memo[key] = _Read(worker, worker.start(None))
        if not entry.done:
            try:
                value, _ = entry.worker.wait(entry.ticket, shared.deadline)
            except Unfinished as exc:
                raise Unfinished(f"{what} did not finish by the scrape's deadline: {exc}") from None
            with shared.lock:
                if not entry.done:  # the first value wins: one snapshot per scrape
                    entry.value, entry.done = value, True
        answer: T = entry.value
        return answer

    def error(self, message: str) -> None:
        """One part of this collector's work failed; ``message`` says which and why."""
        self.errors.append(message)
