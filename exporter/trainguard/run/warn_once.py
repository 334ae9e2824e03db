"""Warnings a training process logs once, however often their cause repeats.

A reporter runs beside a training loop for days: a full disk or a bad scalar would otherwise
log the same line at every heartbeat and bury the training's own output. Each warning has a
key; the first warning with a key is logged, the rest are dropped.
"""

from __future__ import annotations

import errno
import logging
import threading
from pathlib import Path
from typing import Any

#: write errors that say the disk is full, read-only or not ours: said once in plain words
QUIET_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.EDQUOT}


class WarnOnce:
    """Log a warning the first time its key is seen; safe to call from several threads."""

    def __init__(self, log: logging.Logger) -> None:
        self._log = log
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, key: str, message: str, *args: Any) -> None:
        with self._lock:
            if key in self._warned:
                return
            self._warned.add(key)
        self._log.warning(message, *args)


def warn_write_failure(warn: WarnOnce, path: Path, exc: OSError) -> None:
    """Say once per error code that the heartbeat is not written and training goes on."""
    code = errno.errorcode.get(exc.errno or 0, "error")
    quiet = " (full, read-only or not writable disk)" if exc.errno in QUIET_ERRNOS else ""
    warn(
        f"write:{code}",
        "trainguard: cannot write heartbeat %s: %s%s; training continues and "
        "trainguard keeps trying without logging this again",
        path,
        exc.strerror or exc,
        quiet,
    )
