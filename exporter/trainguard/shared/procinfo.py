"""What this host says about processes, shared by the reporter and the exporter.

The reporter records itself with it and the exporter checks a recorded process: boot identity,
pid namespaces, "is this the same process", and where a process of another pid namespace is.
(What the kernel log says about a death is :mod:`trainguard.shared.kernlog`.)

A process is identified by its pid and when it started. On Linux the start is exact: field 22
of ``/proc/PID/stat``, clock ticks since boot, the same number in every pid namespace, and
together with the boot id it tells a process from any later one given the same pid (even
within the same second). Elsewhere, or for a heartbeat of an older reporter that did not
record it, the create time is compared within :data:`CREATE_TIME_TOLERANCE`.

Every read degrades to "unknown" (None) rather than raising: a /proc file that does not exist
(Windows, macOS) or cannot be read must never crash either side.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Iterator
from dataclasses import dataclass

import psutil

#: how far a recorded process create time may be from the live one and still be that process
#: (Linux derives it from boot time + start ticks; a clock adjustment shifts both a little)
CREATE_TIME_TOLERANCE = 1.0
#: boot times further apart than this are two boots
BOOT_TIME_TOLERANCE = 5.0
#: inode of the initial pid namespace (Linux's PROC_PID_INIT_INO since 3.8): a process there
#: sees every process of the host in /proc, so one it cannot find is gone
INIT_PID_NS = 0xEFFFFFFC

#: states in /proc/PID/stat of a process that is no longer running (zombie, dead)
_DEAD_STATES = ("Z", "X", "x")


def boot_id() -> str | None:
    """The kernel's random id of this boot (Linux), None elsewhere."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            value = fh.read(100).strip()
    except (OSError, ValueError):
        return None
    return value if 0 < len(value) <= 64 and value.isprintable() else None


def boot_time() -> float | None:
    try:
        return float(psutil.boot_time())
    except Exception:
        return None


def pid_namespace() -> int | None:
    """Inode of this process's pid namespace (Linux).

    A pid recorded in another namespace (a container without the host's pid namespace) cannot
    be checked here.
    """
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def same_boot(
    recorded_id: str | None,
    recorded_time: float | None,
    current_id: str | None,
    current_time: float | None,
) -> bool | None:
    """True if recorded and current identify the same boot, None if that cannot be told."""
    if recorded_id and current_id:
        return recorded_id == current_id
    if recorded_time is not None and current_time is not None:
        return abs(recorded_time - current_time) <= BOOT_TIME_TOLERANCE
    return None


def read_stat(pid: int | str) -> tuple[str, int]:
    """(state, start ticks) of ``pid`` from ``/proc/PID/stat`` (``"self"`` for this process).

    The command name (field 2) is in parentheses and may itself hold spaces and parentheses,
    so the fields are split after the *last* ')'. Raises OSError (FileNotFoundError or
    ProcessLookupError: no such process) or ValueError (not the expected format).
    """
    with open(f"/proc/{pid}/stat", "rb") as fh:
        raw = fh.read(4096)
    head, sep, tail = raw.rpartition(b")")
    fields = tail.split()
    if not sep or len(fields) < 20 or b"(" not in head:
        raise ValueError(f"/proc/{pid}/stat: unexpected format")
    # tail starts at field 3 (state); field 22 (starttime) is the 20th after the name
    return fields[0].decode("ascii", "replace"), int(fields[19])


def read_nspid(pid: int | str) -> list[int] | None:
    """The pids of a process in each pid namespace, from the ``NSpid:`` line of its status.

    That is the line of ``/proc/PID/status`` listing its pid in each pid namespace from the one
    of this /proc down to the process's own (first: as seen here, last: in its innermost
    namespace). None where the kernel has no such line (before 4.1). Raises OSError.
    """
    with open(f"/proc/{pid}/status", "rb") as fh:
        raw = fh.read(16384)
    for line in raw.splitlines():
        if line.startswith(b"NSpid:"):
            try:
                return [int(x) for x in line[6:].split()]
            except ValueError:
                return None
    return None


def _boottime_offset_zero() -> bool | None:
    """Whether this process's time namespace leaves CLOCK_BOOTTIME alone.

    A boot time offset shifts the start ticks this process reads in /proc by that offset.
    True without time namespaces.
    """
    try:
        with open("/proc/self/timens_offsets", encoding="ascii") as fh:
            text = fh.read(1024)
    except FileNotFoundError:
        return True  # a kernel without time namespaces
    except (OSError, ValueError):
        return None
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] in ("boottime", "7"):  # 7: CLOCK_BOOTTIME
            return parts[1] == "0" and parts[2] == "0"
    return True


