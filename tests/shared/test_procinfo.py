"""procinfo.process_state (the GPU collector's "does the process NVML lists still hold its
memory") for real processes, zombies, threads and reaped pids: a process exactly where
psutil.pid_exists says one exists, and a zombie one that holds nothing."""

from __future__ import annotations

import os
import subprocess
import threading
import time

import psutil

from trainguard.shared import procinfo


def both(pid: int) -> tuple[bool, bool]:
    return procinfo.process_state(pid) is not None, bool(psutil.pid_exists(pid))


def wait_zombie(pid: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, f"{pid} never became a zombie"
        time.sleep(0.01)


def test_live_zombie_and_reaped() -> None:
    assert both(os.getpid()) == (True, True)
    assert procinfo.holds_memory(procinfo.process_state(os.getpid()))
    child = subprocess.Popen(["sleep", "60"])
    try:
        assert both(child.pid) == (True, True)
        assert procinfo.holds_memory(procinfo.process_state(child.pid))
    finally:
        child.kill()
    wait_zombie(child.pid)
    assert both(child.pid) == (True, True)  # a zombie still holds its pid...
    assert procinfo.process_state(child.pid) == "Z"
    assert not procinfo.holds_memory("Z")  # ...and nothing else
    child.wait()
    assert both(child.pid) == (False, False)
    assert not procinfo.holds_memory(procinfo.process_state(child.pid))


def test_a_thread_is_not_a_process() -> None:
    started = threading.Event()
    done = threading.Event()
    tids: list[int] = []

    def worker() -> None:
        tids.append(threading.get_native_id())
        started.set()
        done.wait(60)

    t = threading.Thread(target=worker)
    t.start()
    try:
        assert started.wait(60)
        assert tids[0] != os.getpid()
        assert both(tids[0]) == (False, False)
    finally:
        done.set()
        t.join()


def test_no_such_pids() -> None:
    assert both(-1) == (False, False)
    assert (procinfo.process_state(0) is not None) == bool(psutil.pid_exists(0))
    assert both(2**22 + 12345)[0] is False
