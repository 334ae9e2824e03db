"""CUDA memory snapshots dumped at an out-of-memory error, for PyTorch's memory_viz: the
allocator's recent history is what explains an OOM with "free" VRAM."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

log = logging.getLogger("trainguard.reporter")

#: OOM snapshots one process dumps at most (each can be hundreds of MB)
MAX_OOM_SNAPSHOTS = 10
#: allocation events torch keeps for a snapshot (several KB each)
OOM_HISTORY_ENTRIES = 100_000

Warn = Callable[..., None]


class OomSnapshots:
    """Records CUDA allocation history from the start and dumps it at an OOM, next to the
    heartbeat as ``<heartbeat stem>.oom-<n>.pickle``; ``count`` carries over across restarts
    of the run (the reporter sets it from the previous heartbeat)."""

    def __init__(self, stem: Path, pid: int, warn: Warn, ready: Callable[[], object]) -> None:
        self._stem = stem  # state dir / heartbeat file name without its suffix
        self._pid = pid
        self._warn = warn
        self._ready = ready  # waits (briefly) until the count carried over is known
        self._torch: Any = None
        self.count = 0  # snapshots of this run and rank, this process's and its predecessors'
        self._here = 0  # written by this process
        self.last: Path | None = None

    def start(self) -> None:
        """Start recording allocation history (torch and CUDA needed, else a warning)."""
        try:
            import torch
        except Exception as exc:
            self._warn("oom", "trainguard: OOM capture unavailable: cannot import torch (%s)", exc)
            return
        try:
            if not torch.cuda.is_available():
                self._warn(
                    "oom",
                    "trainguard: OOM capture unavailable: CUDA is not available; "
                    "capture_oom() only passes exceptions through",
                )
                return
            torch.cuda.memory._record_memory_history(max_entries=OOM_HISTORY_ENTRIES)
        except Exception as exc:
            self._warn("oom", "trainguard: OOM capture unavailable: %r", exc)
            return
        self._torch = torch

    def on_exception(self, exc: BaseException, run: str, rank: int) -> None:
        """Dump a snapshot if ``exc`` is a CUDA OOM (at most :data:`MAX_OOM_SNAPSHOTS`)."""
        torch = self._torch
        if torch is None or not isinstance(exc, torch.cuda.OutOfMemoryError):
            return
        if self._here >= MAX_OOM_SNAPSHOTS:
            self._warn(
                "oom-max", "trainguard: %d OOM snapshots written; no more", MAX_OOM_SNAPSHOTS
            )
            return
        self._ready()
        number = self.count + 1
        path = self._stem.with_name(f"{self._stem.name}.oom-{number}.pickle")
        tmp = path.with_name(f".{path.name}.{self._pid}.tmp")
        try:
            torch.cuda.memory._dump_snapshot(str(tmp))
            os.replace(tmp, path)
        except Exception as exc2:
            self._warn("oom-dump", "trainguard: OOM snapshot not written: %r", exc2)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            return
        self.count = number
        self._here += 1
        self.last = path
        log.warning(
            "trainguard: CUDA out of memory in run %r rank %d: memory snapshot written to %s "
            "(open it at https://pytorch.org/memory_viz)",
            run,
            rank,
            path,
        )


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
