"""Answering ``trainguard snapshot RUN``: request files picked up and replied to by the reporter.

The command leaves a request file beside the run's heartbeat, the reporter's thread picks it
up (read as every untrusted file is, then removed), takes a snapshot unless one was taken on
request within :data:`REQUEST_MIN_GAP` or the request belongs to another user, and writes a
reply the command waits for. Formats: :mod:`trainguard.shared.snapshots`.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from trainguard.shared.snapshots import (
    REPLY_SUFFIX,
    REQUEST_SUFFIX,
    Reply,
    Request,
    SnapshotFileError,
    parse_request,
    read_request_or_reply,
    write_json,
)

log = logging.getLogger("trainguard.reporter")

#: seconds between two snapshots taken on request (a request loop must not stall training)
REQUEST_MIN_GAP = 30.0

Warn = Callable[..., None]
#: (step, scalars) at this moment, as the heartbeat would record them
Progress = Callable[[], tuple[int | None, Mapping[str, float]]]
#: takes the snapshot asked for: (its file name, None), or (None, why not)
Dump = Callable[[int | None, Mapping[str, float], Request], tuple[str | None, str | None]]


class Requests:
    """The request file of one run and rank: ``<stem>`` + the request suffix in ``state_dir``.

    ``who`` names them in the log.
    """

    def __init__(self, state_dir: Path, stem: str, who: str, warn: Warn) -> None:
        self._dir = state_dir
        self._stem = stem
        self._who = who
        self._warn = warn
        self._last_request = -math.inf
        self._skipped_request: tuple[int, int, int] | None = None

    def answer(self, progress: Progress, dump: Dump) -> None:
        """Answer the request waiting, if any.

        Take the snapshot through ``dump`` or say why not, in the reply.
        """
        path = self._dir / (self._stem + REQUEST_SUFFIX)
        try:
            data, st = read_request_or_reply(path)
        except FileNotFoundError:
            return
        except SnapshotFileError as exc:
            self._warn("request-file", "trainguard: snapshot request ignored: %s", exc)
            self._drop(path, None)
            return
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key == self._skipped_request:
            return  # could not remove it: answered once already
        if not self._drop(path, key):
            return  # gone meanwhile
        try:
            request = parse_request(data, str(path))
        except SnapshotFileError as exc:
            self._warn("request-file", "trainguard: snapshot request ignored: %s", exc)
            return
        getuid = getattr(os, "getuid", None)
        if getuid is not None and st.st_uid not in (getuid(), 0):
            self._reply(request, None, None, f"refused: the request belongs to uid {st.st_uid}")
            return
        now = time.monotonic()
        if now - self._last_request < REQUEST_MIN_GAP:
            self._reply(
                request,
                None,
                None,
                f"refused: a snapshot was taken on request {now - self._last_request:.0f}s ago; "
                f"at most one every {REQUEST_MIN_GAP:.0f}s",
            )
            return
        self._last_request = now
        log.warning(
            "trainguard: %s: memory snapshot requested (%s)",
            self._who,
            request.requester or "unknown requester",
        )
        step, scalars = progress()
        name, why = dump(step, scalars, request)
        self._reply(request, name, step, why)

    def _drop(self, path: Path, key: tuple[int, int, int] | None) -> bool:
        """Remove a request file; False when it was already gone."""
        try:
            os.unlink(path)
        except FileNotFoundError:
            return False
        except OSError as exc:
            self._skipped_request = key
            self._warn("request-rm", "trainguard: cannot remove %s: %s", path, exc)
        return True

    def _reply(self, request: Request, name: str | None, step: int | None, why: str | None) -> None:
        reply = Reply(request.id, time.time(), name is not None, name, step, why)
        try:
            write_json(self._dir / (self._stem + REPLY_SUFFIX), reply.to_dict())
        except Exception as exc:
            self._warn("reply", "trainguard: snapshot reply not written: %r", exc)
