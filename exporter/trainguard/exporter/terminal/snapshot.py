"""``trainguard snapshot RUN``: ask a live run for a CUDA memory snapshot now.

The run is not restarted. The command writes a request file next to the run's heartbeat; the run's
reporter thread (``trainguard.Run(..., oom_snapshots=True)``) notices it within its heartbeat
interval, dumps the snapshot and its metadata, and writes a reply that this command waits for. The
formats are in ``trainguard.shared.snapshots``; nothing here is imported by the training side.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from trainguard.shared import procinfo
from trainguard.shared.heartbeat.read import read_heartbeat
from trainguard.shared.heartbeat.record import HeartbeatError, heartbeat_filename
from trainguard.shared.snapshots import (
    REPLY_SUFFIX,
    REQUEST_SUFFIX,
    Reply,
    Request,
    SnapshotFileError,
    metadata_name,
    parse_reply,
    read_request_or_reply,
    run_stem,
    write_json,
)

POLL = 0.1


class SnapshotError(Exception):
    """Why no snapshot was taken, in words for the person at the terminal."""


@dataclass(frozen=True)
class Taken:
    snapshot: Path
    metadata: Path
    step: int | None


def request_snapshot(state_dir: Path, run: str, rank: int, timeout: float) -> Taken:
    """Ask run ``run`` rank ``rank`` for a snapshot and wait up to ``timeout`` s for its reply.

    Raises :class:`SnapshotError`.
    """
    hb_path = state_dir / heartbeat_filename(run, rank)
    try:
        hb = read_heartbeat(hb_path)
    except HeartbeatError as exc:
        if not os.path.lexists(hb_path):
            raise SnapshotError(
                f"no heartbeat of run {run!r} rank {rank} in {state_dir} (trainguard status "
                "lists the runs it knows; --state.dir, --rank)"
            ) from None
        raise SnapshotError(str(exc)) from None
    if hb.state != "running":
        raise SnapshotError(f"run {run!r} rank {rank} has {hb.state}: no process to ask")
    if hb.boot_id is not None and hb.boot_id == procinfo.boot_id():
        ticks = hb.start_ticks if procinfo.ticks_comparable() else None
        if procinfo.process_alive(hb.pid, hb.create_time, ticks) is False:
            raise SnapshotError(f"run {run!r} rank {rank}: its process (pid {hb.pid}) is gone")
    if hb.snapshots is None or not hb.snapshots.requests:
        raise SnapshotError(
            f"run {run!r} rank {rank} does not take snapshot requests: start it with "
            "trainguard.Run(..., oom_snapshots=True)"
        )
    stem = run_stem(run, rank)
    request_path = state_dir / (stem + REQUEST_SUFFIX)
    reply_path = state_dir / (stem + REPLY_SUFFIX)
    who = f"{_user()}@{socket.gethostname()[:64]} pid {os.getpid()}"
    request = Request.new(who, time.time())
    try:
        write_json(request_path, request.to_dict(), 0o600)
    except OSError as exc:
        raise SnapshotError(f"cannot write {request_path}: {exc.strerror or exc}") from None
    reply = _wait_reply(reply_path, request.id, timeout)
    if reply is None:
        with contextlib.suppress(OSError):
            os.unlink(request_path)  # not taken yet: do not leave it for later
        raise SnapshotError(
            f"no reply from run {run!r} rank {rank} within {timeout:g}s: its reporter looks "
            "for requests once per heartbeat interval, and a large allocation history takes "
            "a while to dump (try a longer --timeout); is the process stuck?"
        )
    if not reply.ok or reply.file is None:
        raise SnapshotError(f"run {run!r} rank {rank}: no snapshot: {reply.error or 'unknown'}")
    return Taken(state_dir / reply.file, state_dir / metadata_name(reply.file), reply.step)


def _wait_reply(path: Path, ident: str, timeout: float) -> Reply | None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            data, _ = read_request_or_reply(path)
            reply = parse_reply(data, str(path))
        except (FileNotFoundError, SnapshotFileError):
            reply = None  # not there yet, or being replaced: read again
        if reply is not None and reply.id == ident:
            return reply
        if time.monotonic() >= deadline:
            return None
        time.sleep(POLL)


def _user() -> str:
    try:
        return getpass.getuser()[:64]
    except Exception:
        return "unknown"
