"""A run's deaths as the exporter publishes them.

The records of all its ranks' restarts are folded into one last death (which event, which
cause, when), and ages are on this host's clock. Used by the runs collector and by
``trainguard status``.
"""

from __future__ import annotations

from trainguard.shared.heartbeat import Death

#: which of several ranks' records of one death event names it: the most specific cause (a
#: GPU error before an exception: the other ranks' collectives fail because one rank's GPU
#: did). A signal comes last: torchrun's agent stops the surviving ranks with SIGTERM after one
#: rank died of something else, which names the event.
_CAUSE_ORDER = {
    "reboot": 0,
    "oom_killer": 1,
    "gpu_xid": 2,
    "exception": 3,
    "unknown": 4,
    "time_limit": 5,
    "signal": 6,
}
#: restarts of different ranks noticed within this many seconds are one death event
_SAME_EVENT_SECONDS = 60.0


def age(now: float, then: float) -> float:
    """Seconds from ``then`` to ``now``, both of this host's clock.

    A timestamp a little ahead (a heartbeat written while the scrape ran, a clock stepped back)
    is an age of 0.
    """
    return max(0.0, now - then)


def last_death(records: list[Death]) -> Death | None:
    """The run's last death from all its ranks' records.

    The records of the latest restart (noticed within a minute of each other) are one event;
    the most specific cause among them names it (the rank the OOM killer chose says
    ``oom_killer``, the ranks torchrun then stopped say ``signal``), and its earliest
    last-heartbeat is when it died.
    """
    if not records:
        return None
    latest = max(d.detected for d in records)
    event = [d for d in records if d.detected >= latest - _SAME_EVENT_SECONDS]
    return min(event, key=lambda d: (_CAUSE_ORDER.get(d.cause, 9), d.time))
