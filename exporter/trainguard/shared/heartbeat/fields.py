"""The field checks of a heartbeat's JSON document (:class:`Fields`).

They check every field's type, range and length, with the field's path
(``snapshots.recent[2].reason``) in every error. Used by
:func:`trainguard.shared.heartbeat.read.parse_heartbeat`; like it, an error never quotes a string
value from the file. The checks themselves are the one field validator's
(:mod:`trainguard.shared.fields`, which the config schema and restore results use too); this
module says which field of a heartbeat gets which.
"""

from __future__ import annotations

import os
from typing import Any

from trainguard.shared import fields
from trainguard.shared.gpu_uuid import normalize_gpu_uuid
from trainguard.shared.heartbeat.record import (
    CAUSES,
    MAX_DEATH_HISTORY,
    MAX_DEVICES,
    MAX_INT,
    MAX_MIRRORS,
    MAX_PATH,
    MAX_RECENT_SNAPSHOTS,
    MAX_SCALARS,
    MAX_STUCK_WHERE,
    MAX_TIME,
    MAX_XID,
    MIRROR_NAME_RE,
    SCALAR_NAME_RE,
    SIGNAL_CAUSES,
    SIGNAL_NAME_RE,
    SNAPSHOT_REASONS,
    AllocatorStats,
    Death,
    HeartbeatError,
    SnapshotRecord,
    SnapshotState,
    Stuck,
    Timing,
)
from trainguard.shared.jobinfo import LAUNCHERS, MAX_ATTEMPT_ID, MAX_JOB_ID, MAX_JOB_INT, JobInfo

_MISSING = object()


