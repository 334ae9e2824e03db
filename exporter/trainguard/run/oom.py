"""``Run.capture_oom()``'s context manager: snapshot the allocator at a CUDA OOM, then re-raise.

It hands a CUDA out-of-memory error to the reporter's snapshots
(``trainguard.run.snapshots.capture``), which dump the allocator's state and recent history, what
explains an OOM with "free" VRAM, and re-raises it.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType


class OomGuard:
    """The context manager ``Run.capture_oom()`` returns; never swallows the exception."""

    __slots__ = ("_on_exception",)

    def __init__(self, on_exception: Callable[[BaseException], None]) -> None:
        self._on_exception = on_exception

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None:
            self._on_exception(exc)
