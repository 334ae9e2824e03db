"""Training processes for the run tests: a real child Python using ``trainguard.Run``, ended
in the way a test needs (killed, finished, raising...), plus waiting on its heartbeat."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from helpers.exporter_proc import child_env
from helpers.wait import wait_for
from trainguard.shared import procinfo
from trainguard.shared.heartbeat.read import read_heartbeat
from trainguard.shared.heartbeat.record import (
    Heartbeat,
    HeartbeatError,
    heartbeat_filename,
    write_heartbeat,
)

CHILD = r"""
import os, sys, time
import trainguard

name, state_dir, steps, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
kw = dict(state_dir=state_dir, interval=0.02)


def train(run):
    for i in range(steps + 1):
        run.step(i, loss=1.0 / (i + 1))
        time.sleep(0.002)


if mode == "hang":  # reach the step, then wait to be killed
    run = trainguard.Run(name, **kw)
    train(run)
    while True:
        time.sleep(1)
elif mode == "starting":  # alive, never begins training (a checkpoint load that takes long)
    run = trainguard.Run(name, starting=True, **kw)
    while True:
        time.sleep(1)
elif mode == "steady":  # keep training until killed
    run = trainguard.Run(name, **kw)
    i = 0
    while True:
        run.step(i, loss=1.0 / (i + 1))
        i += 1
        time.sleep(0.02)
elif mode == "with":  # clean finish
    with trainguard.Run(name, **kw) as run:
        train(run)
elif mode == "with-raise":
    with trainguard.Run(name, **kw) as run:
        train(run)
        raise ValueError("boom")
elif mode == "exit":  # no close(): atexit finishes it
    run = trainguard.Run(name, **kw)
    train(run)
elif mode == "uncaught":  # a traceback at top level is not a clean finish
    run = trainguard.Run(name, **kw)
    train(run)
    1 / 0
elif mode == "fork":  # a forked child that exits normally must not finish the parent's run
    run = trainguard.Run(name, **kw)
    train(run)
    child = os.fork()
    if child == 0:
        sys.exit(0)
    os.waitpid(child, 0)
    print("forked child done", flush=True)
    while True:
        time.sleep(1)
elif mode == "no-torch":
    with trainguard.Run(name, **kw) as run:
        train(run)
    assert "torch" not in sys.modules, "trainguard imported torch"
else:
    raise SystemExit(f"unknown mode {mode}")
"""


def start_child(
    name: str, state_dir: Path, steps: int, mode: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """The training child of ``mode``; ``env`` adds to its environment (a launcher's job)."""
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, name, str(state_dir), str(steps), mode],
        env=child_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


# --kill-child: the training child (pid 1 of the namespace) dies with unshare, so a test that
# kills unshare leaves no process behind (init of a pid namespace ignores all but SIGKILL)
UNSHARE = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"]


def unshare_problem() -> str | None:
    """Why a child cannot get a pid namespace of its own here (None when it can): ``unshare``
    missing, or not permitted (it needs root or user namespaces)."""
    if shutil.which("unshare") is None:
        return "no unshare(1) on this machine"
    try:
        out = subprocess.run(
            [*UNSHARE, "true"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unshare --pid --fork --mount-proc failed: {exc}"
    if out.returncode != 0:
        return f"unshare --pid --fork --mount-proc not permitted here: {out.stderr.strip()}"
    return None


def start_child_in_pid_namespace(
    name: str, state_dir: Path, steps: int, mode: str, hostname: str | None = None
) -> subprocess.Popen[str]:
    """The training child as in a container of its own (a pod without hostPID, ``docker run``):
    a new pid namespace, where it is pid 1, with its own /proc; with ``hostname``, also a
    hostname of its own, as a pod has. The Popen is ``unshare``'s; :func:`namespace_child`
    gives the training process's pid as this (host) side sees it."""
    cmd = [sys.executable, "-c", CHILD, name, str(state_dir), str(steps), mode]
    if hostname is not None:
        cmd = ["--uts", "sh", "-c", 'hostname "$0" && exec "$@"', hostname, *cmd]
    return subprocess.Popen(
        [*UNSHARE, *cmd],
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def namespace_child(proc: subprocess.Popen[str], timeout: float = 60.0) -> int:
    """The host pid of the process ``unshare --fork`` started."""

    def child() -> int | None:
        try:
            children = psutil.Process(proc.pid).children()
        except psutil.NoSuchProcess:
            raise AssertionError(f"unshare (pid {proc.pid}) ended, starting no child") from None
        return children[0].pid if children else None

    return wait_for(child, timeout, 0.01, f"unshare (pid {proc.pid}) to start a child")


def heartbeat_path(state_dir: Path, name: str, rank: int = 0) -> Path:
    return state_dir / heartbeat_filename(name, rank)


def wait_heartbeat(path: Path, ok: Callable[[Heartbeat], bool], timeout: float = 60.0) -> Heartbeat:
    """Poll the heartbeat file until ``ok`` holds for it."""
    last: list[Heartbeat] = []

    def read() -> Heartbeat | None:
        last[:] = [read_heartbeat(path)]
        return last[0] if ok(last[0]) else None

    what = lambda: f"heartbeat {path} to satisfy the condition; last read: {last}"  # noqa: E731
    return wait_for(read, timeout, 0.01, what, ignore=HeartbeatError)


def own_heartbeat(run: str, **over: object) -> Heartbeat:
    """A heartbeat as if written by this test process (alive, same boot)."""
    now = time.time()
    fields: dict[str, object] = dict(
        run=run,
        rank=0,
        pid=os.getpid(),
        create_time=procinfo.own_create_time(),
        host=socket.gethostname(),
        started=now - 10,
        time=now,
        step=5,
        step_time=now,
        boot_id=procinfo.boot_id(),
        boot_time=procinfo.boot_time(),
        pid_ns=procinfo.pid_namespace(),
    )
    fields.update(over)
    return Heartbeat(**fields)  # type: ignore[arg-type]


def put(state: Path, hb: Heartbeat, **extra: object) -> Path:
    """Write ``hb`` where the exporter looks for it; ``extra`` adds raw JSON fields."""
    path = state / heartbeat_filename(hb.run, hb.rank)
    write_heartbeat(path, {**hb.to_dict(), **extra} if extra else hb)
    return path


def stat_start_ticks(pid: int) -> int:
    """Field 22 of /proc/PID/stat (clock ticks after boot), read independently of
    trainguard: the command name in field 2 may hold spaces and parentheses."""
    raw = Path(f"/proc/{pid}/stat").read_bytes().decode("utf-8", "replace")
    return int(raw.rsplit(")", 1)[1].split()[19])


def sigkill(pid: int, timeout: float = 60.0) -> None:
    """SIGKILL, then wait until the kernel has ended the process: a zombie (not reaped, so the
    exporter still sees the pid listed) or gone. The signal is delivered asynchronously."""
    os.kill(pid, signal.SIGKILL)

    def ended() -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    wait_for(ended, timeout, 0.001, f"pid {pid} to end after SIGKILL")
