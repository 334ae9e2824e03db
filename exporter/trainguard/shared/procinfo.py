"""What this host says about processes, shared by the reporter (recording itself) and the
exporter (checking a recorded process): boot identity, pid namespace, "is this the same
process", and whether the kernel's OOM killer killed a pid.

A process is identified by its pid and when it started. On Linux the start is exact: field 22
of ``/proc/PID/stat``, clock ticks since boot, the same number in every pid namespace, and
together with the boot id it tells a process from any later one given the same pid (even
within the same second). Elsewhere, or for a heartbeat of an older reporter that did not
record it, the create time is compared within :data:`CREATE_TIME_TOLERANCE`.

Every read degrades to "unknown" (None) rather than raising: a /proc file that does not exist
(Windows, macOS) or cannot be read must never crash either side.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator

import psutil

#: how far a recorded process create time may be from the live one and still be that process
#: (Linux derives it from boot time + start ticks; a clock adjustment shifts both a little)
CREATE_TIME_TOLERANCE = 1.0
#: boot times further apart than this are two boots
BOOT_TIME_TOLERANCE = 5.0

_OOM_PATTERNS = (
    re.compile(r"\bKill(?:ed)? process (\d+)\b"),  # "Out of memory: Killed process 123 (python)"
    re.compile(r"\boom-kill:.*?[,:]pid=(\d+)\b"),  # "oom-kill:constraint=...,task=x,pid=123,"
    re.compile(r"\boom_reaper: reaped process (\d+)\b"),
)
#: states in /proc/PID/stat of a process that is no longer running (zombie, dead)
_DEAD_STATES = ("Z", "X", "x")
_KMSG_MAX_RECORDS = 200_000
_KERNEL_LOG_SECONDS = 2.0


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
    """Inode of this process's pid namespace (Linux): a pid recorded in another namespace (a
    container without the host's pid namespace) cannot be checked here."""
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
    ProcessLookupError: no such process) or ValueError (not the expected format)."""
    with open(f"/proc/{pid}/stat", "rb") as fh:
        raw = fh.read(4096)
    head, sep, tail = raw.rpartition(b")")
    fields = tail.split()
    if not sep or len(fields) < 20 or b"(" not in head:
        raise ValueError(f"/proc/{pid}/stat: unexpected format")
    # tail starts at field 3 (state); field 22 (starttime) is the 20th after the name
    return fields[0].decode("ascii", "replace"), int(fields[19])


def _boottime_offset_zero() -> bool | None:
    """Whether this process's time namespace leaves CLOCK_BOOTTIME alone (it then shifts the
    start ticks this process reads in /proc by its offset). True without time namespaces."""
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
    """This process's start in clock ticks since boot (Linux), None where it cannot be read
    or would not compare (another platform, a time namespace with a boot time offset)."""
    if _boottime_offset_zero() is not True:
        return None
    try:
        return read_stat("self")[1]
    except (OSError, ValueError):
        return None


def ticks_comparable() -> bool:
    """Whether start ticks this process reads in /proc compare with ones recorded by other
    processes of this boot: Linux, and no time namespace offset of its own."""
    return _boottime_offset_zero() is True and os.path.exists("/proc/self/stat")


def own_create_time() -> float:
    """This process's create time, read afresh (psutil caches it per Process object, and a
    clock adjustment since start changes the value the exporter computes)."""
    return float(psutil.Process(os.getpid()).create_time())


def process_alive(pid: int, create_time: float, start_ticks: int | None = None) -> bool | None:
    """Is ``pid`` the same process that recorded ``create_time`` (and ``start_ticks``), and
    not a zombie? False when gone or reused, None when the OS will not say (access denied).

    ``start_ticks`` is compared exactly; pass it only when it was recorded in this boot (same
    boot id) and this process's reads compare (:func:`ticks_comparable`). Without it, or where
    ``/proc`` cannot be read, the create time is compared within the tolerance."""
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


def oom_killed(pid: int, since: float) -> bool:
    """Best effort: does the kernel log say the OOM killer killed ``pid`` after ``since``
    (seconds since the epoch)? Reads /dev/kmsg, else ``journalctl -k``, else ``dmesg``;
    bounded to about two seconds; any failure means "not known to be", i.e. False."""
    deadline = time.monotonic() + _KERNEL_LOG_SECONDS
    try:
        lines = _kmsg_lines(since, deadline)
        if lines is None:
            lines = _command_lines(
                ["journalctl", "-k", "-q", "--no-pager", "-o", "cat", f"--since=@{int(since)}"],
                deadline,
            )
        if lines is None:
            lines = _dmesg_after(_command_lines(["dmesg"], deadline), since)
        return lines is not None and any(_oom_pid(line) == pid for line in lines)
    except Exception:
        return False


def _oom_pid(line: str) -> int | None:
    for pattern in _OOM_PATTERNS:
        m = pattern.search(line)
        if m:
            return int(m.group(1))
    return None


def _kmsg_lines(since: float, deadline: float) -> list[str] | None:
    """Records of /dev/kmsg logged after ``since`` (its timestamps are microseconds since
    boot), or None when it cannot be read (no permission, not Linux)."""
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    booted = boot_time() or 0.0
    lines: list[str] = []
    with contextlib.closing(_Fd(fd)):
        for _ in range(_KMSG_MAX_RECORDS):
            if time.monotonic() > deadline:
                break
            try:
                record = os.read(fd, 8192)
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # overwritten while reading: skip ahead
                    continue
                if exc.errno == errno.EAGAIN:
                    break
                return lines or None
            if not record:
                break
            head, _, message = record.decode("utf-8", "replace").partition(";")
            fields = head.split(",")
            try:
                logged = booted + int(fields[2]) / 1e6
            except (IndexError, ValueError):
                logged = since
            if logged >= since:
                lines.append(message)
    return lines


def _command_lines(cmd: list[str], deadline: float) -> list[str] | None:
    exe = shutil.which(cmd[0])
    remaining = deadline - time.monotonic()
    if exe is None or remaining <= 0:
        return None
    try:
        out = subprocess.run(
            [exe, *cmd[1:]],
            capture_output=True,
            timeout=remaining,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0 or not out.stdout:
        return None
    return out.stdout[-8 * 1024 * 1024 :].decode("utf-8", "replace").splitlines()


_DMESG_TIME = re.compile(r"^\[\s*(\d+(?:\.\d+)?)\]")


def _dmesg_after(lines: list[str] | None, since: float) -> list[str] | None:
    """dmesg's lines logged after ``since`` (its prefix is seconds since boot)."""
    if lines is None:
        return None
    booted = boot_time() or 0.0
    out = []
    for line in lines:
        m = _DMESG_TIME.match(line)
        if m is None or booted + float(m.group(1)) >= since:
            out.append(line)
    return out


class _Fd:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def close(self) -> None:
        os.close(self.fd)


def iter_matching(pattern: re.Pattern[str], exclude: int) -> Iterator[tuple[int, float]]:
    """(pid, create time) of live processes whose name matches ``pattern``."""
    for proc in psutil.process_iter(["name", "create_time", "status"]):
        info = proc.info
        name = info.get("name")
        if not name or proc.pid == exclude or info.get("status") == psutil.STATUS_ZOMBIE:
            continue
        if pattern.search(name):
            yield proc.pid, float(info.get("create_time") or 0.0)
