"""Counts of the non-finite scalars a training script reports, kept on the writer thread.

``Run.step()`` only stores its arguments (a tensor passed in is never read there: reading it
would wait for the GPU), so the counting happens where the writer thread converts them
(:meth:`trainguard.run.reporter.writer.HeartbeatWriter._take_latest`). That thread sees only
the latest ``step()`` call at each wake-up, so what is counted is *observed* steps: with steps
faster than the writer's interval (1 s by default), one per interval. docs/metrics.md says so
next to the series.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from trainguard.shared.nonfinite import LOSS, MAX_NONFINITE_NAMES, NonFinite


class ScalarHealth:
    """Non-finite values per scalar name and the loss's non-finite streak, over observed steps.

    Only the writer thread calls it: no lock.
    """

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._streak = 0
        self._first: int | None = None  # the streak's first observed step
        self._last_finite: int | None = None  # the newest observed step with a finite loss
        self._seen: object = None  # the step() record last counted (compared by identity)

    def observe(
        self, record: object, scalars: Mapping[str, float], step: int | None = None
    ) -> None:
        """Count one observed step: ``record`` is what step() stored, ``scalars`` its floats.

        ``step`` is its step number (None when it was not a valid one): where the streak began,
        and the newest step with a finite loss, are kept by it.

        The same record converted again (a keepalive rewrite, the final heartbeat) is not
        counted twice.
        """
        if record is self._seen:
            return
        self._seen = record
        counts = self._counts
        for name, value in scalars.items():
            if name not in counts:
                if len(counts) >= MAX_NONFINITE_NAMES:
                    continue
                counts[name] = 0
            if not math.isfinite(value):
                counts[name] += 1
        loss = scalars.get(LOSS)
        if loss is None:
            return
        if math.isfinite(loss):
            self._streak, self._first = 0, None
            if step is not None:
                self._last_finite = step
        else:
            if self._streak == 0:
                self._first = step
            self._streak += 1

    def state(self) -> NonFinite:
        """The heartbeat's ``nonfinite`` record (empty counts before the first observed step)."""
        return NonFinite(
            counts=dict(self._counts),
            loss_streak=self._streak,
            loss_first_step=self._first,
            loss_last_finite_step=self._last_finite,
        )
