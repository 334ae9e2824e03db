"""Stop records: a person's word, in the state directory, that a rank was stopped on purpose.

A caught SIGTERM tells the exporter that a process was stopped, never by whom: a Python handler
does not see the sender (``si_pid``), and a scancel, a preemption, torchrun's teardown and a pod
eviction all send the same signal. A preempted run nobody restarts must keep paging; a run its
owner stopped must not. ``trainguard stop`` therefore writes, before it sends the signal, one
record per rank next to the rank's heartbeat, naming the very process it stops (pid, create
time, boot). The exporter reads a gone rank whose record names its process as stopped on
purpose (``trainguard_run_exit_info{cause="on_purpose"}``), and the run's next process under
the same name and rank counts no death for it (:mod:`trainguard.run.deaths`): both sides read
it, so it lives here. A record names one process and a
deadline: a relaunch of the rank (new pid, new create time) is judged afresh, and a process
still running at the deadline (it ignored the signal, or ``--no-signal`` was given and nobody
stopped it) is judged as if nobody had said anything, so an old record never hides a crash.

The state directory may be writable by everyone (the shipped tmpfiles makes it 1777), so a
record counts only when the uid owning it owns the heartbeat too, or is root: whoever may
signal the process may say it was stopped.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.shared.fileio import replace_file
from trainguard.shared.heartbeat.record import (
    MAX_PID,
    MAX_RANK,
    MAX_TIME,
    SIGNAL_NAME_RE,
    SUFFIX,
    Heartbeat,
    check_run_name,
    heartbeat_filename,
)

STOP_SUFFIX = ".stop.json"
FORMAT = 1
MAX_BYTES = 4096  # a record is about 200 bytes
#: the create times a record and a heartbeat hold are the same float, copied; a little slack
#: for a record written by hand from ``ps``
CREATE_TIME_SLACK = 1e-3


class StopRecordError(ValueError):
    """Why a stop record cannot be used, naming the file."""


@dataclass(frozen=True)
class StopRecord:
    """``trainguard stop``'s word that it stopped this process of this rank, and when."""

    run: str
    rank: int
    pid: int
    create_time: float
    boot_id: str | None
    requested: float  # seconds since the epoch, the stopping host's clock
    until: float  # the process's end counts as this stop when it comes by then (same clock)
    signal: str  # what trainguard stop sent; empty with --no-signal (the person sends it)
    uid: int | None = None  # owner of the file, filled in by the reader

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "run": self.run,
            "rank": self.rank,
            "pid": self.pid,
            "create_time": self.create_time,
            "boot_id": self.boot_id,
            "requested": self.requested,
            "until": self.until,
            "signal": self.signal,
        }

    def names(self, hb: Heartbeat) -> bool:
        """Whether this record covers the process that wrote ``hb``.

        The same process (not a relaunch), last heard of by ``until``: a process that outlived
        the stop's deadline (it ignored the signal, or nobody sent one after ``--no-signal``)
        is no longer covered.
        """
        return (
            hb.time <= self.until
            and self.run == hb.run
            and self.rank == hb.rank
            and self.pid == hb.pid
            and abs(self.create_time - hb.create_time) <= CREATE_TIME_SLACK
            and (self.boot_id is None or hb.boot_id is None or self.boot_id == hb.boot_id)
        )


def stop_filename(run: str, rank: int) -> str:
    """The stop record's file name: the rank's heartbeat's, ``.stop.json`` for its suffix."""
    return heartbeat_filename(run, rank)[: -len(SUFFIX)] + STOP_SUFFIX


def write_stop(state_dir: Path, record: StopRecord) -> Path:
    """Write (or replace) ``record`` atomically in ``state_dir``; its path. Raises OSError."""
    path = state_dir / stop_filename(record.run, record.rank)
    payload = json.dumps(record.to_dict(), separators=(",", ":")).encode("utf-8")
    replace_file(path, payload, 0o644, fsync=True)
    return path


def read_stop(path: str | os.PathLike[str], heartbeat_owner: int | None) -> StopRecord:
    """The record in ``path``, if its owner may speak for a heartbeat owned by ``heartbeat_owner``.

    Raises :class:`StopRecordError` (a missing file: FileNotFoundError).
    """
    name = os.fspath(path)
    # never follow a planted link, never wait on a planted FIFO (the check below refuses it)
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(name, flags | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise StopRecordError(f"{name}: cannot open: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StopRecordError(f"{name}: not a regular file")
        if st.st_size > MAX_BYTES:
            raise StopRecordError(f"{name}: {st.st_size} bytes, more than {MAX_BYTES}")
        raw = os.read(fd, MAX_BYTES + 1)
    finally:
        os.close(fd)
    if heartbeat_owner is not None and st.st_uid not in (0, heartbeat_owner):
        raise StopRecordError(
            f"{name}: not honoured: owned by uid {st.st_uid}, the run's heartbeat by uid "
            f"{heartbeat_owner} (only the run's owner or root may say it was stopped)"
        )
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise StopRecordError(f"{name}: not JSON: {exc}") from None
    return _parse(name, doc, st.st_uid)


def _parse(name: str, doc: Any, uid: int) -> StopRecord:
    if not isinstance(doc, dict):
        raise StopRecordError(f"{name}: expected a JSON object")
    if doc.get("format") != FORMAT:
        raise StopRecordError(f"{name}: format: expected {FORMAT}, got {doc.get('format')!r}")
    problem = check_run_name(doc.get("run"))
    if problem:
        raise StopRecordError(f"{name}: run: {problem}")
    ints = {"rank": MAX_RANK, "pid": MAX_PID}
    for key, top in ints.items():
        v = doc.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= top:
            raise StopRecordError(f"{name}: {key}: expected an integer 0..{top}, got {v!r}")
    for key in ("create_time", "requested", "until"):
        v = doc.get(key)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 < v < MAX_TIME:
            raise StopRecordError(f"{name}: {key}: expected seconds since the epoch, got {v!r}")
    boot = doc.get("boot_id")
    if boot is not None and (not isinstance(boot, str) or not 0 < len(boot) <= 64):
        raise StopRecordError(f"{name}: boot_id: expected a string or null")
    if doc["until"] < doc["requested"]:
        raise StopRecordError(f"{name}: until: before requested")
    sig = doc.get("signal")
    if not isinstance(sig, str) or not (sig == "" or SIGNAL_NAME_RE.match(sig)):
        raise StopRecordError(f"{name}: signal: expected a signal name such as SIGTERM, or ''")
    return StopRecord(
        run=doc["run"],
        rank=doc["rank"],
        pid=doc["pid"],
        create_time=float(doc["create_time"]),
        boot_id=boot,
        requested=float(doc["requested"]),
        until=float(doc["until"]),
        signal=sig,
        uid=uid,
    )
