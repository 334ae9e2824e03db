"""What the kernel log says about a death: the OOM killer naming a pid, and GPU Xid errors.

The NVIDIA driver reports GPU errors as Xid events (``NVRM: Xid (PCI:0000:3b:00): 79, ... GPU
has fallen off the bus.``), which kill training with nothing in the training log.

:func:`read_kernel_log` is the one place that reads the log (``/dev/kmsg``, else
``journalctl -k``, else ``dmesg``), best effort and bounded to about two seconds; everything
else here only parses lines. A log that cannot be read (no permission, a container, not
Linux) is None: "not known", never "nothing happened".
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass

from trainguard.shared.procinfo import boot_time

#: Xid codes after which the process using the GPU cannot go on (its CUDA context is lost,
#: or the GPU needs a reset): 13 graphics engine exception, 31 GPU memory page fault, 32
#: corrupted push buffer, 43 GPU stopped processing, 48 double-bit ECC error, 62 internal
#: micro-controller halt, 64 ECC page retirement or row remapping failure, 69 graphics
#: engine class error, 74 NVLink error, 79 GPU fallen off the bus, 94 contained ECC error, 95
#: uncontained ECC error, 109 context switch timeout, 119 GSP RPC timeout, 120 GSP error, 140
#: unrecovered ECC error. Not 45 (preemptive cleanup: logged whenever a process using the GPU
#: is killed, kill -9 included, so a consequence of any death), nor warnings such as 63
#: (page retirement recorded) and 92 (high single-bit ECC rate).
FATAL_XIDS = frozenset({13, 31, 32, 43, 48, 62, 64, 69, 74, 79, 94, 95, 109, 119, 120, 140})

_OOM_PATTERNS = (
    re.compile(r"\bKill(?:ed)? process (\d+)\b"),  # "Out of memory: Killed process 123 (python)"
    re.compile(r"\boom-kill:.*?[,:]pid=(\d+)\b"),  # "oom-kill:constraint=...,task=x,pid=123,"
    re.compile(r"\boom_reaper: reaped process (\d+)\b"),
)
# "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off ..."
# (the pid and name since R470, quoted when unknown since R525; "(0000:03:00)" before R346)
_XID = re.compile(
    r"\bNVRM: Xid \((?:PCI:)?(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\)"
    r": (?P<code>\d{1,5})\b(?:,\s*pid=['\"]?(?P<pid>\d+)\b)?"
)
_KMSG_MAX_RECORDS = 200_000
_KERNEL_LOG_SECONDS = 2.0
_DMESG_TIME = re.compile(r"^\[\s*(\d+(?:\.\d+)?)\]")
_JOURNAL_TIME = re.compile(r"^(\d+(?:\.\d+)?) ")


@dataclass(frozen=True)
class KernelLine:
    """One kernel log message and when it was logged.

    The time is in seconds since the epoch; None when the source does not say.
    """

    time: float | None
    text: str


@dataclass(frozen=True)
class Xid:
    """A GPU error the NVIDIA driver logged."""

    code: int
    device: str  # PCI bus id, as the driver printed it
    pid: int | None  # the process it names (a host pid), when it names one


def oom_pid(line: str) -> int | None:
    """The pid an OOM killer line says was killed, or None."""
    for pattern in _OOM_PATTERNS:
        m = pattern.search(line)
        if m:
            return int(m.group(1))
    return None


def parse_xid(line: str) -> Xid | None:
    """The Xid event of a kernel log line (with or without a dmesg/journal prefix), or None."""
    m = _XID.search(line)
    if m is None:
        return None
    pid = m.group("pid")
    return Xid(int(m.group("code")), m.group("bus"), int(pid) if pid else None)


def read_kernel_log(since: float) -> list[KernelLine] | None:
    """Best effort: the kernel log's messages logged at or after ``since``.

    ``since`` is in seconds since the epoch; messages whose time is unknown are kept. Read from
    /dev/kmsg, else ``journalctl -k``, else ``dmesg``. Bounded to about two seconds; None when no
    source can be read.
    """
    deadline = time.monotonic() + _KERNEL_LOG_SECONDS
    try:
        lines = _kmsg_lines(since, deadline)
        if lines is None:
            lines = _journal_lines(since, deadline)
        if lines is None:
            lines = _dmesg_lines(since, deadline)
        return lines
    except Exception:
        return None


def _kmsg_lines(since: float, deadline: float) -> list[KernelLine] | None:
    """Records of /dev/kmsg logged after ``since``, or None when it cannot be read.

    Its timestamps are microseconds since boot. It cannot be read without permission, or off
    Linux.
    """
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    booted = boot_time()
    lines: list[KernelLine] = []
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
            logged: float | None
            try:
                logged = None if booted is None else booted + int(fields[2]) / 1e6
            except (IndexError, ValueError):
                logged = None
            if logged is None or logged >= since:
                lines.append(KernelLine(logged, message.rstrip("\n")))
    return lines


def _journal_lines(since: float, deadline: float) -> list[KernelLine] | None:
    out = _command_lines(
        ["journalctl", "-k", "-q", "--no-pager", "-o", "short-unix", f"--since=@{int(since)}"],
        deadline,
    )
    if out is None:
        return None
    lines = []
    for line in out:
        m = _JOURNAL_TIME.match(line)
        logged = float(m.group(1)) if m else None
        if logged is None or logged >= since:
            lines.append(KernelLine(logged, line))
    return lines


def _dmesg_lines(since: float, deadline: float) -> list[KernelLine] | None:
    """The lines of dmesg logged after ``since`` (its prefix is seconds since boot)."""
    out = _command_lines(["dmesg"], deadline)
    if out is None:
        return None
    booted = boot_time()
    lines = []
    for line in out:
        m = _DMESG_TIME.match(line)
        logged = booted + float(m.group(1)) if m and booted is not None else None
        if logged is None or logged >= since:
            lines.append(KernelLine(logged, line))
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


class _Fd:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def close(self) -> None:
        os.close(self.fd)
