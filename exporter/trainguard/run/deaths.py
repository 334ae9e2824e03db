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
    boot = procinfo.same_boot(prev.boot_id, prev.boot_time, me.boot_id, me.boot_time)
    # one boot id is one machine: a pod's hostname is the pod's name, not the node's, and a
    # run's new pod on the same node has another one
    same_host = prev.host == me.host or (prev.boot_id is not None and prev.boot_id == me.boot_id)
    if same_host and boot is not False and _maybe_alive(prev, me, boot):
        if prev.pid != me.pid or prev.pid_ns != me.pid_ns:
            on_duplicate(prev)
        return None  # alive: not a death (or an earlier Run in this same process)
    if prev.state == "failed":
        cause = "exception"
    elif same_host and boot is False:
        cause = "reboot"
    elif (
        same_host
        and prev.pid_ns in (None, procinfo.INIT_PID_NS)  # the kernel logs host pids
        and procinfo.oom_killed(prev.pid, prev.create_time - 1.0)
    ):
        cause = "oom_killer"
    else:
        cause = "unknown"
    return Death(step=prev.step, time=prev.time, detected=time.time(), cause=cause)


def _maybe_alive(prev: Heartbeat, me: Identity, boot: bool | None) -> bool:
    """Whether the process that wrote ``prev`` (on this host, in this boot or one that cannot
    be told apart) may still be running.

    In this process's pid namespace (or where either namespace is unknown) its pid is checked
    directly. In another one (a container restarted in a new pid namespace, or this process
    in a container and the predecessor on the host), it is looked for where this process's
    /proc shows it: found alive, or a match that cannot be verified (the exporter calls that
    unknown too), is no death. Not found is a death even where this /proc cannot see that
    namespace (a container's own /proc shows only its own processes): a run and rank that
    starts in a new pid namespace is a restarted container or pod, which Kubernetes and Docker
    start only after the previous one's process ended, and a pid namespace ends with its
    first process. The exporter, with the host's pid namespace, will have reported that
    process dead by then; the exception is two pods reporting the same run and rank at once."""
    # exact start ticks only within one boot (they count from it), else the create time
    ticks = prev.start_ticks if boot is True and procinfo.ticks_comparable() else None
    if prev.pid_ns is None or me.pid_ns is None or prev.pid_ns == me.pid_ns:
        return procinfo.process_alive(prev.pid, prev.create_time, ticks) is True
    key = procinfo.NsProcess(prev.pid_ns, prev.pid, prev.create_time, ticks)
    found = procinfo.find_in_namespaces([key])[key]
    return found.kind in ("found", "unverifiable", "ambiguous")


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
