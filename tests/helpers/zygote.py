"""A fork server for the tests' training processes: importing torch, transformers and
Lightning costs a child 2-5 s of CPU, and the suite starts dozens of such children on two
cores. The server imports them once; each child is a fork of it that runs its script as
``python SCRIPT ARGS`` would (``__main__``, ``sys.argv``, the environment, stdio, uncaught
exceptions, ``sys.exit`` and atexit handlers as in a fresh interpreter). The children are
still real processes, really killed: each has a pid of its own, its own session on request,
and the server reaps it and reports its exit status as ``Popen`` would.

    server = Zygote(["torch", "transformers"], env)   # python zygote.py SOCKET MODULE...
    proc = server.spawn([script, *args], env, stdout=log, stderr=subprocess.STDOUT)
    proc.wait(60)

Requests travel over a Unix seqpacket socket, one connection per child: the request (JSON)
with the child's stdin/stdout/stderr descriptors (SCM_RIGHTS), then the answers ``pid N``
and, once it has been reaped, ``exit N``. The server forks only while it has a single
thread, and ends, killing what it started, when its stdin closes.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import runpy
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

HERE = Path(__file__).resolve()


# -- the server ---------------------------------------------------------------------------------


@dataclass
class Child:
    """What a forked child runs, once the server's state is gone from it."""

    argv: list[str]
    env: dict[str, str]
    cwd: str | None


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def serve(path: str, preload: list[str]) -> Child | None:
    """The server loop; returns only in a forked child (its request) or at the end (None)."""
    for name in preload:
        # not installed: a child that needs it fails as it would on its own
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    if _threads() != 1 or threading.active_count() != 1:
        raise SystemExit(f"zygote: importing {preload} started threads; forking is not safe")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server.bind(path)
    server.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel = selectors.DefaultSelector()
    sel.register(server, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    sel.register(sys.stdin, selectors.EVENT_READ)
    waiting: dict[int, socket.socket] = {}  # pid -> its client, told the exit status
    told: set[socket.socket] = set()  # clients told, kept open until they hang up (_reap)
    print("ready", flush=True)
    while True:
        for key, _ in sel.select():
            if key.fileobj is sys.stdin:  # the test process is done (or gone)
                if os.read(sys.stdin.fileno(), 4096):
                    continue
                for pid in waiting:
                    os.kill(pid, signal.SIGKILL)
                for pid in waiting:
                    os.waitpid(pid, 0)
                return None
            if key.data is not None:  # a client: "signal N" for its child, or gone
                _signal(sel, key.fileobj, key.data, waiting, told)
                continue
            if key.fileobj == wake_r:  # SIGCHLD: drained here, reaped after the batch
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_r, 4096):
                        pass
                continue
            conn, _ = server.accept()
            msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
            request = json.loads(msg)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                sel.close()
                for c in (server, conn, *waiting.values(), *told):
                    c.close()
                os.close(wake_r)
                os.close(wake_w)
                if request["new_session"]:
                    os.setsid()
                for target, fd in enumerate(fds):
                    os.dup2(fd, target)
                    os.close(fd)
                return Child(request["argv"], request["env"], request["cwd"])
            for fd in fds:
                os.close(fd)
            conn.send(f"pid {pid}".encode())
            waiting[pid] = conn
            sel.register(conn, selectors.EVENT_READ, data=pid)
        _reap(sel, waiting, told)


def _signal(
    sel: selectors.BaseSelector,
    conn: socket.socket,
    pid: int,
    waiting: dict[int, socket.socket],
    told: set[socket.socket],
) -> None:
    """Signal a child for its client. Only the server may: it alone knows whether the pid is
    still its unreaped child, where a client's os.kill could hit the pid's next owner."""
    try:
        msg = conn.recv(64).decode()
    except OSError:
        msg = ""
    if not msg:  # the client closed its end: the child runs on, nobody to tell its status
        sel.unregister(conn)
        if conn in told:
            told.discard(conn)
            conn.close()
        return
    if msg.startswith("signal ") and waiting.get(pid) is conn:
        os.kill(pid, int(msg.split()[1]))  # unreaped, so still ours (a zombie at worst)


def _reap(
    sel: selectors.BaseSelector, waiting: dict[int, socket.socket], told: set[socket.socket]
) -> None:
    """Tell each reaped child's client its exit status, and keep the connection open until the
    client hangs up: closed here with a "signal N" of the client's still unread (a kill sent
    while the child was being reaped), the kernel resets the connection and the client's next
    recv fails with ECONNRESET before it reads the status already queued for it."""
    for pid in list(waiting):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            conn = waiting.pop(pid)
            try:  # the client may have given up on it
                conn.send(f"exit {os.waitstatus_to_exitcode(status)}".encode())
            except OSError:
                with contextlib.suppress(KeyError, ValueError):
                    sel.unregister(conn)
                conn.close()
            else:
                told.add(conn)  # still registered: its later messages read and dropped


def run_child(child: Child) -> None:
    """Become ``python SCRIPT ARGS``: what the script raises propagates to the top level."""
    os.environ.clear()
    os.environ.update(child.env)
    if child.cwd is not None:
        os.chdir(child.cwd)
    script = os.path.abspath(child.argv[0])
    sys.argv = [script, *child.argv[1:]]
    sys.path[0] = os.path.dirname(script)
    runpy.run_path(script, run_name="__main__")


