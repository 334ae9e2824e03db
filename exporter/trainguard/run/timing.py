"""Per-rank running totals of time waiting for data and time computing, given to ``Run.step``.

Which rank of a job is slow cannot be read from wall time per step: with DDP the gradient
all-reduce makes every rank wait for the slowest, so all ranks step at one pace. What tells
the straggler is the time a rank spends on its own before the collective: waiting for its
next batch (``data_seconds``) and computing before the backward's all-reduce
(``compute_seconds``). ``Run.step(..., data_seconds=, compute_seconds=)`` adds each step's
durations to these totals, which the heartbeat carries (``timing``) and the exporter
publishes as counters (docs/metrics.md).

The totals are kept on the training thread (only it calls ``step``) as one tuple, replaced
whole, which the reporter's thread reads without a lock.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

from trainguard.shared.heartbeat.record import Timing


class StepTiming:
    """The totals of the durations given to ``Run.step``; ``None`` until one was given."""

    def __init__(self, warn: Callable[..., None]) -> None:
        self._warn = warn
        self._totals: tuple[float, float, int] | None = None

    def add(self, data: Any, compute: Any) -> None:
        """Add one step's durations (either may be None: not measured); bad values are dropped.

        A value that is not a finite number >= 0 drops the whole call, logged once.
        """
        d = self._seconds("data_seconds", data)
        c = self._seconds("compute_seconds", compute)
        if d is None or c is None:
            return
        totals = self._totals or (0.0, 0.0, 0)
        self._totals = (totals[0] + d, totals[1] + c, totals[2] + 1)

    @property
    def totals(self) -> Timing | None:
        """The totals as the heartbeat carries them (read on the reporter's thread)."""
        totals = self._totals
        if totals is None:
            return None
        return Timing(data_seconds=totals[0], compute_seconds=totals[1], steps=totals[2])

    def _seconds(self, name: str, value: Any) -> float | None:
        if value is None:
            return 0.0
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            seconds = float(value)
            if math.isfinite(seconds) and seconds >= 0:
                return seconds
        self._warn(
            f"timing:{name}",
            "trainguard: step(%s=...) ignored: expected a finite number of seconds >= 0, got %s",
            name,
            type(value).__name__ if not isinstance(value, numbers.Real) else repr(value),
        )
        return None
