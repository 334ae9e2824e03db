"""A checkpoint writer to be killed: runs one ``save`` or ``mirror`` with the ``os`` functions
it calls wrapped, so that it SIGKILLs itself right before its k-th filesystem operation (or in
the middle of it: half a write, half a copy). Every operation of the call is a kill point, from
opening the ``.part`` to fsyncing the manifest directory, and the label of each (``write:part``,
``replace:manifest``, ...) is written to a trace so the test can show which phases it covered.

    python ckpt_child.py save DIR STEP --kill-at K [--partial] [--trace FILE] [--throttle S]
    python ckpt_child.py mirror SRC_FILE MIRROR_DIR --kill-at K ...
    python ckpt_child.py serve

``serve`` is a fork server for the test's hundreds of writers: it imports everything once,
then for each line of arguments (JSON) on stdin forks a writer and prints ``pid N``; on the
next line, ``wait``, it reaps the writer and prints ``exit RC`` (RC as subprocess gives it: -9
for SIGKILL). Until then the writer, ended or not, keeps its pid, so the test may signal it.
The writers are the same; only the interpreter's start-up and imports are not paid each time.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from trainguard import checkpoint
from trainguard.checkpoint import transfer

PIECE = 16 * 1024
SIZE = 40 * PIECE + 123
COUNTED = ("open", "write", "fsync", "replace", "unlink", "ftruncate", "close", "mkdir")
COUNTED_COPY = ("copy_file_range", "sendfile")


def payload(step: int) -> bytes:
    return random.Random(step).randbytes(SIZE)


def path_kind(path: object) -> str:
    p = os.fsdecode(path)  # type: ignore[arg-type]
    if p.endswith(".part"):
        return "part"
    if p.endswith(".trainguard"):
        return "manifest-dir"
    if "/.trainguard/" in p:
        return "manifest"
    if os.path.isdir(p):
        return "dir"
    return "file"


class Injector:
    def __init__(self, kill_at: int, partial: bool, trace: str | None, throttle: float) -> None:
        self.kill_at = kill_at
        self.partial = partial
        self.throttle = throttle
        self.count = 0
        self.fd_kind: dict[int, str] = {}
        self.real: dict[str, Callable[..., Any]] = {}
        self.trace = (
            os.open(trace, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if trace else None
        )

    def log(self, line: str) -> None:
        if self.trace is not None:
            self.real.get("write", os.write)(self.trace, (line + "\n").encode())

    def install(self) -> None:
        for name in COUNTED + COUNTED_COPY:
            if hasattr(os, name):
                self.real[name] = getattr(os, name)
                setattr(os, name, self.wrap(name))

    def kind(self, name: str, args: tuple[Any, ...]) -> str:
        if name in ("open", "unlink", "mkdir"):
            return path_kind(args[0])
        if name == "replace":
            return path_kind(args[0]) if path_kind(args[0]) != "file" else path_kind(args[1])
        if name in COUNTED_COPY:
            return self.fd_kind.get(args[1] if name == "copy_file_range" else args[0], "?")
        return self.fd_kind.get(args[0], "?")

    def wrap(self, name: str) -> Callable[..., Any]:
        real = self.real[name]

        def op(*args: Any, **kwargs: Any) -> Any:
            k = self.count
            self.count += 1
            label = f"{name}:{self.kind(name, args)}"
            if self.throttle:
                time.sleep(self.throttle)
            if k == self.kill_at:
                self.log(f"{k} {label}{' partial' if self.partial else ''}")
                if self.partial and name == "write":
                    view = memoryview(args[1])
                    real(args[0], view[: max(1, view.nbytes // 2)])
                elif self.partial and name == "copy_file_range":
                    real(args[0], args[1], max(1, args[2] // 2), *args[3:])
                os.kill(os.getpid(), signal.SIGKILL)
            elif self.kill_at < 0:
                self.log(f"{k} {label}")
            result = real(*args, **kwargs)
            if name == "open":
                self.fd_kind[result] = label.split(":", 1)[1]
            return result

        return op


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("save", "mirror"))
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--kill-at", type=int, default=-1)
    ap.add_argument("--partial", action="store_true")
    ap.add_argument("--trace")
    ap.add_argument("--throttle", type=float, default=0.0)
    return ap.parse_args(argv)


def serve() -> None:
    lines = iter(sys.stdin.readline, "")
    for line in lines:
        argv = json.loads(line)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:  # the writer: what `ckpt_child.py ARGS` would do
            try:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, 1)  # stdout is the server's answers
                run(parse(argv))
            except BaseException:
                traceback.print_exc()
                os._exit(1)
            os._exit(0)
        print(f"pid {pid}", flush=True)
        if next(lines, "").strip() != "wait":
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return
        _, status = os.waitpid(pid, 0)
        print(f"exit {os.waitstatus_to_exitcode(status)}", flush=True)


def main() -> None:
    if sys.argv[1:] == ["serve"]:
        serve()
        return
    run(parse(sys.argv[1:]))
    sys.exit(0)


def run(args: argparse.Namespace) -> None:
    # small pieces, so that the data phase has as many kill points as the others
    transfer.SMALL_WRITE = 4096
    transfer.COPY_CHUNK = PIECE
    injector = Injector(args.kill_at, args.partial, args.trace, args.throttle)
    if args.mode == "save":
        step = int(args.b)
        data = payload(step)

        def write(f: Any) -> None:
            for off in range(0, len(data), PIECE):
                f.write(data[off : off + PIECE])

        injector.install()
        checkpoint.save(write, os.path.join(args.a, f"step_{step}.bin"))
    else:
        injector.install()
        checkpoint.mirror(args.a, args.b)


if __name__ == "__main__":
    main()
