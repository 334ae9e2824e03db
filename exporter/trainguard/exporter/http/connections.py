"""Which connection is closed to make room for a new one, and how many the process can hold.

Why it is a module of its own: the policy is what keeps Prometheus from being locked out by
connections anyone can open (see :mod:`~trainguard.exporter.http.server`), and it is tested on
its own terms (tests/exporter/test_httpserver.py) apart from the reading and answering.
"""

from __future__ import annotations

import contextlib
import resource
import socket
import threading


def raise_open_files_limit() -> int:
    """Raise the soft limit on open files to the hard one, as Go's runtime does; the limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


class Connections:
    """The open connections by what they are doing, oldest first: whom to close to make room.

    Three insertion-ordered dicts (a socket moved to the end of its dict when its state
    changes), so that the oldest idle or reading connection is found in constant time.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.idle: dict[socket.socket, None] = {}
        self.reading: dict[socket.socket, None] = {}
        self.busy: dict[socket.socket, None] = {}

    def __len__(self) -> int:
        return len(self.idle) + len(self.reading) + len(self.busy)

    def move(self, sock: socket.socket, to: dict[socket.socket, None]) -> None:
        with self.lock:
            if self._drop(sock):  # not if it was closed to make room meanwhile
                to[sock] = None

    def _drop(self, sock: socket.socket) -> bool:
        return any(group.pop(sock, 0) is None for group in (self.idle, self.reading, self.busy))

    def remove(self, sock: socket.socket) -> None:
        with self.lock:
            self._drop(sock)

    def admit(self, sock: socket.socket, limit: int) -> None:
        """Count ``sock`` in (as reading its first head), making room first if ``limit`` are open.

        The room is the longest idle connection's, else the one reading a head (or a new one
        waiting for its first) that started earliest: never the newest connection.
        """
        victim = None
        with self.lock:
            if len(self) >= limit:
                for group in (self.idle, self.reading):
                    if group:
                        victim = next(iter(group))
                        del group[victim]
                        break
            self.reading[sock] = None
        if victim is not None:
            kick(victim)

    def evict_one(self) -> None:
        """Close the longest idle connection (for an accept that ran out of files)."""
        with self.lock:
            victim = next(iter(self.idle), None)
            self.idle.pop(victim, None)  # type: ignore[arg-type]
        if victim is not None:
            kick(victim)


def kick(sock: socket.socket) -> None:
    """End a connection whose thread may be blocked reading it: its read returns at once."""
    with contextlib.suppress(OSError):
        # the plain socket's shutdown, on an SSLSocket too (its own drops the TLS object
        # under the reading thread)
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
