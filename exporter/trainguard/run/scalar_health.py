"""Counts of the non-finite scalars a training script reports, kept on the writer thread.

``Run.step()`` only stores its arguments (a tensor passed in is never read there: reading it
would wait for the GPU), so the counting happens where the writer thread converts them
(:meth:`trainguard.run.reporter.Run._take_latest`). That thread sees only the latest
``step()`` call at each wake-up, so what is counted is *observed* steps: with steps faster
than the writer's interval (1 s by default), one per interval. docs/metrics.md says so next to
the series.
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
        self._seen: object = None  # the step() record last counted (compared by identity)

    def observe(self, record: object, scalars: Mapping[str, float]) -> None:
        """Count one observed step: ``record`` is what step() stored, ``scalars`` its floats.

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
        if loss is not None:
            self._streak = 0 if math.isfinite(loss) else self._streak + 1

    def state(self) -> NonFinite:
        """The heartbeat's ``nonfinite`` record (empty counts before the first observed step)."""
        return NonFinite(counts=dict(self._counts), loss_streak=self._streak)
