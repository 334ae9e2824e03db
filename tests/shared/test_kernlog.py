"""The kernel log as the death-cause reader sees it: the lines the OOM killer and the NVIDIA
driver write (several kernel and driver versions' formats, with each source's prefix), and
the real reader on this machine."""

from __future__ import annotations

import time

import pytest

from trainguard.shared import kernlog
from trainguard.shared.kernlog import Xid

OOM_LINES = {
    "Out of memory: Killed process 4242 (python) total-vm:1kB, anon-rss:1kB": 4242,
    "Memory cgroup out of memory: Killed process 77 (python3) total-vm:1kB": 77,
    "oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,"
    "global_oom,task_memcg=/user.slice,task=python,pid=31337,uid=1000": 31337,
    "Out of memory: Kill process 9 (python) score 900 or sacrifice child": 9,
    "oom_reaper: reaped process 55 (python), now anon-rss:0kB": 55,
    "python invoked oom-killer: gfp_mask=0x100cca(GFP_HIGHUSER_MOVABLE), order=0": None,
    "usb 1-1: new high-speed USB device number 2": None,
}


@pytest.mark.parametrize(("line", "pid"), OOM_LINES.items())
def test_lines_the_oom_killer_writes(line: str, pid: int | None) -> None:
    assert kernlog.oom_pid(line) == pid


XID_LINES = {
    # R525 and later: pid and name, quoted when unknown
    "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off "
    "the bus.": Xid(79, "0000:3b:00", None),
    # R470-R515: unquoted
    "NVRM: Xid (PCI:0000:3b:00): 79, pid=<unknown>, name=<unknown>, GPU has fallen off the "
    "bus.": Xid(79, "0000:3b:00", None),
    # before R470: no pid at all
    "NVRM: Xid (PCI:0000:03:00): 79, GPU has fallen off the bus.": Xid(79, "0000:03:00", None),
    "NVRM: Xid (PCI:0000:86:00): 13, pid=30429, name=python, Graphics SM Warp Exception on "
    "(GPC 0, TPC 0, SM 0): Out Of Range Address": Xid(13, "0000:86:00", 30429),
    "NVRM: Xid (PCI:0000:3b:00): 31, pid=1234, name=python3, Ch 00000010, intr 10000000. "
    "MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f2a_bc000000. Fault is of type "
    "FAULT_PDE ACCESS_TYPE_READ": Xid(31, "0000:3b:00", 1234),
    "NVRM: Xid (PCI:0000:02:00): 48, An uncorrectable double bit error (DBE) has been "
    "detected on GPU in the framebuffer at partition 6, subpartition 0.": Xid(
        48, "0000:02:00", None
    ),
    "NVRM: Xid (PCI:0000:17:00): 94, pid=5103, name=python, Contained: SM (0x1). RST: No, "
    "D-RST: No": Xid(94, "0000:17:00", 5103),
    "NVRM: Xid (PCI:0000:b3:00): 95, pid='<unknown>', name=<unknown>, Uncontained: FBHUB. "
    "RST: Yes, D-RST: No": Xid(95, "0000:b3:00", None),
    "NVRM: Xid (PCI:0001:00:00): 119, pid=1582, name=nv-hostengine, Timeout waiting for RPC "
    "from GSP! Expected function 76 (GSP_RM_CONTROL) (0x20801348 0x4).": Xid(
        119, "0001:00:00", 1582
    ),
    "NVRM: Xid (PCI:0000:0a:00): 43, Ch 00000008, engmask 00000101": Xid(43, "0000:0a:00", None),
    # R3xx: the bus id without "PCI:"
    "NVRM: Xid (0000:03:00): 13, 0003 00000000 0000a197 000015f0 00000000 00000000": Xid(
        13, "0000:03:00", None
    ),
    # with each source's prefix: dmesg, journalctl -o short-unix
    "[1234567.891234] NVRM: Xid (PCI:0000:41:00): 79, pid=<unknown>, name=<unknown>, GPU has "
    "fallen off the bus.": Xid(79, "0000:41:00", None),
    "1718280000.123456 gpu-node-7 kernel: NVRM: Xid (PCI:0000:41:00.0): 74, pid=88, "
    "name=python, NVLink: fatal error detected on link 3": Xid(74, "0000:41:00.0", 88),
    "NVRM: Xid (PCI:0000:3b:00): 45, pid=2233, name=python, Ch 00000010": Xid(
        45, "0000:3b:00", 2233
    ),
    "NVRM: GPU at PCI:0000:3b:00: GPU-5e4b2a7c-0000-0000-0000-000000000000": None,
    "NVRM: GPU Board Serial Number: 1234567890": None,
    "NVRM: Xid (PCI:0000:3b:00): , garbage": None,
    "nvidia-modeset: WARNING: GPU:0: Xid 79 lookalike": None,
}


@pytest.mark.parametrize(("line", "xid"), XID_LINES.items())
def test_lines_the_nvidia_driver_writes(line: str, xid: Xid | None) -> None:
    assert kernlog.parse_xid(line) == xid


def test_which_xids_end_a_process() -> None:
    for code in (13, 31, 43, 48, 79, 94, 95, 119):
        assert code in kernlog.FATAL_XIDS, code
    # 45 is logged whenever a process using the GPU is killed (kill -9 included): a
    # consequence of any death, never its cause; 63 and 92 are warnings
    for code in (45, 63, 92):
        assert code not in kernlog.FATAL_XIDS, code


def test_the_real_kernel_log_answers_and_never_raises() -> None:
    # (it is bounded by its own deadline; how long it takes is no pass/fail matter: a busy
    # machine reads slower)
    lines = kernlog.read_kernel_log(time.time() - 10)
    assert lines is None or all(isinstance(line.text, str) for line in lines)
