"""A read-only FUSE filesystem that mirrors a directory and, on command, stops answering: the
dead NFS server of the fault tests, as a real mount the exporter's reads really block on.

Run as ``python hangfs.py BACKING MOUNTPOINT``; it prints ``mounted`` once the mount answers,
then reads commands on stdin, one a line: ``hang`` (every later call on the mount blocks in
the kernel, as on a hard NFS mount whose server went away) and ``answer`` (the blocked calls
and all later ones are served again). Closing stdin or SIGTERM unmounts it. Needs libfuse 2
(Debian ``libfuse2``) for fusepy, and the right to mount (root or ``fusermount``)."""

from __future__ import annotations

import errno
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from fuse import FUSE, FuseOSError, Operations


class HangFS(Operations):  # type: ignore[misc]
    """Every operation waits while the filesystem is told to hang, then mirrors ``root``."""

    def __init__(self, root: str, answering: threading.Event) -> None:
        self.root = root
        self.answering = answering

    def _path(self, path: str) -> str:
        self.answering.wait()
        return os.path.join(self.root, path.lstrip("/"))

    def _call(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except OSError as exc:
            raise FuseOSError(exc.errno or errno.EIO) from exc

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        st = self._call(lambda: os.lstat(self._path(path)))
        keys = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_ino")
        out = {k: getattr(st, k) for k in keys}
        out.update(st_atime=st.st_atime, st_mtime=st.st_mtime, st_ctime=st.st_ctime)
        return out

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *self._call(lambda: os.listdir(self._path(path)))]

    def readlink(self, path: str) -> str:
        return str(self._call(lambda: os.readlink(self._path(path))))

    def open(self, path: str, flags: int) -> int:
        return int(self._call(lambda: os.open(self._path(path), os.O_RDONLY)))

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        self.answering.wait()
        return bytes(self._call(lambda: os.pread(fh, size, offset)))

    def release(self, path: str, fh: int) -> int:
        os.close(fh)
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        st = self._call(lambda: os.statvfs(self._path(path)))
        keys = ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree")
        return {k: getattr(st, k) for k in keys}


def _commands(answering: threading.Event) -> None:
    for line in sys.stdin:
        if line.strip() == "hang":
            answering.clear()
        elif line.strip() == "answer":
            answering.set()
        print(line.strip(), flush=True)  # the command is in force
    # stdin closed: the test is done; answer what still waits, and unmount (libfuse does on
    # SIGTERM)
    answering.set()
    os.kill(os.getpid(), signal.SIGTERM)


def _announce(mountpoint: str) -> None:
    """Say ``mounted`` once the mount is there (or ``not mounted`` after 30 s)."""
    deadline = time.monotonic() + 30
    while not os.path.ismount(mountpoint) and time.monotonic() < deadline:
        time.sleep(0.02)
    print("mounted" if os.path.ismount(mountpoint) else "not mounted", flush=True)


def main() -> None:
    backing, mountpoint = sys.argv[1:3]
    answering = threading.Event()
    answering.set()
    threading.Thread(target=_commands, args=(answering,), daemon=True).start()
    threading.Thread(target=_announce, args=(mountpoint,), daemon=True).start()
    # attributes and names are not cached by the kernel, and reads bypass the page cache, so
    # that every stat, listing and read of the exporter reaches this process (and can hang)
    FUSE(
        HangFS(backing, answering),
        mountpoint,
        foreground=True,
        nothreads=False,
        ro=True,
        direct_io=True,
        attr_timeout=0,
        entry_timeout=0,
        negative_timeout=0,
    )


if __name__ == "__main__":
    main()
