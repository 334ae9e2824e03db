"""Heartbeat files: what a training process tells the exporter, and what outlives the process.

A training process (``trainguard.Run``) tells the exporter what it is doing through its
heartbeat, and the exporter still knows what the heartbeat said after that process is gone.

One JSON file per run and rank in the state directory, replaced atomically so that a reader
never sees half a file. Other users may be able to write the state directory, so the reader
trusts nothing: no symlinks, regular files only, at most 1 MiB, every field's type, range and
length checked, and every failure a :class:`HeartbeatError` naming the file and the field.
Error messages never quote string values from the file (a hard link to a private file must
not leak its contents into the exporter's log).

Within one ``format`` version fields are only ever added: a reader ignores keys it does not
know, and an incompatible change bumps ``format`` (which an older reader then refuses).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trainguard.shared.fields import UNTRUSTED, text_problem
from trainguard.shared.fileio import replace_file
from trainguard.shared.jobinfo import JobInfo
from trainguard.shared.nonfinite import NonFinite
from trainguard.shared.statedir import state_file_stem

FORMAT = 1
SUFFIX = ".heartbeat.json"
MAX_BYTES = 1 << 20  # 1 MiB: a real heartbeat is about 2 KiB
MAX_RUN_NAME = 128
MAX_RANK = 1_000_000
MAX_PID = 2**32 - 1
MAX_INT = 2**63 - 1
MAX_TIME = 1e11  # seconds since the epoch, year ~5100: anything above is garbage
MAX_PATH = 4096
MAX_SCALARS = 16
MAX_MIRRORS = 16
MAX_DEVICES = 64
MAX_DEATH_HISTORY = 20
STATES = ("running", "finished", "failed")
#: causes of a death, as read; ``gpu_xid`` is written as ``unknown`` with ``xid`` set, ``signal``
#: and ``time_limit`` as ``exception`` with ``signal`` set (see :meth:`Death.to_dict`)
CAUSES = ("reboot", "oom_killer", "gpu_xid", "exception", "signal", "time_limit", "unknown")
#: how a process that caught the signal ending it says why (``exit_cause``): ``time_limit`` when
#: it came at the end time the scheduler exported (docs/heartbeat.md, "How a run ends")
SIGNAL_CAUSES = ("signal", "time_limit")
#: a signal's name as written (``SIGTERM``)
SIGNAL_NAME_RE = re.compile(r"^SIG[A-Z0-9+-]{1,13}$")
MAX_XID = 65535
#: why a memory snapshot was dumped (``trainguard.shared.snapshots``)
SNAPSHOT_REASONS = ("oom", "periodic", "requested")
MAX_RECENT_SNAPSHOTS = 8
#: the longest ``stuck.where`` a reader takes (the reporter writes at most 200 characters)
MAX_STUCK_WHERE = 256

SCALAR_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
# same rule as mirror names in the config file
MIRROR_NAME_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


class HeartbeatError(ValueError):
    """A heartbeat file that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class AllocatorStats:
    """One CUDA device as the process's caching allocator sees it (torch.cuda.memory_stats)."""

    device: int
    allocated_bytes: int
    reserved_bytes: int
    max_allocated_bytes: int
    inactive_split_bytes: int
    alloc_retries: int
    ooms: int
    #: the GPU's UUID in NVML's spelling (``trainguard.shared.gpu_uuid``), which joins this
    #: device to the exporter's GPUs; None when the process could not tell (older reporters)
    uuid: str | None = None
    #: the device's memory as the process sees it (torch's ``total_memory``; a MIG slice's
    #: own), None when unknown (older reporters)
    total_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON object; ``uuid`` and ``total_bytes`` only when known.

        Older readers ignore them either way.
        """
        out = vars(self).copy()
        for key in ("uuid", "total_bytes"):
            if out[key] is None:
                del out[key]
        return out


@dataclass(frozen=True)
class Death:
    """A previous process of this run and rank that went away without finishing."""

    step: int | None  # last step it reported (None: died before its first step)
    time: float  # its last heartbeat: the latest moment it is known to have been alive
    detected: float  # when the restarted run found it dead
    cause: str  # one of CAUSES
    #: the GPU error (NVIDIA Xid) the kernel logged around the death: the cause when
    #: ``gpu_xid``, told beside an ``exception``
    xid: int | None = None
    #: the signal that ended it (``SIGTERM``) when the cause is ``signal`` or ``time_limit``
    signal: str | None = None
    #: the id of the job the dead process belonged to (``""``: none, a lone process; None:
    #: unknown, recorded by an older reporter): a run relaunched under a new job id records the
    #: old job's death, and the new job was not restarted
    job: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON object as written: the causes older readers do not know, as ones they do.

        ``gpu_xid`` is written as ``unknown`` plus ``xid``; ``signal`` and ``time_limit`` as
        ``exception`` plus ``signal`` (and ``time_limit: true``). That way readers of format 1
        that predate them (which refuse a cause they do not know, and with it the whole file)
        read an unknown cause or an exception instead of losing the run.
        """
        cause = self.cause
        if cause == "gpu_xid":
            cause = "unknown"
        elif cause in SIGNAL_CAUSES:
            cause = "exception"
        out: dict[str, Any] = {
            "step": self.step,
            "time": self.time,
            "detected": self.detected,
            "cause": cause,
            "xid": self.xid,
        }
        if self.signal is not None and self.cause in SIGNAL_CAUSES:
            out["signal"] = self.signal
            if self.cause == "time_limit":
                out["time_limit"] = True
        if self.job is not None:
            out["job"] = self.job
        return out


