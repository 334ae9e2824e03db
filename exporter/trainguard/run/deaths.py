"""Death history: whether the previous process of a run and rank died, and why.

When a run starts again under the same name and rank, the previous process may have died,
finished, or still be alive. A dead process cannot report its own death, so the next one
records it and carries the history forward (:func:`predecessor`, at the start of every
``trainguard.Run``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.shared import kernlog, procinfo
from trainguard.shared.heartbeat.read import read_heartbeat
from trainguard.shared.heartbeat.record import MAX_DEATH_HISTORY, Death, Heartbeat, HeartbeatError
from trainguard.shared.stops import StopRecordError, read_stop, stop_filename

log = logging.getLogger("trainguard.reporter")

#: seconds before the dead process's last sign of progress from which a GPU error in the
#: kernel log that names no process counts as its cause
XID_SLACK = 60.0


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
    """The death of the process that wrote ``prev``, or None when it finished or is alive.

    ``on_duplicate`` is told when it is another live process reporting the same run.
    """
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
    oom, xid = False, None
    if same_host and boot is not False:  # this boot's kernel log may say what happened
        oom, xid = _kernel_says(prev)
    signal = None
    if prev.state == "failed" and prev.signal is None:
        cause = "exception"  # it said so itself; a GPU error behind it is told as xid
    elif same_host and boot is False:
        cause, xid = "reboot", None  # that boot's kernel log is gone with it (and a
        # shutdown's SIGTERM is the reboot's)
    elif prev.signal is not None:  # it said so itself: ended by a signal it caught, or
        # killed while that signal's handler ran (its state still "running")
        cause, signal = prev.exit_cause or "signal", prev.signal
    elif oom:
        cause, xid = "oom_killer", None
    elif xid is not None:
        cause = "gpu_xid"
    else:
        cause = "unknown"
    return Death(
        step=prev.step,
        time=prev.time,
        detected=time.time(),
        cause=cause,
        xid=xid,
        signal=signal,
        job=prev.job.id if prev.job is not None else "",
    )


def _kernel_says(prev: Heartbeat) -> tuple[bool, int | None]:
    """(the OOM killer killed it, the GPU error that ended it) per this boot's kernel log.

    The OOM killer names the pid it kills, as the host numbers it: matched only for a process
    of the host's pid namespace (a container's pid 1 is not the host's). A GPU error (a fatal
    NVIDIA Xid, :data:`~trainguard.shared.kernlog.FATAL_XIDS`) counts when the driver names
    the process, at any time in its life, or, naming none (79 "fallen off the bus" never
    does) or a process of another namespace, when it was logged after the process's last
    sign of progress (its last step, else its last heartbeat) less :data:`XID_SLACK`: a
    process whose GPU failed stops stepping at once, but may hang on for minutes (a
    collective's timeout) writing heartbeats before it dies. The earliest such error is the
    one that ended it; one naming another host process is that process's.
    """
    lines = kernlog.read_kernel_log(prev.create_time - 1.0)
    if not lines:
        return False, None
    global_pid = prev.pid_ns in (None, procinfo.INIT_PID_NS)  # the kernel logs host pids
    if global_pid and any(kernlog.oom_pid(line.text) == prev.pid for line in lines):
        return True, None
    progress = min(prev.time, prev.step_time if prev.step_time is not None else prev.time)
    window = progress - XID_SLACK
    for line in lines:  # oldest first
        found = kernlog.parse_xid(line.text)
        if found is None or found.code not in kernlog.FATAL_XIDS:
            continue
        if global_pid and found.pid is not None:
            if found.pid == prev.pid:
                return False, found.code
            continue  # the driver pinned it on another process
        if line.time is not None and line.time >= window:
            return False, found.code
    return False, None


def _maybe_alive(prev: Heartbeat, me: Identity, boot: bool | None) -> bool:
    """Whether the process that wrote ``prev`` may still be running.

    That process ran on this host, in this boot or one that cannot be told apart.

    In this process's pid namespace (or where either namespace is unknown) its pid is checked
    directly. In another one (a container restarted in a new pid namespace, or this process
    in a container and the predecessor on the host), it is looked for where this process's
    /proc shows it: found alive, or a match that cannot be verified (the exporter calls that
    unknown too), is no death. Not found is a death even where this /proc cannot see that
    namespace (a container's own /proc shows only its own processes): a run and rank that
    starts in a new pid namespace is a restarted container or pod, which Kubernetes and Docker
    start only after the previous one's process ended, and a pid namespace ends with its
    first process. The exporter, with the host's pid namespace, will have reported that
    process dead by then; the exception is two pods reporting the same run and rank at once.
    """
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


def predecessor(
    path: Path, me: Identity, who: str, warn_once: Callable[..., Any]
) -> tuple[Heartbeat | None, DeathHistory, int | None]:
    """What the previous process of this run and rank left: its heartbeat, history and death.

    That process's heartbeat is at ``path`` (``who`` names the run and rank in the log). Returns
    that heartbeat (None when there is none, or it cannot be trusted, which is logged once), the
    death history carried forward with its death added when it died, and that death's number
    (None when it did not die).
    """
    if not os.path.lexists(path):
        return None, DeathHistory(), None
    try:
        prev = read_heartbeat(path)
    except HeartbeatError as exc:
        warn_once("previous", "trainguard: previous heartbeat ignored: %s", exc)
        return None, DeathHistory(), None

    def duplicate(alive: Heartbeat) -> None:
        warn_once(
            "duplicate",
            "trainguard: pid %d is alive and already reports %s; "
            "this process overwrites its heartbeat",
            alive.pid,
            who,
        )

    deaths = DeathHistory.carried_from(prev)
    death = death_of(prev, me, duplicate)
    if death is None:
        return prev, deaths, None
    if stopped_on_purpose(path, prev):
        log.info(
            "trainguard: %s: the previous process (pid %d) was stopped on purpose (trainguard "
            "stop) at step %s: no death recorded",
            who,
            prev.pid,
            prev.step,
        )
        return prev, deaths, None
    deaths = deaths.plus(death)
    log.warning(
        "trainguard: %s: the previous process (pid %d) died at step %s without finishing "
        "(cause: %s); death %d recorded",
        who,
        prev.pid,
        death.step,
        death.cause,
        deaths.count,
    )
    return prev, deaths, deaths.count


def stopped_on_purpose(path: Path, prev: Heartbeat) -> bool:
    """Whether ``trainguard stop`` recorded that it stopped the process that wrote ``prev``.

    Its record (:mod:`trainguard.shared.stops`) lies next to the heartbeat at ``path`` and
    counts only when owned by the heartbeat's owner or root, names that very process and that
    process ended by the record's deadline: then its end is no death, as the exporter already
    said (``cause="on_purpose"``), and a relaunch is no restart after a crash.
    """
    try:
        owner = os.lstat(path).st_uid
        record = read_stop(path.with_name(stop_filename(prev.run, prev.rank)), owner)
    except (OSError, StopRecordError):
        return False  # none, or none to trust: the end is judged as it reads
    return record.names(prev)
