"""The heartbeat's ``nonfinite`` object: NaN and infinite scalars the reporter observed.

A NaN loss is the first sign of a diverged run (or of silent data corruption), and every step
after it is wasted; this record lets the exporter count it and an alert page on it.

The counts are per scalar name; the streak is the loss's alone. Both count the *observed*
steps: the reporter's writer thread converts only the latest ``step()`` call at each wake-up
(once a second by default), so a step the script reported between two wake-ups is never seen.
They start from zero in every process (a restart resumes from a checkpoint whose loss was
finite): not carried across restarts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: the scalar whose non-finite streak is kept (the name the framework callbacks give it too)
LOSS = "loss"
#: scalar names counted at most (twice the scalars a heartbeat carries, for names that change)
MAX_NONFINITE_NAMES = 32


@dataclass(frozen=True)
class NonFinite:
    """Observed steps with a NaN or infinite value, per scalar; the loss's current streak."""

    #: scalar name -> observed steps whose value was NaN, +inf or -inf (0 for a name seen
    #: finite only, so that a counter exists before its first increase)
    counts: Mapping[str, int] = field(default_factory=dict)
    #: consecutive observed steps, up to the latest, whose ``loss`` was not finite; observed
    #: steps without a loss leave it as it is
    loss_streak: int = 0
    #: the step of the streak's first observed step (None while the streak is 0): the loss
    #: turned non-finite after ``loss_last_finite_step`` and at or before this step
    loss_first_step: int | None = None
    #: the newest observed step whose loss was finite (None before the first one)
    loss_last_finite_step: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"counts": dict(self.counts), "loss_streak": self.loss_streak}
        if self.loss_first_step is not None:
            out["loss_first_step"] = self.loss_first_step
        if self.loss_last_finite_step is not None:
            out["loss_last_finite_step"] = self.loss_last_finite_step
        return out