def own_start_ticks() -> int | None:
    """This process's start in clock ticks since boot (Linux).

    None where it cannot be read or would not compare (another platform, a time namespace with
    a boot time offset).
    """
    if _boottime_offset_zero() is not True:
        return None
    try:
        return read_stat("self")[1]
    except (OSError, ValueError):
        return None


def ticks_comparable() -> bool:
    """Whether start ticks read here compare with ones other processes of this boot recorded.

    They do on Linux, when this process has no time namespace offset of its own.
    """
    return _boottime_offset_zero() is True and os.path.exists("/proc/self/stat")


def own_create_time() -> float:
    """This process's create time, read afresh.

    psutil caches it per Process object, and a clock adjustment since start changes the value
    the exporter computes.
    """
    return float(psutil.Process(os.getpid()).create_time())


def process_state(pid: int) -> str | None:
    """The state letter of the process with this pid (``/proc/PID/stat``), None when there is none.

    A thread of another process is no process here (None). ``Z`` (a zombie) and ``X`` (dead)
    are processes that hold nothing any more: their memory, GPU contexts included, is the
    kernel's to release, so the GPU collector counts what NVML still lists for them as memory
    no live process accounts for. ``D`` (uninterruptible sleep) is a live process that holds
    its memory and cannot be killed while it sleeps. ``?`` when the process exists but its
    state cannot be read (no /proc here: it is taken as alive).

    ``pidfd_open`` (Linux 5.3+) answers whether the pid is a process in one system call: it
    refuses a pid that does not exist (ESRCH) and one that is a thread, not a thread-group
    leader (EINVAL), and needs no permission on the process. The GPU collector asks it for
    every process NVML lists, at every scrape.
    """
    if pid <= 0:
        return "?" if psutil.pid_exists(pid) else None
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return None
    except (AttributeError, OSError):  # not Linux, an older kernel, no pidfd here: psutil
        if not psutil.pid_exists(pid):
            return None
    else:
        os.close(fd)
    try:
        return read_stat(pid)[0]
    except (FileNotFoundError, ProcessLookupError):
        return None  # gone since
    except (OSError, ValueError):
        return "?"


def holds_memory(state: str | None) -> bool:
    """Whether a process in this :func:`process_state` can hold memory: not gone, no zombie."""
    return state is not None and state not in _DEAD_STATES


def process_alive(pid: int, create_time: float, start_ticks: int | None = None) -> bool | None:
    """Whether ``pid`` is still the live process that recorded ``create_time``.

    That is, the same process (by ``create_time`` and ``start_ticks``) and not a zombie. False
    when gone or reused, None when the OS will not say (access denied).

    ``start_ticks`` is compared exactly; pass it only when it was recorded in this boot (same
    boot id) and this process's reads compare (:func:`ticks_comparable`). Without it, or where
    ``/proc`` cannot be read, the create time is compared within the tolerance.
    """
    if start_ticks is not None:
        try:
            state, ticks = read_stat(pid)
        except (FileNotFoundError, ProcessLookupError):
            return False
        except (OSError, ValueError):
            pass  # no /proc here, or unreadable: the tolerance below
        else:
            if ticks != start_ticks:
                return False  # the pid now belongs to a process started at another tick
            return state not in _DEAD_STATES
    try:
        proc = psutil.Process(pid)
        if abs(proc.create_time() - create_time) > CREATE_TIME_TOLERANCE:
            return False  # the pid was reused by another process
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:  # includes ZombieProcess where psutil raises it
        return False
    except psutil.AccessDenied:
        return None
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class NsProcess:
    """A process as its heartbeat recorded it from inside its pid namespace."""

    pid_ns: int  # inode of its pid namespace
    pid: int  # its pid in that namespace
    create_time: float
    start_ticks: int | None  # exact (same boot); None: compare the create time (±1 s)


@dataclass(frozen=True)
class NsLookup:
    """Where a :class:`NsProcess` is in this /proc.

    ``kind``: ``found`` (``host_pid``, and its ``start_ticks``, as this /proc numbers it),
    ``absent`` (no process here has that pid in a namespace below this one and that start),
    ``unverifiable`` (one has, but its namespace cannot be read, for lack of ptrace access,
    and only the create time was left to compare), ``ambiguous`` (several unreadable ones
    match exactly), ``unknown`` (/proc cannot be listed, or has no ``NSpid``).
    """

    kind: str
    host_pid: int | None = None
    start_ticks: int | None = None


