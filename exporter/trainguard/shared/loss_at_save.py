"""Whether this process's loss was finite when a checkpoint is saved.

A checkpoint saved after the loss turned NaN holds weights that are NaN too: resuming from it
resumes the divergence. ``trainguard.Run`` knows the loss and ``trainguard.checkpoint`` writes
the record, but the checkpoint library sits below the run (it never imports it), so the run
registers a probe here and the library asks it when it commits a record. One probe per process:
the newest ``Run`` created, held weakly so that a run no longer referenced answers nothing;
a run that has ended still answers (the final save after its ``with`` block).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

_probe: weakref.WeakMethod[Callable[[], bool | None]] | None = None


def register(probe: Callable[[], bool | None]) -> None:
    """Make ``probe`` (a bound method of the process's run) the one asked at each save."""
    global _probe
    _probe = weakref.WeakMethod(probe)


def loss_finite() -> bool | None:
    """True or False: the loss this process reported last was finite or not; None: unknown.

    Unknown when no run is registered, it has reported no loss yet, or the probe failed (a
    save never fails for this).
    """
    ref = _probe
    probe = None if ref is None else ref()
    if probe is None:
        return None
    try:
        return probe()
    except Exception:
        return None
