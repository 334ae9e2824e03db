"""One scrape as the collectors see it: what they read from a shared source once per scrape,
and the parts that failed, so that a collector reports a partial failure with one call
(``scrape.error(...)``) rather than passing an error list through every function."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class _Shared:
    """What all collectors of one scrape read once (collectors run on threads of their own)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.memo: dict[object, Any] = {}


class Scrape:
    """Handed to every collector's ``gather``. :meth:`once` reads a source several collectors
    share (the run table) once per scrape, so that they all see the same snapshot and the
    state directory is not listed and every pid checked again for each of them; :meth:`error`
    records a part that failed (one GPU, one heartbeat file, one checkpoint location): the
    collector reports ``trainguard_collector_success 0`` and still publishes the rest."""

    def __init__(self, shared: _Shared | None = None) -> None:
        self._shared = shared if shared is not None else _Shared()
        self.errors: list[str] = []

    def for_collector(self) -> Scrape:
        """The same scrape for another collector: shared reads, errors of its own."""
        return Scrape(self._shared)

    def once(self, key: object, read: Callable[[], T]) -> T:
        """``read()``'s result, read at the first call with this key in this scrape."""
        shared = self._shared
        with shared.lock:
            if key not in shared.memo:
                shared.memo[key] = read()
            result: T = shared.memo[key]
            return result

    def error(self, message: str) -> None:
        """One part of this collector's work failed; ``message`` says which and why."""
        self.errors.append(message)