@dataclass(frozen=True)
class SnapshotRecord:
    """One memory snapshot file the run wrote (a name in the state directory)."""

    file: str
    reason: str  # one of SNAPSHOT_REASONS
    step: int | None
    time: float
    bytes: int

    def to_dict(self) -> dict[str, Any]:
        return vars(self).copy()


@dataclass(frozen=True)
class SnapshotState:
    """The reporter's memory snapshots, as the heartbeat carries them.

    The snapshots dumped and failed per reason (carried across restarts), whether torch records
    the allocation history, whether the reporter answers ``trainguard snapshot`` requests, and
    the newest files (newest last).
    """

    counts: Mapping[str, int] = field(default_factory=dict)
    failures: Mapping[str, int] = field(default_factory=dict)
    history: bool | None = None
    requests: bool = False
    recent: tuple[SnapshotRecord, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "counts": dict(self.counts),
            "failures": dict(self.failures),
            "history": self.history,
            "requests": self.requests,
            "recent": [r.to_dict() for r in self.recent],
        }


@dataclass(frozen=True)
class Stuck:
    """Where the main thread of a rank whose step is overdue was when last sampled.

    Written by ``trainguard.run.stack`` only while the step is overdue; absent otherwise.
    """

    since: float  # when the reporter first found the step overdue (this stall)
    where: str  # "DataLoader.__next__ <- train.py:88 load_batch": names and lines only
    collective: str | None = None  # the torch.distributed function it waits in, if any
    #: inside a checkpoint save (``trainguard.run.stack.SAVES``): a routine pause, not a hang,
    #: while the run's stall threshold allows it. False too from older reporters (unknown)
    saving: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The JSON object; ``saving`` only when true (older readers ignore it either way)."""
        out = vars(self).copy()
        if not self.saving:
            del out["saving"]
        return out


@dataclass(frozen=True)
class Timing:
    """A process's running totals of time waiting for data and computing (``Run.step``).

    ``steps`` counts the steps that carried a duration; all three start at 0 with each process.
    """

    data_seconds: float
    compute_seconds: float
    steps: int

    def to_dict(self) -> dict[str, Any]:
        return vars(self).copy()


@dataclass(frozen=True)
class Heartbeat:
    """One run and rank as its reporter last wrote it: identity, progress, health and history.

    The process writes it; the exporter, which outlives the process, reads it. So it carries
    what a dead process cannot tell any more: its pid and start time (to tell a death from a
    clean exit and from pid reuse), the death history its earlier processes left, and how it
    ended. Field by field: docs/heartbeat.md.
    """

    run: str
    rank: int
    pid: int
    create_time: float  # psutil.Process(pid).create_time(), compared by the exporter
    host: str
    started: float
    time: float  # when this heartbeat was written
    state: str = "running"
    error: str | None = None  # exception type name when state is "failed"
    step: int | None = None
    step_time: float | None = None  # wall time of the last step() call
    #: the first step this process reported: after a restart, where it resumed (the steps a
    #: death lost are the dead process's step minus the one before this)
    first_step: int | None = None
    scalars: Mapping[str, float] = field(default_factory=dict)
    world_size: int | None = None
    boot_id: str | None = None
    boot_time: float | None = None
    pid_ns: int | None = None  # inode of /proc/self/ns/pid: pids only compare within one
    checkpoint_dir: str | None = None
    #: names of the checkpoints in checkpoint_dir and the mirrors (``checkpoint-{step}``...)
    #: and how step directories are committed; None: the exporter's defaults (``step_{step}``,
    #: ``auto``). Checked by the exporter, which fails that location alone when they are bad.
    checkpoint_pattern: str | None = None
    checkpoint_layout: str | None = None
    mirrors: Mapping[str, str] = field(default_factory=dict)
    log_file: str | None = None
    allocator: tuple[AllocatorStats, ...] = ()
    memory_snapshots: int = 0
    deaths: int = 0
    death_history: tuple[Death, ...] = ()
    version: str | None = None
    #: the process's start in clock ticks since boot (/proc/PID/stat field 22; Linux): with the
    #: boot id, exact where the create time is only compared within a second. Absent in
    #: heartbeats of older reporters, which are then judged by the create time alone.
    start_ticks: int | None = None
    #: memory snapshots beyond the OOM count (None: a reporter without them, or they are off)
    snapshots: SnapshotState | None = None
    #: NaN and infinite scalars the reporter observed (None: an older reporter)
    nonfinite: NonFinite | None = None
    #: where the main thread is while the step is overdue (None: stepping, or not sampled)
    stuck: Stuck | None = None
    #: the signal that ended (state "failed") or is ending (state "running": its handler runs,
    #: or the main thread has not reached it yet) this process, with ``exit_cause``
    #: (:data:`SIGNAL_CAUSES`); None otherwise (trainguard.run.signals)
    signal: str | None = None
    exit_cause: str | None = None
    #: the newest watched signal the process caught that did not end it (a Slurm ``USR1``
    #: warning to a script's own handler), and when
    last_signal: str | None = None
    last_signal_time: float | None = None

    #: the job of many ranks this rank belongs to (``trainguard.shared.jobinfo``); None: none
    #: known (a lone process, or a reporter without it)
    job: JobInfo | None = None
    #: time waiting for data and computing, summed over this process's steps (None: the
    #: process never gave ``data_seconds``/``compute_seconds`` to ``step``)
    timing: Timing | None = None
    #: the process has not begun training yet and may never (a framework callback reports from
    #: the framework's set-up, before a checkpoint is loaded, for a relaunch that dies there to
    #: be seen; an evaluation-only script never begins): alive, it is not judged on progress;
    #: gone without finishing, it died. False: training (every older reporter's heartbeat)
    starting: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The JSON document, ``format`` first; the optional sections only when set."""
        out = {
            "format": FORMAT,
            "run": self.run,
            "rank": self.rank,
            "pid": self.pid,
            "create_time": self.create_time,
            "start_ticks": self.start_ticks,
            "host": self.host,
            "started": self.started,
            "time": self.time,
            "state": self.state,
            "error": self.error,
            "step": self.step,
            "step_time": self.step_time,
            "scalars": dict(self.scalars),
            "world_size": self.world_size,
            "boot_id": self.boot_id,
            "boot_time": self.boot_time,
            "pid_ns": self.pid_ns,
            "checkpoint_dir": self.checkpoint_dir,
            "checkpoint_pattern": self.checkpoint_pattern,
            "checkpoint_layout": self.checkpoint_layout,
            "mirrors": dict(self.mirrors),
            "log_file": self.log_file,
            "allocator": [a.to_dict() for a in self.allocator],
            "memory_snapshots": self.memory_snapshots,
            "deaths": self.deaths,
            "death_history": [d.to_dict() for d in self.death_history],
            "version": self.version,
        }
        if self.first_step is not None:
            out["first_step"] = self.first_step
        if self.snapshots is not None:
            out["snapshots"] = self.snapshots.to_dict()
        if self.nonfinite is not None:
            out["nonfinite"] = self.nonfinite.to_dict()
        if self.stuck is not None:
            out["stuck"] = self.stuck.to_dict()
        for key in ("signal", "exit_cause", "last_signal", "last_signal_time"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.job is not None:
            out["job"] = self.job.to_dict()
        if self.timing is not None:
            out["timing"] = self.timing.to_dict()
        if self.starting:
            out["starting"] = True
        return out

    @property
    def filename(self) -> str:
        return heartbeat_filename(self.run, self.rank)


def check_run_name(name: object) -> str | None:
    """Why ``name`` cannot be a run name, or None when it can.

    Anything printable up to 128 characters: the name goes into a label value and log lines,
    never into a path.
    """
    if not isinstance(name, str):
        return f"expected a string, got {kind_of(name)}"
    if not 1 <= len(name) <= MAX_RUN_NAME:
        return f"expected 1-{MAX_RUN_NAME} characters, got {len(name)}"
    return text_problem(name)


def heartbeat_filename(run: str, rank: int) -> str:
    """The heartbeat file name of a run and rank: ``<sanitized>-<sha8>.rank<N>.heartbeat.json``.

    The readable part is only a hint (run names may hold '/', '..' or anything else); the hash of
    the real name keeps names that sanitize alike apart. The real name is stored inside the file.
    """
    return f"{state_file_stem(run, run, fallback='run')}.rank{rank}{SUFFIX}"


def write_heartbeat(path: str | os.PathLike[str], data: Heartbeat | Mapping[str, Any]) -> None:
    """Replace ``path`` atomically, through a temp file in the same directory.

    The temp file is created exclusively (so a planted symlink is never followed), written,
    fsynced, then ``os.replace``d. The directory is not fsynced: losing the newest heartbeat in a
    power cut leaves the previous one, which is all a reader needs.
    """
    doc = data.to_dict() if isinstance(data, Heartbeat) else dict(data)
    payload = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    replace_file(path, payload, fsync=True)


def kind_of(value: Any) -> str:
    """What a JSON value is, for "expected X, got Y" (:class:`trainguard.shared.fields.Dialect`)."""
    return UNTRUSTED.kind(value)
