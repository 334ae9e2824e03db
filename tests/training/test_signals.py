"""Why a training process died, told by the signal it caught: real processes, really signalled.

SIGTERM, SIGINT, SIGKILL and an exception each give their own cause: in the final heartbeat, in
the death the next process of the run records, and in the real exporter's
``trainguard_run_exit_info`` and ``trainguard_run_last_death_info``. The signal is always passed
on: a process without a handler still dies of it, a handler of the script still runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers.exporter_proc import Exporter, child_env, value
from helpers.run_child import heartbeat_path, wait_heartbeat
from helpers.wait import wait_for
from trainguard import Run
from trainguard.run.signals import END_TIME_VARIABLES
from trainguard.shared.heartbeat.record import Heartbeat

CHILD = r"""
import ctypes, signal, sys, time
import trainguard

name, state_dir, mode = sys.argv[1:4]
# the dispositions a shell gives a job, whatever this test's own process ignores
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGTERM, signal.SIG_DFL)
if mode == "user-term":
    def on_term(signum, frame):
        print("user handler ran", flush=True)
        sys.exit(0)  # a graceful stop: still a death by SIGTERM, not a finish
    signal.signal(signal.SIGTERM, on_term)
elif mode == "user-usr1":
    signal.signal(signal.SIGUSR1, lambda signum, frame: print("usr1 handler ran", flush=True))
elif mode == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
run = trainguard.Run(name, state_dir=state_dir, interval=0.02)
if mode == "stuck":  # the main thread waits in C for ever, as in a collective that never ends
    run.step(1)
    libc = ctypes.CDLL(None)
    mutex = ctypes.create_string_buffer(64)  # a zeroed pthread_mutex_t: a normal mutex
    libc.pthread_mutex_lock(mutex)
    print("stuck", flush=True)
    libc.pthread_mutex_lock(mutex)
i = 0
while True:
    run.step(i, loss=1.0)
    i += 1
    if mode == "raise" and i == 5:
        raise ValueError("boom")
    time.sleep(0.02)
