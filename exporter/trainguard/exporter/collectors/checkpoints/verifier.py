"""Background SHA-256 verification of checkpoint files, so that a scrape never reads gigabytes.

The scrape asks for a file's status and gets "pending" until a daemon thread has hashed it once, at
a bounded read rate, and then the cached answer for as long as the file is unchanged (same device,
inode, size, mtime and ctime).
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from trainguard.exporter.collectors.checkpoints.verdict_cache import VerdictCache
from trainguard.shared.fileio import FILE_FLAGS, sha256_fd

log = logging.getLogger(__name__)

#: (st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns): a file with the same key is not
#: re-hashed. The ctime is there for content rewritten in place with its old mtime put back
#: (``rsync --inplace --times``, ``touch -r``): the kernel moves the ctime at every write and
#: nobody can set it back.
FileKey = tuple[int, int, int, int, int]
Status = Literal["pending", "match", "mismatch", "error"]

READ_CHUNK = 4 * 1024 * 1024
#: while hashing a long queue, the verdicts are saved at most this often (a mismatch at once,
#: and whenever the queue runs empty)
SAVE_INTERVAL = 60.0


def file_key(st: os.stat_result) -> FileKey:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class Stopped(Exception):
    """The verifier is shutting down."""


class TokenBucket:
    """Limits reads to ``rate`` bytes per second on average.

    Bursts are of at most ``burst`` bytes. A read larger than what is available runs into debt and
    the next one waits it off, so the long-run rate is exact whatever the chunk size.
    """

    def __init__(
        self,
        rate: float,
        burst: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], bool] | None = None,
    ) -> None:
        if rate <= 0 or burst <= 0:
            raise ValueError("rate and burst must be positive")
        self.rate = float(rate)
        self.burst = float(burst)
        self._clock = clock
        self._sleep = sleep or _plain_sleep
        self._tokens = self.burst
        self._last = clock()

    def take(self, n: int) -> None:
        """Account for ``n`` bytes about to be read, sleeping first while in debt.

        Raises Stopped when the sleep function reports a stop.
        """
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now
        if self._tokens < 0 and not self._sleep(-self._tokens / self.rate):
            raise Stopped
        self._tokens -= n


def _plain_sleep(seconds: float) -> bool:
    time.sleep(seconds)
    return True


@dataclass
class _Entry:
    path: Path
    status: Status
    detail: str
    last_seen: float


class Verifier:
    """Hashes each (file, expected hash) once, newest requests last, on one daemon thread.

    The thread is started on first use and never keeps the exporter alive. Results of files that are
    no longer asked about (deleted, replaced, pruned) are dropped after ``ttl`` seconds, so memory
    follows the files that exist, not every file ever seen. With a ``cache``, the verdicts
    survive a restart (:mod:`trainguard.exporter.collectors.checkpoints.verdict_cache`).
    """

    def __init__(
        self,
        rate_bytes_per_second: float,
        *,
        ttl_seconds: float = 900.0,
        clock: Callable[[], float] = time.monotonic,
        cache: VerdictCache | None = None,
    ) -> None:
        self._rate = rate_bytes_per_second
        self._ttl = ttl_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._entries: dict[tuple[FileKey, str], _Entry] = {}
        self._queue: collections.deque[tuple[FileKey, str]] = collections.deque()
        self._thread: threading.Thread | None = None
        self._swept_at = clock()
        self.bytes_read = 0
        #: changes whenever a known file's status changes or a file is forgotten, so a scrape
        #: can tell that the statuses it judged a location by are still the current ones
        self.generation = 0
        self._cache = cache
        self._unsaved = False
        self._saved_at = clock()
        if cache is not None:
            now = clock()
            for key, status, path in cache.load():
                self._entries[key] = _Entry(Path(path), status, "", now)  # type: ignore[arg-type]

    def status(self, path: Path, st: os.stat_result, expected: str) -> tuple[Status, str]:
        """This file's verification status (and the error, for "error"); queues it when new."""
        key = (file_key(st), expected)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                entry = _Entry(path, "pending", "", self._clock())
                self._entries[key] = entry
                self._queue.append(key)
                self._start()
                self._wake.notify()
            entry.last_seen = self._clock()
            return entry.status, entry.detail

    def known_many(
        self, files: list[tuple[os.stat_result, str]]
    ) -> list[tuple[Status, str] | None]:
        """:meth:`status` of each (stat, expected hash) already asked about, under one lock.

        Each is marked seen; a new one gets None. One lock lets a scrape of thousands of
        unchanged files skip building their paths and taking the lock per file. New files go
        through :meth:`status`.
        """
        out: list[tuple[Status, str] | None] = []
        with self._lock:
            now = self._clock()
            for st, expected in files:
                entry = self._entries.get((file_key(st), expected))
                if entry is None:
                    out.append(None)
                else:
                    entry.last_seen = now
                    out.append((entry.status, entry.detail))
        return out

    def sweep(self) -> None:
        """Forget files not asked about for ``ttl`` seconds.

        They are looked for at most every tenth of it, so that a scrape does not walk every
        known file.
        """
        now = self._clock()
        if now - self._swept_at < self._ttl / 10:
            return
        self._swept_at = now
        cutoff = now - self._ttl
        with self._lock:
            stale = [k for k, e in self._entries.items() if e.last_seen < cutoff]
            for key in stale:
                del self._entries[key]
            if stale:
                self.generation += 1
                self._unsaved = self._cache is not None
                self._wake.notify()
                self._queue = collections.deque(k for k in self._queue if k in self._entries)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        with self._lock:
            self._wake.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _start(self) -> None:
        if self._thread is None and not self._stop.is_set():
            self._thread = threading.Thread(
                target=self._run, name="trainguard-verifier", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        bucket = TokenBucket(
            self._rate,
            max(self._rate, READ_CHUNK),
            sleep=lambda s: not self._stop.wait(s),
        )
        while not self._stop.is_set():
            with self._lock:
                while not self._queue and not self._unsaved and not self._stop.is_set():
                    self._wake.wait()
                if self._stop.is_set():
                    return
                # an empty queue here means nothing to hash, verdicts to save
                key = self._queue.popleft() if self._queue else None
            if key is None:
                self._save()
                continue
            with self._lock:
                entry = self._entries.get(key)
                if entry is None:
                    continue
                path = entry.path
            try:
                outcome = self._verify(path, key, bucket)
            except Stopped:
                return
            with self._lock:
                entry = self._entries.get(key)
                if entry is None:
                    continue
                if outcome is None:  # gone or changed: a new key will come with the next scrape
                    del self._entries[key]
                else:
                    entry.status, entry.detail = outcome
                    self._unsaved = self._unsaved or outcome[0] != "error"
                self.generation += 1
                due = self._unsaved and (
                    (outcome is not None and outcome[0] == "mismatch")
                    or self._clock() - self._saved_at >= SAVE_INTERVAL
                )
            if due:
                self._save()

    def _save(self) -> None:
        """Save the settled verdicts: a snapshot taken under the lock, written outside it.

        Runs on the verifier's thread only, so that a slow cache disk never holds up a scrape.
        """
        if self._cache is None:
            self._unsaved = False
            return
        with self._lock:
            self._unsaved = False
            self._saved_at = self._clock()
            verdicts = [
                (key, e.status, str(e.path))
                for key, e in self._entries.items()
                if e.status in ("match", "mismatch")
            ]
        self._cache.save(verdicts)

    def _verify(
        self, path: Path, key: tuple[FileKey, str], bucket: TokenBucket
    ) -> tuple[Status, str] | None:
        (fkey, expected) = key
        try:
            fd = os.open(path, os.O_RDONLY | FILE_FLAGS)
        except FileNotFoundError:
            return None
        except OSError as exc:
            return "error", exc.strerror or str(exc)
        try:
            if file_key(os.fstat(fd)) != fkey:
                return None

            expected_size = fkey[2]
            left = [expected_size]

            def throttle(n: int) -> None:
                # charge what the read can return, not the buffer's size: a 4 KiB checkpoint
                # costs 4 KiB of the rate, not a whole chunk (and the read that finds the end
                # costs nothing); a file that grows while hashed is dropped below anyway
                n = min(n, left[0])
                left[0] -= n
                bucket.take(n)
                self.bytes_read += n

            chunk = max(64 * 1024, min(READ_CHUNK, expected_size + 1))
            sha, size = sha256_fd(fd, before_read=throttle, chunk=chunk)
            if file_key(os.fstat(fd)) != fkey or size != fkey[2]:
                return None  # written to while hashed: judge the new content later
        except OSError as exc:
            return "error", exc.strerror or str(exc)
        finally:
            os.close(fd)
        if sha != expected:
            log.warning("checkpoint %s does not match its recorded SHA-256", path)
            return "mismatch", ""
        return "match", ""
