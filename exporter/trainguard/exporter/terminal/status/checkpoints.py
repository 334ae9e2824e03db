"""``trainguard status``'s checkpoint column: judged once, while the rate's sample is waited for.

Judging a location is the one costly part of a status (``trainguard.checkpoint.latest``: every
step directory listed, every file of the ones nobody recorded checked by its own length; 0.3 s
of CPU for 1,172 Hugging Face checkpoints, seconds on a slow or remote filesystem). The steps
per second need two reads of the heartbeats ``--sample`` apart; before, both reads judged every
location again, after one another. Now the first read leaves the checkpoints out, they are judged
while the sample's time runs, and the second read (heartbeats only) gets them: a status costs
the longer of the two, not their sum. On a terminal, a judgement that outlasts
:data:`PROGRESS_AFTER` says on stderr which location it reads, so a slow filesystem is seen
waiting, not hanging.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

from trainguard.checkpoint.retention import latest
from trainguard.exporter.runs.targets import PRIMARY, CheckpointTarget
from trainguard.shared.manifest import ManifestError

#: seconds a judgement runs before the terminal is told what it waits for
PROGRESS_AFTER = 0.5


class Progress:
    """One line on a terminal's stderr, rewritten in place, shown only once judging is slow.

    Nothing when stderr is not a terminal (a pipe, a file, ``--json`` into a script).
    """

    def __init__(self, out: TextIO | None = None, after: float = PROGRESS_AFTER) -> None:
        self._out = out if out is not None else sys.stderr
        self._on = bool(getattr(self._out, "isatty", lambda: False)())
        self._after = after
        self._started = time.monotonic()
        self._label = ""
        self._shown = False
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None

    def __enter__(self) -> Progress:
        if self._on:
            self._timer = threading.Timer(self._after, self._show)
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._timer is not None:
            self._timer.cancel()
        with self._lock:
            self._on = False
            if self._shown:
                self._out.write("\r\x1b[2K")
                self._out.flush()

    def update(self, label: str) -> None:
        """Now reading ``label``; shown at once when the line is already up."""
        with self._lock:
            self._label = label
        if self._shown:
            self._show()

    def _show(self) -> None:
        with self._lock:
            if not self._on:
                return
            waited = time.monotonic() - self._started
            self._out.write(
                f"\r\x1b[2Ktrainguard status: judging checkpoints: {self._label} ({waited:.0f}s)"
            )
            self._out.flush()
            self._shown = True


#: a location's verdict: (newest complete step or None, error or None)
Found = tuple[int | None, str | None]


def judge_all(
    targets: list[CheckpointTarget], progress: Progress | None = None
) -> dict[tuple[str, str], Found]:
    """(run, location) -> the newest complete step of each target, or why it cannot be read."""
    out: dict[tuple[str, str], Found] = {}
    for i, t in enumerate(targets):
        if progress is not None:
            progress.update(f"{t.path} ({i + 1}/{len(targets)})")
        primary = None
        if t.location != PRIMARY:
            primary = next(
                (p.path for p in targets if p.run == t.run and p.location == PRIMARY), None
            )
        try:
            found = latest(t.path, primary=primary, pattern=t.pattern)
        except FileNotFoundError:
            out[(t.run, t.location)] = (None, "does not exist")
        except (OSError, ManifestError, ValueError) as exc:
            out[(t.run, t.location)] = (None, str(exc))
        else:
            out[(t.run, t.location)] = (found.step if found else None, None)
    return out


def judged_while_waiting(
    judge: Callable[[], dict[tuple[str, str], Found]], seconds: float
) -> dict[tuple[str, str], Found]:
    """``judge()``'s answer, returned no sooner than ``seconds`` from now (the rate's sample)."""
    until = time.monotonic() + seconds
    found = judge()
    left = until - time.monotonic()
    if left > 0:
        time.sleep(left)
    return found