def find_in_namespaces(wanted: Collection[NsProcess]) -> dict[NsProcess, NsLookup]:
    """Find processes recorded in other pid namespaces among those of this /proc, in one pass.

    This /proc is the host's for an exporter with the host's pid namespace.

    A candidate has the recorded pid as the last field of its ``NSpid`` (its pid in its
    innermost namespace) and the recorded start: exact start ticks (the same number in every
    namespace: they count from boot), else the create time within the tolerance. Its pid
    namespace (the inode of ``/proc/PID/ns/pid``) must then be the recorded one; reading it
    needs ptrace read access to the process (root, or the same user), so where it is refused
    an exact start-ticks match is taken as the process (two processes with the same pid in
    their namespaces starting at the same clock tick), and a create-time match is not.
    """
    out: dict[NsProcess, NsLookup] = {}
    if not wanted:
        return out
    try:
        if read_nspid("self") is None:
            return {w: NsLookup("unknown") for w in wanted}
        names = os.listdir("/proc")
    except OSError:
        return {w: NsLookup("unknown") for w in wanted}
    hz = _clock_ticks()
    booted = boot_time()
    by_ticks: dict[int, list[NsProcess]] = {}
    by_time: list[NsProcess] = []
    for w in wanted:
        if w.start_ticks is not None:
            by_ticks.setdefault(w.start_ticks, []).append(w)
        else:
            by_time.append(w)
    exact: dict[NsProcess, list[tuple[int, int]]] = {}
    unreadable: dict[NsProcess, list[tuple[int, int]]] = {}
    for name in names:
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            state, ticks = read_stat(pid)
        except (OSError, ValueError):
            continue  # gone meanwhile, or not readable
        if state in _DEAD_STATES:
            continue
        keys = list(by_ticks.get(ticks, ()))
        if by_time and hz and booted is not None:
            created = booted + ticks / hz
            keys += [w for w in by_time if abs(created - w.create_time) <= CREATE_TIME_TOLERANCE]
        if not keys:
            continue
        try:
            nspid = read_nspid(pid)
        except OSError:
            continue
        if not nspid or len(nspid) < 2:
            continue  # in this /proc's own namespace: not a process of another one
        keys = [w for w in keys if w.pid == nspid[-1]]
        if not keys:
            continue
        try:
            ns: int | None = os.stat(f"/proc/{pid}/ns/pid").st_ino
        except (FileNotFoundError, ProcessLookupError):
            continue
        except OSError:
            ns = None  # EACCES: another user's process without ptrace read access
        for w in keys:
            if ns is None:
                unreadable.setdefault(w, []).append((pid, ticks))
            elif ns == w.pid_ns:
                exact.setdefault(w, []).append((pid, ticks))
    for w in wanted:
        hits, unsure = exact.get(w, []), unreadable.get(w, [])
        if hits:
            out[w] = NsLookup("found", *hits[0])
        elif not unsure:
            out[w] = NsLookup("absent")
        elif w.start_ticks is None:
            out[w] = NsLookup("unverifiable")
        elif len(unsure) == 1:
            out[w] = NsLookup("found", *unsure[0])
        else:
            out[w] = NsLookup("ambiguous")
    return out


def still_there(host_pid: int, ns_pid: int, start_ticks: int) -> bool | None:
    """Whether the process found earlier at ``host_pid`` is still running.

    It is when it has the same start ticks (a pid and a start tick name one process for the
    whole boot) and is still ``ns_pid`` in its namespace. False when gone, None when /proc will
    not say.
    """
    try:
        state, ticks = read_stat(host_pid)
        if ticks != start_ticks or state in _DEAD_STATES:
            return False
        nspid = read_nspid(host_pid)
    except (FileNotFoundError, ProcessLookupError):
        return False
    except (OSError, ValueError):
        return None
    if nspid is None:
        return None
    return nspid[-1] == ns_pid


def _clock_ticks() -> int | None:
    try:
        hz = os.sysconf("SC_CLK_TCK")
    except (AttributeError, ValueError, OSError):
        return None
    return hz if hz > 0 else None


def iter_matching(
    pattern: re.Pattern[str], exclude: int, *, cmdline: bool = False
) -> Iterator[tuple[int, float]]:
    """(pid, create time) of live processes whose name matches ``pattern``.

    With ``cmdline`` the whole command line, its arguments joined by spaces, is matched instead.
    A process whose command line cannot be read (another user's, under ``hidepid``) or is empty
    (a kernel thread) never matches.
    """
    field = "cmdline" if cmdline else "name"
    for proc in psutil.process_iter([field, "create_time", "status"]):
        info = proc.info
        value = info.get(field)
        if cmdline and value:
            value = " ".join(value)
        if not value or proc.pid == exclude or info.get("status") == psutil.STATUS_ZOMBIE:
            continue
        if pattern.search(value):
            yield proc.pid, float(info.get("create_time") or 0.0)
