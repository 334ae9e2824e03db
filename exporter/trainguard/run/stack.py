"""Where a rank is stuck: its main thread's Python stack, sampled only while its step is overdue.

When one rank of a job hangs (a data loader, a file system, a deadlock) every other rank stops
too, waiting for it inside a collective, and all a stall alert can say is that the job stalled.
The reporter's thread (:class:`StuckWatch`, ticked by ``Run``'s writer) learns the run's own pace
from the steps it sees, and when a step is overdue it reads the main thread's frames with
``sys._current_frames()`` and keeps a short description for the heartbeat: the ``torch.distributed``
function the thread waits in (the collective), and the innermost frames of the user's own code.

Nothing runs while the run steps (a tick compares one object and returns), and a sample is
taken at most every :data:`SAMPLE_EVERY` seconds while overdue. Only function names, file base
names and line numbers leave the process: no locals, no arguments, no directories; control
characters are replaced and the text is capped at :data:`MAX_WHERE` characters.

``TRAINGUARD_STUCK_AFTER`` (seconds, default 30) is the least time without a step that counts as
overdue (twice that before the first step); ``0`` turns sampling off.
"""

from __future__ import annotations

import contextlib
import os
import re
import site
import statistics
import sys
import sysconfig
import threading
import time
from collections import deque
from types import FrameType
from typing import Any

from trainguard.shared.heartbeat.record import Stuck

#: overdue: a step later than this many times the run's median interval between steps...
PACE_FACTOR = 3.0
#: ...and at least this many seconds (``TRAINGUARD_STUCK_AFTER``); twice it before a first step
DEFAULT_AFTER = 30.0
#: seconds between two samples of a rank that stays overdue
SAMPLE_EVERY = 5.0
#: how many recent intervals between steps the pace is the median of
PACE_WINDOW = 32
#: the longest description written
MAX_WHERE = 200
#: user frames named in a description, innermost first
USER_FRAMES = 3
#: the torch.distributed functions a rank waits for the others in (collectives, point to point,
#: the rendezvous); named in ``collective`` when the main thread is inside one
COLLECTIVES = frozenset(
    {
        "all_reduce",
        "all_reduce_coalesced",
        "all_gather",
        "all_gather_into_tensor",
        "all_gather_object",
        "all_gather_coalesced",
        "_all_gather_base",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "_reduce_scatter_base",
        "all_to_all",
        "all_to_all_single",
        "broadcast",
        "broadcast_object_list",
        "barrier",
        "monitored_barrier",
        "reduce",
        "gather",
        "gather_object",
        "scatter",
        "scatter_object_list",
        "send",
        "recv",
        "send_object_list",
        "recv_object_list",
        "batch_isend_irecv",
        "init_process_group",
        "new_group",
        "_store_based_barrier",
        "destroy_process_group",
    }
)
_DIST = f"{os.sep}torch{os.sep}distributed{os.sep}"
#: the functions that save a checkpoint, by a part of the path of the file defining them: a rank
#: whose overdue step is spent inside one is saving (rank 0 writing the checkpoint while the
#: others wait for it in a barrier: a pause the run's stall threshold learns), not hung
#: somewhere; ``saving`` in the heartbeat says so
SAVES = (
    (f"{os.sep}trainguard{os.sep}checkpoint{os.sep}", frozenset({"save", "mirror", "mirror_dir"})),
    (f"{os.sep}torch{os.sep}serialization.py", frozenset({"save"})),
    (
        f"{_DIST}checkpoint{os.sep}",
        frozenset({"save", "async_save", "save_state_dict", "_save_state_dict"}),
    ),
    (f"{os.sep}safetensors{os.sep}", frozenset({"save_file", "save_model"})),
    (f"{os.sep}transformers{os.sep}", frozenset({"_save_checkpoint", "save_model"})),
    (f"{os.sep}lightning{os.sep}", frozenset({"save_checkpoint"})),
    (f"{os.sep}pytorch_lightning{os.sep}", frozenset({"save_checkpoint"})),
    (f"{os.sep}deepspeed{os.sep}", frozenset({"save_checkpoint"})),
    (f"{os.sep}accelerate{os.sep}", frozenset({"save_state", "save_model"})),
)
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_SEP = " <- "


def stuck_after() -> float | None:
    """The floor from ``TRAINGUARD_STUCK_AFTER``; None when it is 0 (sampling off)."""
    raw = os.environ.get("TRAINGUARD_STUCK_AFTER", "").strip()
    try:
        value = float(raw) if raw else DEFAULT_AFTER
    except ValueError:
        value = DEFAULT_AFTER
    if value != value or value < 0:  # NaN or negative: the default
        value = DEFAULT_AFTER
    return value or None


def _library_roots() -> tuple[str, ...]:
    """Directories whose files are not the user's code: the stdlib, site-packages, trainguard."""
    roots = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            roots.add(path)
    with contextlib.suppress(Exception):  # a virtualenv's old site module lacks them
        roots.update(site.getsitepackages())
        roots.add(site.getusersitepackages())
    roots.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return tuple(sorted(os.path.join(os.path.realpath(r), "") for r in roots if r))