class Fields(fields.Node):
    """One JSON object of a heartbeat, its fields read by the checks of :mod:`~.fields`.

    Every error is a :class:`HeartbeatError` naming the file and the field's whole path.
    """

    __slots__ = ("source",)

    def __init__(self, source: str, data: dict[str, Any], path: str = "") -> None:
        super().__init__(data, path)
        self.source = source

    def error(self, path: str, message: str) -> HeartbeatError:
        return HeartbeatError(f"{self.source}: field '{path}': {message}")

    def _absent(self, key: str, default: Any) -> Any:
        if default is _MISSING:
            self.fail_at(key, "missing (or null)")
        return default

    def get(self, key: str, check: Any, *, default: Any = _MISSING) -> Any:
        """The field key checked by check (a problem or None); null counts as missing."""
        value = self.raw.get(key)
        if value is None:
            return self._absent(key, default)
        problem = check(value)
        if problem:
            self.fail_at(key, problem)
        return value

    def integer(
        self, key: str, lo: int, hi: int, *, optional: bool = False, default: Any = _MISSING
    ) -> Any:
        value = self.raw.get(key)
        if value is None:
            return self._absent(key, None if optional else default)
        problem = fields.integer(value, lo, hi)
        if problem:
            self.fail_at(key, problem)
        return value

    def timestamp(self, key: str, *, optional: bool = False) -> Any:
        value = self.raw.get(key)
        if value is None:
            return self._absent(key, None if optional else _MISSING)
        problem = fields.number(value, 0, MAX_TIME, "seconds since the epoch")
        if problem:
            self.fail_at(key, problem)
        return float(value)

    def text(self, key: str, limit: int, *, optional: bool = False, default: Any = _MISSING) -> Any:
        value = self.raw.get(key)
        if value is None:
            return self._absent(key, None if optional else default)
        problem = fields.text(value, limit)
        if problem:
            self.fail_at(key, problem)
        return value

    def abspath(self, key: str) -> str | None:
        value: str | None = self.text(key, MAX_PATH, optional=True)
        if value is not None and not os.path.isabs(value):
            self.fail_at(key, "expected an absolute path")
        return value

    def mapping(self, key: str, limit: int) -> dict[str, Any]:
        value = self.raw.get(key)
        if value is None:
            return {}
        problem = fields.mapping(value, limit, fields.UNTRUSTED)
        if problem:
            self.fail_at(key, problem)
        return value

    def section(self, key: str) -> Fields | None:
        """The optional nested object ``key`` read as Fields of its own (None when absent).

        Its errors name the field's whole path (``stuck.where``).
        """
        value = self.raw.get(key)
        if value is None:
            return None
        problem = fields.mapping(value, None, fields.UNTRUSTED)
        if problem:
            self.fail_at(key, problem)
        return Fields(self.source, value, fields.join(self.path, key))

    def scalars(self, key: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, v in self.mapping(key, MAX_SCALARS).items():
            if not SCALAR_NAME_RE.match(name):
                self.fail_at(key, "expected names of letters, digits and '_' (at most 64)")
            if not fields.is_number(v):
                self.fail_at(f"{key}.{name}", fields.UNTRUSTED.expected("a number", v))
            f = fields.as_float(v)
            if f is None:
                self.fail_at(f"{key}.{name}", f"number out of range: {fields.short_int(int(v))}")
            out[name] = f  # NaN and infinities are allowed: a NaN loss is news
        return out

    def mirrors(self, key: str) -> dict[str, str]:
        out: dict[str, str] = {}
        for name, v in self.mapping(key, MAX_MIRRORS).items():
            if name == "primary" or not MIRROR_NAME_RE.match(name):
                self.fail_at(
                    key,
                    "expected mirror names other than 'primary' (letters, "
                    "digits, _ . : -, at most 128)",
                )
            sub = Fields(self.source, {name: v}, fields.join(self.path, key))
            path = sub.abspath(name)
            if path is None:
                sub.fail_at(name, "expected an absolute path")
            out[name] = path
        return out

    def items(self, key: str, limit: int) -> list[dict[str, Any]]:
        value = self.raw.get(key)
        if value is None:
            return []
        problem = fields.sequence(value, limit, fields.UNTRUSTED)
        if problem:
            self.fail_at(key, problem)
        for i, item in enumerate(value):
            problem = fields.mapping(item, None, fields.UNTRUSTED)
            if problem:
                self.fail_at(f"{key}[{i}]", problem)
        return value

    def allocator(self, key: str) -> tuple[AllocatorStats, ...]:
        out = []
        seen: set[int] = set()
        for i, item in enumerate(self.items(key, MAX_DEVICES)):
            f = Fields(self.source, item, fields.join(self.path, f"{key}[{i}]"))
            device = f.integer("device", 0, 1023)
            if device in seen:
                self.fail_at(f"{key}[{i}].device", f"device {device} listed twice")
            seen.add(device)
            out.append(
                AllocatorStats(
                    device=device,
                    allocated_bytes=f.integer("allocated_bytes", 0, MAX_INT),
                    reserved_bytes=f.integer("reserved_bytes", 0, MAX_INT),
                    max_allocated_bytes=f.integer("max_allocated_bytes", 0, MAX_INT),
                    inactive_split_bytes=f.integer("inactive_split_bytes", 0, MAX_INT),
                    alloc_retries=f.integer("alloc_retries", 0, MAX_INT),
                    ooms=f.integer("ooms", 0, MAX_INT),
                    uuid=f.gpu_uuid("uuid"),
                    total_bytes=f.integer("total_bytes", 1, MAX_INT, optional=True),
                )
            )
        return tuple(out)

    def gpu_uuid(self, key: str) -> str | None:
        """An optional GPU UUID in either spelling, returned in NVML's."""
        value = self.text(key, 64, optional=True)
        if value is None:
            return None
        uuid = normalize_gpu_uuid(value)
        if uuid is None:
            self.fail_at(key, "expected a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)")
        return uuid

    def snapshots(self, key: str) -> SnapshotState | None:
        """The optional ``snapshots`` object: counts per reason, the newest files."""
        f = self.section(key)
        if f is None:
            return None
        counts = {}
        for name in ("counts", "failures"):
            table = f.mapping(name, len(SNAPSHOT_REASONS))
            for reason, count in table.items():
                if reason not in SNAPSHOT_REASONS:
                    f.fail_at(f"{name}.{reason[:32]}", "not a snapshot reason")
                if fields.integer(count, 0, MAX_INT):
                    f.fail_at(f"{name}.{reason}", "expected an integer >= 0")
            counts[name] = table
        history = f.raw.get("history")
        if history is not None and not isinstance(history, bool):
            f.fail_at("history", fields.UNTRUSTED.expected("true, false or null", history))
        requests = f.raw.get("requests", False)
        f.check_at("requests", fields.boolean(requests))
        recent = []
        for i, item in enumerate(f.items("recent", MAX_RECENT_SNAPSHOTS)):
            r = Fields(self.source, item, fields.join(self.path, f"{key}.recent[{i}]"))
            recent.append(
                SnapshotRecord(
                    file=r.get("file", _file_name),
                    reason=r.get("reason", one_of(SNAPSHOT_REASONS)),
                    step=r.integer("step", 0, MAX_INT, optional=True),
                    time=r.timestamp("time"),
                    bytes=r.integer("bytes", 0, MAX_INT),
                )
            )
        return SnapshotState(
            counts=counts["counts"],
            failures=counts["failures"],
            history=history,
            requests=requests,
            recent=tuple(recent),
        )

    def stuck(self, key: str) -> Stuck | None:
        """The optional ``stuck`` object: when, where (bounded text), which collective."""
        f = self.section(key)
        if f is None:
            return None
        collective = f.text("collective", 64, optional=True)
        if collective is not None and not SCALAR_NAME_RE.match(collective):
            f.fail_at("collective", "expected a function name (letters, digits and '_')")
        return Stuck(
            since=f.timestamp("since"),
            where=f.text("where", MAX_STUCK_WHERE),
            collective=collective,
            saving=f.get("saving", _boolean, default=False),
        )

    def timing(self, key: str) -> Timing | None:
        """The optional ``timing`` object: seconds waiting for data and computing, steps."""
        f = self.section(key)
        if f is None:
            return None
        return Timing(
            data_seconds=f.seconds("data_seconds"),
            compute_seconds=f.seconds("compute_seconds"),
            steps=f.integer("steps", 0, MAX_INT),
        )

    def seconds(self, key: str) -> float:
        """A finite number of seconds >= 0 (a duration or a sum of them)."""
        value = self.raw.get(key)
        if value is None:
            self.fail_at(key, "missing (or null)")
        problem = fields.number(value, 0, MAX_TIME, "seconds", kind="a number of seconds")
        if problem:
            self.fail_at(key, problem)
        return float(value)

    def deaths(self, key: str) -> tuple[Death, ...]:
        out = []
        for i, item in enumerate(self.items(key, MAX_DEATH_HISTORY)):
            f = Fields(self.source, item, fields.join(self.path, f"{key}[{i}]"))
            cause = f.get("cause", one_of(CAUSES))
            xid = f.integer("xid", 0, MAX_XID, optional=True)
            if cause == "unknown" and xid is not None:
                cause = "gpu_xid"  # how a death by a GPU error is written (see Death.to_dict)
            signal = f.signal_name("signal")
            limit = f.get("time_limit", _boolean, default=False)
            if signal is not None and cause == "exception":
                cause = "time_limit" if limit else "signal"  # as Death.to_dict writes them
            elif cause not in SIGNAL_CAUSES:
                signal = None
            out.append(
                Death(
                    step=f.integer("step", 0, MAX_INT, optional=True),
                    time=f.timestamp("time"),
                    detected=f.timestamp("detected"),
                    cause=cause,
                    xid=xid,
                    signal=signal,
                    job=f.text("job", MAX_JOB_ID, optional=True),
                )
            )
        return tuple(out)

    def signal_name(self, key: str) -> str | None:
        """An optional signal name as written (``SIGTERM``)."""

        def check(v: Any) -> str | None:
            if not isinstance(v, str) or not SIGNAL_NAME_RE.match(v):
                return "expected a signal name (SIG and up to 13 capitals or digits)"
            return None

        value: str | None = self.get(key, check, default=None)
        return value

    def exit_cause(self, key: str) -> str | None:
        """The optional ``exit_cause`` of a process that caught its ending signal."""
        value: str | None = self.get(key, one_of(SIGNAL_CAUSES), default=None)
        return value

    def job(self, key: str) -> JobInfo | None:
        """The optional ``job`` object (``trainguard.shared.jobinfo``), every field checked."""
        f = self.section(key)
        if f is None:
            return None
        job_id = f.text("id", MAX_JOB_ID)
        if not job_id:
            f.fail_at("id", "expected 1 or more characters")
        return JobInfo(
            id=job_id,
            launcher=f.get("launcher", one_of(LAUNCHERS)),
            node_rank=f.integer("node_rank", 0, MAX_JOB_INT, optional=True),
            local_rank=f.integer("local_rank", 0, MAX_JOB_INT, optional=True),
            restart_count=f.integer("restart_count", 0, MAX_JOB_INT, optional=True),
            attempt_id=f.text("attempt_id", MAX_ATTEMPT_ID, optional=True) or None,
        )


def _boolean(v: Any) -> str | None:
    return fields.boolean(v)


def _file_name(v: Any) -> str | None:
    """A plain file name (no directory part), at most 255 characters."""
    if not isinstance(v, str):
        return fields.UNTRUSTED.expected("a string", v)
    if not 1 <= len(v) <= 255 or "/" in v or "\\" in v or v in (".", ".."):
        return "expected a file name"
    return fields.text_problem(v)


def one_of(choices: tuple[str, ...]) -> Any:
    """The check of a name that must be one of choices."""

    def check(v: Any) -> str | None:
        return fields.choice(v, choices)

    return check
