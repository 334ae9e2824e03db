"""The field checks of a heartbeat's JSON document (:class:`Fields`).

They check every field's type, range and length, with the field's path
(``snapshots.recent[2].reason``) in every error. Used by
:func:`trainguard.shared.heartbeat_read.parse_heartbeat`; like it, an error never quotes a string
value from the file.
"""

from __future__ import annotations

import math
import os
from typing import Any

from trainguard.shared.gpu_uuid import normalize_gpu_uuid
from trainguard.shared.heartbeat import (
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
    kind_of,
    text_problem,
)
from trainguard.shared.jobinfo import LAUNCHERS, MAX_JOB_ID, MAX_JOB_INT, JobInfo

_MISSING = object()


class Fields:
    """Reads one JSON object, naming the field path in every error."""

    def __init__(self, source: str, where: str, data: dict[str, Any]) -> None:
        self.source = source
        self.where = where
        self.data = data

    def fail(self, key: str, message: str) -> HeartbeatError:
        return HeartbeatError(f"{self.source}: field '{self.where}{key}': {message}")

    def get(self, key: str, check: Any, *, default: Any = _MISSING) -> Any:
        value = self.data.get(key, _MISSING)
        if value is _MISSING or value is None:
            if default is not _MISSING:
                return default
            raise self.fail(key, "missing (or null)")
        problem = check(value)
        if problem:
            raise self.fail(key, problem)
        return value

    def integer(
        self, key: str, lo: int, hi: int, *, optional: bool = False, default: Any = _MISSING
    ) -> Any:
        def check(v: Any) -> str | None:
            if not isinstance(v, int) or isinstance(v, bool):
                return f"expected an integer, got {kind_of(v)}"
            if not lo <= v <= hi:
                return f"expected an integer in {lo}..{hi}, got {_short_int(v)}"
            return None

        return self.get(key, check, default=None if optional else default)

    def timestamp(self, key: str, *, optional: bool = False) -> Any:
        def check(v: Any) -> str | None:
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                return f"expected seconds since the epoch, got {kind_of(v)}"
            f = _as_float(v)
            if f is None or not (math.isfinite(f) and 0 <= f <= MAX_TIME):
                shown = _short_int(v) if isinstance(v, int) else repr(v)
                return f"expected seconds since the epoch in 0..{MAX_TIME:.0f}, got {shown}"
            return None

        value = self.get(key, check, default=None if optional else _MISSING)
        return None if value is None else float(value)

    def text(self, key: str, limit: int, *, optional: bool = False, default: Any = _MISSING) -> Any:
        def check(v: Any) -> str | None:
            if not isinstance(v, str):
                return f"expected a string, got {kind_of(v)}"
            if len(v) > limit:
                return f"expected at most {limit} characters, got {len(v)}"
            return text_problem(v)

        return self.get(key, check, default=None if optional else default)

    def path(self, key: str) -> str | None:
        value: str | None = self.text(key, MAX_PATH, optional=True)
        if value is not None and not os.path.isabs(value):
            raise self.fail(key, "expected an absolute path")
        return value

    def mapping(self, key: str, limit: int) -> dict[str, Any]:
        value = self.data.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(key, f"expected an object, got {kind_of(value)}")
        if len(value) > limit:
            raise self.fail(key, f"expected at most {limit} entries, got {len(value)}")
        return value

    def section(self, key: str) -> Fields | None:
        """The optional nested object ``key`` read as Fields of its own (None when absent).

        Its errors name the field's whole path (``stuck.where``).
        """
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise self.fail(key, f"expected an object, got {kind_of(value)}")
        return Fields(self.source, f"{self.where}{key}.", value)

    def scalars(self, key: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, v in self.mapping(key, MAX_SCALARS).items():
            if not SCALAR_NAME_RE.match(name):
                raise self.fail(key, "expected names of letters, digits and '_' (at most 64)")
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                raise self.fail(f"{key}.{name}", f"expected a number, got {kind_of(v)}")
            f = _as_float(v)
            if f is None:
                raise self.fail(f"{key}.{name}", f"number out of range: {_short_int(int(v))}")
            out[name] = f  # NaN and infinities are allowed: a NaN loss is news
        return out

    def mirrors(self, key: str) -> dict[str, str]:
        out: dict[str, str] = {}
        for name, v in self.mapping(key, MAX_MIRRORS).items():
            if name == "primary" or not MIRROR_NAME_RE.match(name):
                raise self.fail(
                    key,
                    "expected mirror names other than 'primary' (letters, "
                    "digits, _ . : -, at most 128)",
                )
            sub = Fields(self.source, f"{self.where}{key}.", {name: v})
            path = sub.path(name)
            if path is None:
                raise sub.fail(name, "expected an absolute path")
            out[name] = path
        return out

    def items(self, key: str, limit: int) -> list[dict[str, Any]]:
        value = self.data.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.fail(key, f"expected a list, got {kind_of(value)}")
        if len(value) > limit:
            raise self.fail(key, f"expected at most {limit} entries, got {len(value)}")
        for i, item in enumerate(value):
            if not isinstance(item, dict):
                raise self.fail(f"{key}[{i}]", f"expected an object, got {kind_of(item)}")
        return value

    def allocator(self, key: str) -> tuple[AllocatorStats, ...]:
        out = []
        seen: set[int] = set()
        for i, item in enumerate(self.items(key, MAX_DEVICES)):
            f = Fields(self.source, f"{self.where}{key}[{i}].", item)
            device = f.integer("device", 0, 1023)
            if device in seen:
                raise self.fail(f"{key}[{i}].device", f"device {device} listed twice")
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
            raise self.fail(key, "expected a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)")
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
                    raise f.fail(f"{name}.{reason[:32]}", "not a snapshot reason")
                if (
                    isinstance(count, bool)
                    or not isinstance(count, int)
                    or not 0 <= count <= MAX_INT
                ):
                    raise f.fail(f"{name}.{reason}", "expected an integer >= 0")
            counts[name] = table
        history = f.data.get("history")
        if history is not None and not isinstance(history, bool):
            raise f.fail("history", f"expected true, false or null, got {kind_of(history)}")
        requests = f.data.get("requests", False)
        if not isinstance(requests, bool):
            raise f.fail("requests", f"expected true or false, got {kind_of(requests)}")
        recent = []
        for i, item in enumerate(f.items("recent", MAX_RECENT_SNAPSHOTS)):
            r = Fields(self.source, f"{self.where}{key}.recent[{i}].", item)
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
            raise f.fail("collective", "expected a function name (letters, digits and '_')")
        return Stuck(
            since=f.timestamp("since"),
            where=f.text("where", MAX_STUCK_WHERE),
            collective=collective,
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

        def check(v: Any) -> str | None:
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                return f"expected a number of seconds, got {kind_of(v)}"
            f = _as_float(v)
            if f is None or not (math.isfinite(f) and 0 <= f <= MAX_TIME):
                shown = _short_int(v) if isinstance(v, int) else repr(v)
                return f"expected seconds in 0..{MAX_TIME:.0f}, got {shown}"
            return None

        return float(self.get(key, check))

    def deaths(self, key: str) -> tuple[Death, ...]:
        out = []
        for i, item in enumerate(self.items(key, MAX_DEATH_HISTORY)):
            f = Fields(self.source, f"{self.where}{key}[{i}].", item)
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
            raise f.fail("id", "expected 1 or more characters")
        return JobInfo(
            id=job_id,
            launcher=f.get("launcher", one_of(LAUNCHERS)),
            node_rank=f.integer("node_rank", 0, MAX_JOB_INT, optional=True),
            local_rank=f.integer("local_rank", 0, MAX_JOB_INT, optional=True),
            restart_count=f.integer("restart_count", 0, MAX_JOB_INT, optional=True),
        )


def _boolean(v: Any) -> str | None:
    return None if isinstance(v, bool) else f"expected true or false, got {kind_of(v)}"


def _file_name(v: Any) -> str | None:
    """A plain file name (no directory part), at most 255 characters."""
    if not isinstance(v, str):
        return f"expected a string, got {kind_of(v)}"
    if not 1 <= len(v) <= 255 or "/" in v or "\\" in v or v in (".", ".."):
        return "expected a file name"
    return text_problem(v)


def one_of(choices: tuple[str, ...]) -> Any:
    def check(v: Any) -> str | None:
        if v not in choices or not isinstance(v, str):
            return f"expected one of {', '.join(choices)}"
        return None

    return check


def _as_float(value: float) -> float | None:
    """The number as a float, None for an integer too large for one (JSON allows any size)."""
    try:
        return float(value)
    except OverflowError:
        return None


def _short_int(value: int) -> str:
    return str(value) if abs(value) < 10**30 else f"a {value.bit_length()}-bit number"