class Describer:
    """Turns a thread's innermost frame into ``(where, collective)``; knows what is library code."""

    def __init__(self) -> None:
        self._roots = _library_roots()
        self._library: dict[str, bool] = {}  # file name -> library code (memoised)

    def is_library(self, filename: str) -> bool:
        """Whether a code object's file is the stdlib's, an installed package's or frozen."""
        known = self._library.get(filename)
        if known is None:
            if filename.startswith("<"):
                known = filename.startswith("<frozen")  # <stdin>, <string>: the user's
            else:
                path = os.path.realpath(filename)
                known = (
                    path.startswith(self._roots)
                    or f"{os.sep}site-packages{os.sep}" in path
                    or f"{os.sep}dist-packages{os.sep}" in path
                )
            if len(self._library) < 4096:
                self._library[filename] = known
        return known

    def describe(self, frame: FrameType | None) -> tuple[str, str | None]:
        """The description of the stack ending in ``frame`` (innermost first) and its collective.

        ``where`` is the library function the user's code called (the collective's name inside
        torch.distributed; wrappers such as ``<locals>`` closures skipped), then up to
        :data:`USER_FRAMES` user frames as ``file.py:LINE function``, joined by `` <- ``.
        """
        frames: list[tuple[Any, int]] = []
        while frame is not None and len(frames) < 256:
            frames.append((frame.f_code, frame.f_lineno or 0))
            frame = frame.f_back
        collective = None
        boundary = None
        user: list[str] = []
        for code, line in frames:
            filename = code.co_filename
            if self.is_library(filename):
                if user:
                    if len(user) >= USER_FRAMES:
                        break
                    continue  # library frames between user frames (a callback): skipped
                if collective is None and _DIST in filename and code.co_name in COLLECTIVES:
                    collective = code.co_name
                name = _qualname(code)
                if "<locals>" not in name and "<" not in name[:1]:
                    boundary = name  # the outermost one the user's code called, so far
            else:
                if len(user) >= USER_FRAMES:
                    break
                user.append(f"{os.path.basename(filename)}:{line} {_qualname(code)}")
        if collective is not None:
            boundary = collective
        if not user:  # all library code (a framework's own loop): its innermost frames
            user = [_qualname(code) for code, _ in frames[:USER_FRAMES]]
            boundary = collective
        parts = ([boundary] if boundary else []) + user
        return _bounded(_SEP.join(parts)), collective

    def saving(self, frame: FrameType | None) -> bool:
        """Whether the stack ending in ``frame`` is inside a checkpoint save (:data:`SAVES`)."""
        depth = 0
        while frame is not None and depth < 256:
            code = frame.f_code
            for part, names in SAVES:
                if code.co_name in names and part in code.co_filename:
                    return True
            frame = frame.f_back
            depth += 1
        return False


def _qualname(code: Any) -> str:
    return str(getattr(code, "co_qualname", None) or code.co_name)


def _bounded(text: str) -> str:
    """Control characters replaced, at most MAX_WHERE characters (cut at a frame if it can)."""
    text = _CONTROL.sub("?", text)
    if len(text) <= MAX_WHERE:
        return text
    cut = text.rfind(_SEP, 0, MAX_WHERE - 3)
    return (text[:cut] if cut > 0 else text[: MAX_WHERE - 3]) + "..."


class StuckWatch:
    """Learns a rank's pace from its steps and samples its main thread when a step is overdue.

    Runs on the reporter's thread only: :meth:`tick` each wake-up with the latest ``step()``
    tuple (compared by identity), :attr:`current` for the heartbeat, :attr:`version` to tell a
    change that needs writing.
    """

    def __init__(self, thread_id: int | None = None, after: float | None = None) -> None:
        self._thread_id = thread_id if thread_id is not None else threading.get_ident()
        self._after = after
        self._describer: Describer | None = None
        self._gaps: deque[float] = deque(maxlen=PACE_WINDOW)
        self._seen: object = None
        self._last_step_time: float | None = None
        self._progress_at = time.monotonic()  # when progress was last seen (or the start)
        self._next_sample = 0.0
        self.current: Stuck | None = None
        self.version = 0

    def restart(self) -> None:
        """Progress is counted from now (training began after a starting phase)."""
        self._progress_at = time.monotonic()
        if self.current is not None:
            self.current = None
            self.version += 1

    def overdue_after(self) -> float | None:
        """Seconds without a step after which the step is overdue (None: never sampled)."""
        if self._after is None:
            return None
        if self._last_step_time is None:
            return 2 * self._after
        if not self._gaps:
            return self._after
        return max(PACE_FACTOR * statistics.median(self._gaps), self._after)

    def tick(self, latest: object) -> None:
        """Note progress, or sample the main thread when the step is overdue."""
        now = time.monotonic()
        if latest is not self._seen:
            self._seen = latest
            self._progress_at = now
            step_time = latest[1] if isinstance(latest, tuple) and len(latest) > 1 else None
            if isinstance(step_time, float):
                if self._last_step_time is not None and step_time > self._last_step_time:
                    self._gaps.append(step_time - self._last_step_time)
                self._last_step_time = step_time
            if self.current is not None:
                self.current = None
                self.version += 1
            return
        limit = self.overdue_after()
        if limit is None or now - self._progress_at < limit or now < self._next_sample:
            return
        self._next_sample = now + SAMPLE_EVERY
        with contextlib.suppress(Exception):  # a bug here must never stop the heartbeats
            self._sample()

    def _sample(self) -> None:
        frames = sys._current_frames()
        frame = frames.get(self._thread_id)
        if frame is None:
            main = threading.main_thread().ident
            frame = frames.get(main) if main is not None else None
        del frames  # holds every thread's frames (and their locals) alive
        if frame is None:
            return
        if self._describer is None:
            self._describer = Describer()
        try:
            where, collective = self._describer.describe(frame)
            saving = self._describer.saving(frame)
        finally:
            del frame
        old = self.current
        if old is not None and (old.where, old.collective, old.saving) == (
            where,
            collective,
            saving,
        ):
            return
        since = old.since if old is not None else time.time()
        self.current = Stuck(since=since, where=where, collective=collective, saving=saving)
        self.version += 1