# -- the client ---------------------------------------------------------------------------------


class Forked:
    """The parts of ``subprocess.Popen`` the tests use, for a child of the server."""

    def __init__(self, conn: socket.socket, pid: int, args: list[str], stdout: IO[str] | None):
        self._conn = conn
        self.pid = pid
        self.args = args
        self.stdout = stdout
        self.returncode: int | None = None

    def _status(self, timeout: float | None) -> int | None:
        if self.returncode is not None:
            return self.returncode
        self._conn.settimeout(timeout)
        try:
            msg = self._conn.recv(64).decode()
        except (TimeoutError, BlockingIOError):
            return None
        if not msg.startswith("exit "):
            raise RuntimeError(f"zygote: child {self.pid}: unexpected answer {msg!r}")
        self.returncode = int(msg.split()[1])
        self._conn.close()
        return self.returncode

    def poll(self) -> int | None:
        return self._status(0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._status(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return code

    def send_signal(self, sig: int) -> None:
        """Through the server, which signals the child only while it has not reaped it (as
        Popen only signals its own unreaped child); nothing once the child has ended."""
        if self.returncode is None:
            with contextlib.suppress(OSError):  # the server has told the exit and hung up
                self._conn.send(f"signal {int(sig)}".encode())

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[str | None, None]:
        deadline = None if timeout is None else time.monotonic() + timeout
        out: list[str] = []
        if self.stdout is not None:
            stdout = self.stdout
            reader = threading.Thread(target=lambda: out.append(stdout.read()), daemon=True)
            reader.start()
            reader.join(timeout)
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            stdout.close()
            self.stdout = None
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return (out[0] if out else None), None


class Zygote:
    """A running fork server (see the module docstring); ``close`` ends it."""

    def __init__(self, preload: list[str], env: dict[str, str]) -> None:
        self._dir = tempfile.mkdtemp(prefix="trainguard-zygote-")
        self.path = os.path.join(self._dir, "socket")
        self._server = subprocess.Popen(
            [sys.executable, str(HERE), self.path, *preload],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._server.stdout is not None
        ready = self._server.stdout.readline()
        if ready.strip() != "ready":
            self._server.kill()
            raise RuntimeError(f"zygote did not start (exit {self._server.wait()}): {ready!r}")

    def spawn(
        self,
        argv: Sequence[str | os.PathLike[str]],
        env: dict[str, str],
        *,
        stdout: IO[Any] | int | None = None,
        stderr: IO[Any] | int | None = None,
        start_new_session: bool = False,
        cwd: str | Path | None = None,
    ) -> Forked:
        """``subprocess.Popen([sys.executable, *argv], ...)``, forked from the server:
        ``stdout`` a file, ``subprocess.PIPE`` (text), ``DEVNULL`` or None (this process's),
        ``stderr`` likewise or ``subprocess.STDOUT``."""
        opened: list[int] = []  # our copies of the child's ends, closed once sent
        pipe_r: int | None = None
        null = os.open(os.devnull, os.O_RDONLY)
        null_out = os.open(os.devnull, os.O_WRONLY)
        opened += [null, null_out]

        def fd(target: IO[Any] | int | None, default: int) -> int:
            nonlocal pipe_r
            if target is None:
                return default
            if target == subprocess.DEVNULL:
                return null_out
            if target == subprocess.PIPE:
                pipe_r, w = os.pipe()
                opened.append(w)
                return w
            assert not isinstance(target, int), target
            return target.fileno()

        out = fd(stdout, 1)
        err = out if stderr == subprocess.STDOUT else fd(stderr, 2)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            conn.connect(self.path)
            request = {
                "argv": [str(a) for a in argv],
                "env": env,
                "cwd": str(cwd) if cwd is not None else None,
                "new_session": start_new_session,
            }
            socket.send_fds(conn, [json.dumps(request).encode()], [null, out, err])
            answer = conn.recv(64).decode()
        except BaseException:
            conn.close()
            raise
        finally:
            for f in opened:
                os.close(f)
        if not answer.startswith("pid "):
            conn.close()
            raise RuntimeError(f"zygote: no child for {argv}: {answer!r}")
        reader = open(pipe_r, errors="replace") if pipe_r is not None else None  # noqa: SIM115
        return Forked(conn, int(answer.split()[1]), [str(a) for a in argv], reader)

    def run(
        self, argv: Sequence[str | os.PathLike[str]], env: dict[str, str], timeout: float
    ) -> tuple[int, str]:
        """``subprocess.run`` with stdout and stderr merged: (exit status, output)."""
        proc = self.spawn(argv, env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            out, _ = proc.communicate(timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        return proc.wait(), out or ""

    def close(self) -> None:
        assert self._server.stdin is not None
        self._server.stdin.close()  # the server kills what it started, and ends
        try:
            self._server.wait(60)
        except subprocess.TimeoutExpired:
            self._server.kill()
            self._server.wait()
        if self._server.stdout is not None:
            self._server.stdout.close()
        for name in os.listdir(self._dir):
            os.unlink(os.path.join(self._dir, name))
        os.rmdir(self._dir)

    def __enter__(self) -> Zygote:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


if __name__ == "__main__":
    forked = serve(sys.argv[1], sys.argv[2:])
    if forked is not None:
        run_child(forked)
