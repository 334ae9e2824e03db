"""Reading the heartbeat's ``nonfinite`` object, every field checked and named in errors.

Kept apart from :mod:`trainguard.shared.heartbeat.fields` so that the record and its checks
(:mod:`trainguard.shared.nonfinite`) stay one concern.
"""

from __future__ import annotations

from trainguard.shared.fields import integer
from trainguard.shared.heartbeat.fields import Fields
from trainguard.shared.heartbeat.record import MAX_INT, SCALAR_NAME_RE
from trainguard.shared.nonfinite import MAX_NONFINITE_NAMES, NonFinite


def read_nonfinite(fields: Fields, key: str) -> NonFinite | None:
    """The optional ``nonfinite`` object of a heartbeat; None when absent (older reporters)."""
    f = fields.section(key)
    if f is None:
        return None
    counts = f.mapping("counts", MAX_NONFINITE_NAMES)
    for name, count in counts.items():
        if not SCALAR_NAME_RE.match(name):
            f.fail_at("counts", "expected names of letters, digits and '_' (at most 64)")
        if integer(count, 0, MAX_INT):
            f.fail_at(f"counts.{name}", "expected an integer >= 0")
    streak = f.integer("loss_streak", 0, MAX_INT, default=0)
    first = f.integer("loss_first_step", 0, MAX_INT, optional=True)
    return NonFinite(
        counts=dict(counts),
        loss_streak=streak,
        loss_first_step=first if streak else None,
        loss_last_finite_step=f.integer("loss_last_finite_step", 0, MAX_INT, optional=True),
    )
