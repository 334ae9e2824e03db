"""Real CUDA processes for the GPU tests (tests/gpu/): a training child using ``trainguard.Run``
and torch, driven one JSON command at a time (``tests/gpu/cuda_child.py``), and a process that
maps one of its tensors through CUDA IPC (``tests/gpu/ipc_holder.py``)."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from helpers.exporter_proc import REPO, child_env

GPU_TESTS = REPO / "tests" / "gpu"
#: a child imports torch and creates a CUDA context before it answers: seconds on an idle
#: machine, far more on a loaded one or when the page cache is cold
START_TIMEOUT = 180.0


#: the caching allocator as the tests' arithmetic assumes it (fixed segments that are split
#: and cached), whatever this torch's default or the caller's environment says
ALLOC_CONF = "expandable_segments:False"


def cuda_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The child environment, with ``PYTORCH_CUDA_ALLOC_CONF`` pinned to :data:`ALLOC_CONF`
    unless ``extra`` sets it."""
    return child_env({"PYTORCH_CUDA_ALLOC_CONF": ALLOC_CONF, **(extra or {})})


class _Lines:
    """Lines a child writes on stdout, read on a thread so that a wait can time out."""

    def __init__(self, stream: IO[str]) -> None:
        self._q: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            self._q.put(line)
        self._q.put(None)

    def next(self, timeout: float) -> str | None:
        """The next line; None at EOF. Raises queue.Empty on timeout."""
        return self._q.get(timeout=timeout)


class _Proc:
    def __init__(self, cmd: Sequence[str], env: Mapping[str, str], log_path: Path) -> None:
        self.log_path = log_path
        with open(log_path, "w") as log:
            self.proc = subprocess.Popen(
                list(cmd),
                env=dict(env),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )
        assert self.proc.stdout is not None
        self._lines = _Lines(self.proc.stdout)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="backslashreplace")[-4000:]

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def answer(self, what: str, timeout: float) -> dict[str, Any]:
        try:
            line = self._lines.next(timeout)
        except queue.Empty:
            raise AssertionError(
                f"pid {self.pid}: no answer to {what} within {timeout:.0f}s; its log:\n{self.log()}"
            ) from None
        if line is None:
            code = self.proc.wait()
            raise AssertionError(
                f"pid {self.pid} exited ({code}) before answering {what}:\n{self.log()}"
            )
        reply: dict[str, Any] = json.loads(line)
        if "error" in reply:
            raise AssertionError(f"pid {self.pid}: {reply['error']}\n{reply.get('trace', '')}")
        return reply

    def kill(self) -> None:
        """SIGKILL and reap: once this returns, the pid no longer exists."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def close(self, timeout: float = 60.0) -> None:
        if self.proc.poll() is None:
            try:
                if self.proc.stdin is not None:
                    self.proc.stdin.close()
                self.proc.wait(timeout)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()


class CudaChild(_Proc):
    """``tests/gpu/cuda_child.py``: a training process with ``trainguard.Run(name,
    state_dir=...)``, answering one command at a time (see that file)."""

    def __init__(
        self,
        name: str,
        state_dir: Path,
        log_path: Path,
        *,
        oom_snapshots: bool = False,
        env: Mapping[str, str] | None = None,
    ) -> None:
        cmd = [sys.executable, str(GPU_TESTS / "cuda_child.py"), name, str(state_dir)]
        if oom_snapshots:
            cmd.append("--oom-snapshots")
        super().__init__(cmd, cuda_env(env), log_path)
        ready = self.answer("start-up", START_TIMEOUT)
        assert ready["ready"] == self.pid, ready

    def call(self, op: str, timeout: float = 120.0, **args: Any) -> dict[str, Any]:
        self.send(json.dumps({"op": op, **args}))
        return self.answer(op, timeout)

    def __enter__(self) -> CudaChild:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class IpcHolder(_Proc):
    """``tests/gpu/ipc_holder.py``: maps the tensor whose ``share`` payload it is given."""

    def __init__(self, payload: str, log_path: Path) -> None:
        super().__init__([sys.executable, str(GPU_TESTS / "ipc_holder.py")], cuda_env(), log_path)
        self.send(payload)
        self.held = self.answer("the IPC mapping", START_TIMEOUT)

    def __enter__(self) -> IpcHolder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
