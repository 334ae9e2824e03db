"""Death history: when a run starts again under the same name and rank, whether the previous
process died (rather than finished, or is still alive), and why. A dead process cannot report
its own death, so the next one records it and carries the history forward."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from trainguard.shared import procinfo
from trainguard.shared.heartbeat import MAX_DEATH_HISTORY, Death, Heartbeat


@dataclass(frozen=True)
class Identity:
    """What tells this process apart from its predecessor's."""

    pid: int
    host: str
    boot_id: str | None
    boot_time: float | None
    pid_ns: int | None


def death_of(
    prev: Heartbeat, me: Identity, on_duplicate: Callable[[Heartbeat], None]
) -> Death | None:
    """The death of the process that wrote ``prev``, or None when it finished or is alive
    (``on_duplicate`` is told when it is another live process reporting the same run)."""
    if prev.state == "finished":
        return None
    same_host = prev.host == me.host
    boot = procinfo.same_boot(prev.boot_id, prev.boot_time, me.boot_id, me.boot_time)
    checkable = same_host and boot is not False and prev.pid_ns in (None, me.pid_ns)
    # exact start ticks only within one boot (they count from it), else the create time
    ticks = prev.start_ticks if boot is True and procinfo.ticks_comparable() else None
    if checkable and procinfo.process_alive(prev.pid, prev.create_time, ticks):
        if prev.pid != me.pid:
            on_duplicate(prev)
        return None  # alive: not a death (or an earlier Run in this same process)
    if prev.state == "failed":
        cause = "exception"
    elif same_host and boot is False:
        cause = "reboot"
    elif same_host and procinfo.oom_killed(prev.pid, prev.create_time - 1.0):
        cause = "oom_killer"
    else:
        cause = "unknown"
    return Death(step=prev.step, time=prev.time, detected=time.time(), cause=cause)


@dataclass(frozen=True)
class DeathHistory:
    """The deaths of a run and rank so far: all of them counted, the newest kept."""

    count: int = 0
    recent: tuple[Death, ...] = ()

    @classmethod
    def carried_from(cls, prev: Heartbeat) -> DeathHistory:
        return cls(prev.deaths, prev.death_history)

    def plus(self, death: Death) -> DeathHistory:
        return DeathHistory(self.count + 1, (*self.recent, death)[-MAX_DEATH_HISTORY:])