"""

#: futex(2) in /proc/PID/syscall: x86_64, aarch64
FUTEX = {"202", "98"}


def start(
    name: str, state: Path, mode: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    environ = child_env()
    for key in END_TIME_VARIABLES:  # a job end time of this machine's own must not count
        environ.pop(key, None)
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, name, str(state), mode],
        env={**environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def stepping(state: Path, name: str, proc: subprocess.Popen[str]) -> Heartbeat:
    """The heartbeat of ``proc`` once it has stepped (the file may be its predecessor's)."""
    path = heartbeat_path(state, name)
    return wait_heartbeat(path, lambda hb: hb.pid == proc.pid and (hb.step or 0) >= 2)


def ended(proc: subprocess.Popen[str]) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out


CASES = {
    # how it ends: (signal sent, or None for the exception), exit status, heartbeat, cause
    "sigterm": ("steady", signal.SIGTERM, -signal.SIGTERM, "failed", "signal", "SIGTERM"),
    "sigint": ("steady", signal.SIGINT, -signal.SIGINT, "failed", "signal", "SIGINT"),
    "sigkill": ("steady", signal.SIGKILL, -signal.SIGKILL, "running", "unknown", None),
    "exception": ("raise", None, 1, "failed", "exception", None),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_end_has_its_own_cause(tmp_path: Path, case: str) -> None:
    mode, sig, status, state_after, cause, sig_name = CASES[case]
    state = tmp_path / "state"
    name = f"ends-{case}"
    proc = start(name, state, mode)
    try:
        stepping(state, name, proc)
        if sig is not None:
            os.kill(proc.pid, sig)
    finally:
        rc, out = ended(proc)
    assert rc == status, out
    hb = wait_heartbeat(heartbeat_path(state, name), lambda hb: True)
    assert hb.state == state_after, out
    assert hb.signal == sig_name
    assert hb.exit_cause == (cause if sig_name else None)
    with Exporter(state_dir=state) as exp:
        gone = exp.scrape()
        labels = {"run": name, "rank": "0", "cause": cause, "signal": sig_name or ""}
        assert value(gone, "trainguard_run_exit_info", **labels) == 1
        again = start(name, state, "steady")  # the run restarted: its next process
        try:
            hb = stepping(state, name, again)
            death = hb.death_history[-1]
            assert (death.cause, death.signal) == (cause, sig_name)
            back = exp.scrape()
            assert value(back, "trainguard_run_exit_info", **labels) is None  # running again
            assert value(back, "trainguard_run_last_death_info", run=name, cause=cause) == 1
        finally:
            again.kill()
            again.wait()


def test_the_scripts_own_sigterm_handler_still_runs(tmp_path: Path) -> None:
    state = tmp_path / "state"
    proc = start("own-handler", state, "user-term")
    try:
        stepping(state, "own-handler", proc)
        proc.send_signal(signal.SIGTERM)
    finally:
        rc, out = ended(proc)
    assert rc == 0 and "user handler ran" in out, out
    hb = wait_heartbeat(heartbeat_path(state, "own-handler"), lambda hb: True)
    # it exited 0, but it was stopped: not a finished run
    assert (hb.state, hb.signal, hb.exit_cause) == ("failed", "SIGTERM", "signal")


def test_a_warning_signal_to_the_scripts_handler_does_not_end_the_run(tmp_path: Path) -> None:
    state = tmp_path / "state"
    path = heartbeat_path(state, "warned")
    proc = start("warned", state, "user-usr1")
    try:
        stepping(state, "warned", proc)
        proc.send_signal(signal.SIGUSR1)
        hb = wait_heartbeat(path, lambda hb: hb.last_signal == "SIGUSR1")
        assert hb.state == "running" and hb.signal is None and hb.last_signal_time
        wait_heartbeat(path, lambda later: (later.step or 0) > (hb.step or 0))  # still training
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
    finally:
        rc, out = ended(proc)
    assert rc == -signal.SIGTERM and "usr1 handler ran" in out, out
    assert wait_heartbeat(path, lambda hb: True).signal == "SIGTERM"


def test_an_ignored_sigterm_stays_ignored(tmp_path: Path) -> None:
    state = tmp_path / "state"
    path = heartbeat_path(state, "ignores")
    proc = start("ignores", state, "ignore-term")
    try:
        hb = stepping(state, "ignores", proc)
        proc.send_signal(signal.SIGTERM)
        wait_heartbeat(path, lambda later: (later.step or 0) > (hb.step or 0) + 20)
        assert proc.poll() is None
        later = wait_heartbeat(path, lambda hb: True)
        assert later.signal is None and later.last_signal is None
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize(("ends_in", "cause"), [(60, "time_limit"), (3600, "signal")])
def test_a_sigterm_at_the_slurm_end_time_is_the_time_limit(
    tmp_path: Path, ends_in: int, cause: str
) -> None:
    state = tmp_path / "state"
    env = {"SLURM_JOB_END_TIME": str(int(time.time()) + ends_in)}
    proc = start("slurm", state, "steady", env)
    try:
        stepping(state, "slurm", proc)
        proc.send_signal(signal.SIGTERM)
    finally:
        rc, out = ended(proc)
    assert rc == -signal.SIGTERM, out
    hb = wait_heartbeat(heartbeat_path(state, "slurm"), lambda hb: True)
    assert (hb.state, hb.signal, hb.exit_cause) == ("failed", "SIGTERM", cause)
    again = start("slurm", state, "steady")
    try:
        death = stepping(state, "slurm", again).death_history[-1]
        assert (death.cause, death.signal) == (cause, "SIGTERM")
    finally:
        again.kill()
        again.wait()


def test_sigterm_while_the_main_thread_waits_in_c(tmp_path: Path) -> None:
    """Python would run the handler only when the main thread returns: it never does here."""
    state = tmp_path / "state"
    proc = start("stuck", state, "stuck")
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "stuck"
        syscall = Path(f"/proc/{proc.pid}/syscall")
        try:
            syscall.read_text()
        except OSError as exc:
            pytest.skip(f"cannot tell where the child waits: {exc}")
        wait_for(lambda: syscall.read_text().split()[0] in FUTEX, 60, 0.01, "the child to block")
        proc.send_signal(signal.SIGTERM)
    finally:
        rc, out = ended(proc)
    assert rc == -signal.SIGTERM, out
    hb = wait_heartbeat(heartbeat_path(state, "stuck"), lambda hb: True)
    assert (hb.state, hb.signal) == ("failed", "SIGTERM")


def test_handlers_are_installed_from_the_main_thread_only_and_restored(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    made: list[Run] = []
    thread = threading.Thread(target=lambda: made.append(Run("threaded", state_dir=tmp_path)))
    thread.start()
    thread.join()
    assert signal.getsignal(signal.SIGTERM) is before
    made[0].close()
    run = Run("main", state_dir=tmp_path)
    try:
        assert signal.getsignal(signal.SIGTERM) is not before
    finally:
        run.close()
    assert signal.getsignal(signal.SIGTERM) is before
    assert signal.set_wakeup_fd(-1) == -1  # the wakeup fd given back too


UNWINDING = r"""
import sys, time
import trainguard
# a close that waits on itself waits out close_timeout: longer than the test's deadline
try:
    with trainguard.Run(
        sys.argv[1], state_dir=sys.argv[2], interval=0.05, close_timeout=600
    ) as run:
        run.step(1)
        run.step(2)
        time.sleep(0.3)  # its running heartbeats written
        sys.stdout.write("raising\n")
        sys.stdout.flush()
        raise RuntimeError("Connection closed by peer")  # a collective whose peer died
finally:
    # still alive when the signal comes, however late the test sends it on a busy machine: a
    # child that had closed and exited (status 1) before the signal was sent proved nothing,
    # and failed the test. A signal lost in the close leaves it here past the test's deadline.
    time.sleep(120)
"""


def test_a_launchers_sigterm_while_the_run_closes_is_in_its_final_heartbeat(
    tmp_path: Path,
) -> None:
    # torchrun stops a dead rank's peers with SIGTERM while their collective's exception is
    # unwinding through the Run: the signal may come as the final heartbeat is being written.
    # Whenever it comes, the rank's last heartbeat says how it ended (the signal, or the
    # exception when the signal came after): never the running one left by a process killed
    # between removing the handlers and writing (cause "unknown", named the job's first death).
    # And the process still dies of the signal, at once: a handler that interrupted the close
    # waiting there for the writer's end (joining it while the interrupted join held its lock)
    # hung the rank for the close timeout, or for ever (9% of tries before that was mended).
    for attempt in range(16):
        state = tmp_path / f"s{attempt}"
        proc = subprocess.Popen(
            [sys.executable, "-c", UNWINDING, "unwinding", str(state)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=child_env(),
        )
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline() == "raising\n"
            time.sleep(attempt * 0.00015)  # a little later each time: across the closing window
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == -signal.SIGTERM, attempt  # dies of it, as without trainguard
        finally:
            proc.kill()  # a hung child must not outlive the test
            proc.wait()
        hb = wait_heartbeat(heartbeat_path(state, "unwinding"), lambda hb: True, 10)
        assert hb.state == "failed", (attempt, hb)
        assert hb.signal == "SIGTERM" or hb.error == "RuntimeError", (attempt, hb)
