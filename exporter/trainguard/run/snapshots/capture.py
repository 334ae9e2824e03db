"""CUDA memory snapshots for PyTorch's memory_viz, taken by the reporter.

They are taken at an OOM (``Run.capture_oom()``), every N steps or seconds (a rolling set: the
newest ``keep`` files), and when ``trainguard snapshot RUN`` asks from outside the process. The
OOM's own snapshot shows the allocator at the failure; the one from before it shows the history
that led there.

Everything but the OOM dump runs on the reporter's thread, never inside ``step()``. Nothing here
may end the training: a snapshot that cannot be taken (no CUDA, a torch without the snapshot
API, a full disk) is logged once per kind of failure, counted per reason in the heartbeat
(``trainguard_run_memory_snapshot_failures_total``), and training goes on.

A dump calls ``torch.cuda.memory._snapshot()`` and pickles its result exactly as
``torch.cuda.memory._dump_snapshot`` does (to a temp file renamed into place). While it runs it
holds the GIL (building and pickling the snapshot is Python work), so the training loop's Python
waits for it; GPU work already queued keeps running. File names and the request format are in
``trainguard.shared.snapshots``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard._version import __version__
from trainguard.run.options import Schedule
from trainguard.run.snapshots.files import SnapshotFiles
from trainguard.run.snapshots.requests import Requests
from trainguard.shared.heartbeat.record import (
    MAX_RECENT_SNAPSHOTS,
    Heartbeat,
    SnapshotRecord,
    SnapshotState,
)
from trainguard.shared.snapshots import (
    META_FORMAT,
    REASONS,
    ROTATING,
    Request,
    metadata_name,
    snapshot_name,
    write_json,
)

log = logging.getLogger("trainguard.reporter")

#: OOM snapshots one process dumps at most (each can be hundreds of MB)
MAX_OOM_SNAPSHOTS = 10
#: allocation events torch keeps for a snapshot (several KB each)
HISTORY_ENTRIES = 100_000
#: no snapshot when the state directory's disk has less free space than this, or than twice
#: the largest snapshot this process wrote, whichever is more
MIN_FREE_BYTES = 1 << 30

Warn = Callable[..., None]


@dataclass(frozen=True)
class Identity:
    """Who the snapshots belong to, for their metadata."""

    run: str
    rank: int
    pid: int
    host: str


#: (step, scalars) at this moment, as the heartbeat would record them
Progress = Callable[[], tuple[int | None, Mapping[str, float]]]


class MemorySnapshots:
    """A run and rank's memory snapshots.

    ``enabled`` is ``oom_snapshots=True``: without it nothing is recorded, dumped or answered, and
    the heartbeat carries no ``snapshots``.
    """

    def __init__(
        self,
        state_dir: Path,
        stem: str,
        who: Identity,
        warn: Warn,
        ready: Callable[[], object],
        *,
        enabled: bool,
        schedule: Schedule,
        config: Any = None,
        devices: Callable[[], list[dict[str, Any]]] = list,
    ) -> None:
        self._dir = state_dir
        self._stem = stem
        self._who = who
        self._warn = warn
        self._ready = ready  # waits (briefly) until the counts carried over are known
        self.enabled = enabled
        self._schedule = schedule
        self._config = config
        self._devices = devices
        self._files = SnapshotFiles(state_dir, stem, who.pid, warn)
        self._lock = threading.Lock()  # one dump at a time: the reporter's and an OOM's
        self.counts = dict.fromkeys(REASONS, 0)  # carried across restarts
        self.failures = dict.fromkeys(REASONS, 0)
        self.history: bool | None = None  # torch records the allocation history
        self.recent: deque[SnapshotRecord] = deque(maxlen=MAX_RECENT_SNAPSHOTS)
        self.version = 0  # bumped at every change the heartbeat shows
        self.last: Path | None = None  # the OOM snapshot this process wrote last
        self._oom_here = 0
        self._largest = 0
        self._next_step = schedule.every_steps
        self._next_time = (
            None if schedule.every_seconds is None else time.monotonic() + schedule.every_seconds
        )
        self._requests = Requests(state_dir, stem, f"run {who.run!r} rank {who.rank}", warn)

    @property
    def oom_count(self) -> int:
        """OOM snapshots of the run and rank (the heartbeat's ``memory_snapshots``)."""
        return self.counts["oom"]

    def state(self) -> SnapshotState | None:
        if not self.enabled:
            return None
        with self._lock:  # an OOM dump on the training thread may be changing them
            return SnapshotState(
                counts=dict(self.counts),
                failures=dict(self.failures),
                history=self.history,
                requests=True,
                recent=tuple(self.recent),
            )

    # -- start, and what a restart carries over --------------------------------------------

    def start(self) -> None:
        """Start recording the allocation history.

        A snapshot without it still shows the segments and blocks, but not the timeline nor the
        stack traces of past events.
        """
        if not self.enabled:
            return
        self.history = False
        try:
            import torch
        except Exception as exc:
            self._warn("oom", "trainguard: OOM capture unavailable: cannot import torch (%s)", exc)
            return
        try:
            if not torch.cuda.is_available():
                self._warn(
                    "oom",
                    "trainguard: OOM capture unavailable: CUDA is not available; memory "
                    "snapshots cannot be taken (each attempt is counted in "
                    "trainguard_run_memory_snapshot_failures_total), training continues",
                )
                return
            torch.cuda.memory._record_memory_history(max_entries=HISTORY_ENTRIES)
        except Exception as exc:  # a torch without it, a failing driver
            self._warn("oom", "trainguard: OOM capture unavailable: %r", exc)
            return
        self.history = True

    def carry(self, prev: Heartbeat | None, died: int | None) -> None:
        """Continue the numbering of the previous process's snapshots.

        The numbering is taken from its heartbeat, and the files on disk, whichever is further:
        a lost heartbeat must not make a snapshot overwrite another. ``died``: the death just
        recorded (its number), whose newest periodic snapshot is kept as
        ``<stem>.died-<n>.before.pickle``.
        """
        if not self.enabled:
            if prev is not None:
                self.counts["oom"] = prev.memory_snapshots
            return
        with self._lock:
            if prev is not None:
                self.counts["oom"] = prev.memory_snapshots
                if prev.snapshots is not None:
                    for reason in REASONS:
                        self.counts[reason] = max(
                            self.counts[reason], prev.snapshots.counts.get(reason, 0)
                        )
                        self.failures[reason] = prev.snapshots.failures.get(reason, 0)
                    self.recent.extend(prev.snapshots.recent)
            for name in self._files.own():
                if not name.before:
                    self.counts[name.reason] = max(self.counts[name.reason], name.number)
            self._files.remove_stale_temps()
            if died is not None:
                self._keep_before("died", died)
            self.version += 1

    # -- the reporter's thread -------------------------------------------------------------

    def tick(self, progress: Progress) -> None:
        """Take the snapshots that are due and answer a request. Never raises.

        Called by the reporter's thread between heartbeats.
        """
        if not self.enabled:
            return
        try:
            self._requests.answer(progress, self._dump_requested)
            due = False
            step, scalars = progress()
            s = self._schedule
            every = s.every_steps
            if every is not None and step is not None and step >= (self._next_step or every):
                due = True
                self._next_step = (step // every + 1) * every
            if s.every_seconds is not None and self._next_time is not None:
                now = time.monotonic()
                if now >= self._next_time:
                    due = True
                    self._next_time = now + s.every_seconds
            if due:  # a failure is not retried before the next one is due
                with self._lock:
                    self._dump("periodic", step, scalars)
        except Exception as exc:  # a bug here must never reach the training loop
            self._warn(f"tick:{type(exc).__name__}", "trainguard: memory snapshots: %r", exc)

    def _dump_requested(
        self, step: int | None, scalars: Mapping[str, float], request: Request
    ) -> tuple[str | None, str | None]:
        with self._lock:
            return self._dump("requested", step, scalars, request)

    # -- the training thread, at an OOM ----------------------------------------------------

    def on_exception(self, exc: BaseException, progress: Progress) -> None:
        """Dump a snapshot if ``exc`` is a CUDA OOM, keeping the newest periodic one beside it.

        At most :data:`MAX_OOM_SNAPSHOTS` per process; the periodic one is kept as
        ``oom-<n>.before``.
        """
        if not self.enabled:
            return
        torch = sys.modules.get("torch")
        oom_type = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)
        if not isinstance(oom_type, type) or not isinstance(exc, oom_type):
            return
        if self._oom_here >= MAX_OOM_SNAPSHOTS:
            self._warn(
                "oom-max", "trainguard: %d OOM snapshots written; no more", MAX_OOM_SNAPSHOTS
            )
            return
        self._ready()
        step, scalars = progress()
        with self._lock:
            self._keep_before("oom", self.counts["oom"] + 1)
            name, _ = self._dump("oom", step, scalars)
        if name is None:
            return
        self._oom_here += 1
        self.last = self._dir / name
        log.warning(
            "trainguard: CUDA out of memory in run %r rank %d: memory snapshot written to %s "
            "(open it at https://pytorch.org/memory_viz)",
            self._who.run,
            self._who.rank,
            self.last,
        )

    # -- dumping (the caller holds the lock) -----------------------------------------------

    def _dump(
        self,
        reason: str,
        step: int | None,
        scalars: Mapping[str, float],
        request: Request | None = None,
    ) -> tuple[str | None, str | None]:
        """(the snapshot's file name, None), or (None, why not) after counting the failure."""
        torch = sys.modules.get("torch")
        if torch is None:
            return self._failed(reason, "torch", "torch is not imported in this process")
        number = self.counts[reason] + 1
        name = snapshot_name(self._stem, reason, number)
        try:
            if not torch.cuda.is_available():
                return self._failed(reason, "no-cuda", "CUDA is not available")
            free = shutil.disk_usage(self._dir).free
            need = max(MIN_FREE_BYTES, 2 * self._largest)
            if free < need:
                return self._failed(
                    reason,
                    "disk",
                    f"only {free >> 20} MiB free in {self._dir} (a snapshot needs {need >> 20})",
                )
            data = torch.cuda.memory._snapshot()
            size = self._files.write_pickle(name, data)
        except Exception as exc:  # no CUDA, no such API, a full disk: never the training's end
            return self._failed(reason, type(exc).__name__, repr(exc))
        self._largest = max(self._largest, size)
        self.counts[reason] = number
        now = time.time()
        self.recent.append(SnapshotRecord(name, reason, step, now, size))
        self.version += 1
        try:
            meta = self._metadata(reason, number, name, size, step, scalars, now, request)
            write_json(self._dir / metadata_name(name), meta)
        except Exception as exc:
            self._warn("meta", "trainguard: snapshot metadata not written: %r", exc)
        if reason in ROTATING:
            removed = self._files.rotate(reason, self._schedule.keep)
            if removed:
                self.recent = deque(
                    (r for r in self.recent if r.file not in removed), maxlen=MAX_RECENT_SNAPSHOTS
                )
        return name, None

    def _failed(self, reason: str, kind: str, why: str) -> tuple[None, str]:
        self.failures[reason] += 1
        self.version += 1
        self._warn(
            f"snapshot:{kind}",
            "trainguard: memory snapshot (%s) not taken: %s; training continues (counted in "
            "trainguard_run_memory_snapshot_failures_total, not logged again)",
            reason,
            why,
        )
        return None, why

    def _metadata(
        self,
        reason: str,
        number: int,
        name: str,
        size: int,
        step: int | None,
        scalars: Mapping[str, float],
        now: float,
        request: Request | None,
    ) -> dict[str, Any]:
        """What lets two snapshots be compared.

        It records the run, the moment, the software, the GPU, the allocator settings and the
        experiment's configuration.
        """
        torch = sys.modules.get("torch")
        config = self._config
        batch = scalars.get("batch_size")
        if batch is None and isinstance(config, dict):
            batch = config.get("batch_size")
        return {
            "format": META_FORMAT,
            "run": self._who.run,
            "rank": self._who.rank,
            "pid": self._who.pid,
            "host": self._who.host,
            "reason": reason,
            "number": number,
            "snapshot": name,
            "bytes": size,
            "step": step,
            "time": now,
            "scalars": dict(scalars),
            "batch_size": batch,
            "config": config,
            "request": None if request is None else {"id": request.id, "by": request.requester},
            "history_recorded": self.history,
            "torch_version": str(getattr(torch, "__version__", "")) or None,
            "cuda_version": getattr(getattr(torch, "version", None), "cuda", None),
            "pytorch_cuda_alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
            "devices": self._devices(),
            "trainguard_version": __version__,
        }

    def _keep_before(self, tag: str, number: int) -> None:
        """Keep the newest periodic snapshot out of rotation, and say so in the recent list.

        It is renamed ``<tag>-<number>.before``.
        """
        renamed = self._files.keep_before(tag, number)
        if renamed is None:
            return
        source, target = renamed
        self.recent = deque(
            (dataclasses.replace(r, file=target) if r.file == source else r for r in self.recent),
            maxlen=MAX_RECENT_SNAPSHOTS,
        )
        self.version += 1
