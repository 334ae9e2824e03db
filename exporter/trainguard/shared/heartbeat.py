"""Heartbeat files: how a training process (``trainguard.Run``) tells the exporter what it is
doing, and what the exporter still knows after that process is gone.

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

import contextlib
import errno
import hashlib
import json
import math
import os
import re
import secrets
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
CAUSES = ("reboot", "oom_killer", "exception", "unknown")

SCALAR_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
# same rule as mirror names in the config file
MIRROR_NAME_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
_UNSAFE_FILE_CHARS = re.compile(r"[^A-Za-z0-9_-]+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


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


@dataclass(frozen=True)
class Death:
    """A previous process of this run and rank that went away without finishing."""

    step: int | None  # last step it reported (None: died before its first step)
    time: float  # its last heartbeat: the latest moment it is known to have been alive
    detected: float  # when the restarted run found it dead
    cause: str  # one of CAUSES


@dataclass(frozen=True)
class Heartbeat:
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
    scalars: Mapping[str, float] = field(default_factory=dict)
    world_size: int | None = None
    boot_id: str | None = None
    boot_time: float | None = None
    pid_ns: int | None = None  # inode of /proc/self/ns/pid: pids only compare within one
    checkpoint_dir: str | None = None
    mirrors: Mapping[str, str] = field(default_factory=dict)
    log_file: str | None = None
    allocator: tuple[AllocatorStats, ...] = ()
    memory_snapshots: int = 0
    deaths: int = 0
    death_history: tuple[Death, ...] = ()
    version: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON document, ``format`` first."""
        return {
            "format": FORMAT,
            "run": self.run,
            "rank": self.rank,
            "pid": self.pid,
            "create_time": self.create_time,
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
            "mirrors": dict(self.mirrors),
            "log_file": self.log_file,
            "allocator": [vars(a).copy() for a in self.allocator],
            "memory_snapshots": self.memory_snapshots,
            "deaths": self.deaths,
            "death_history": [vars(d).copy() for d in self.death_history],
            "version": self.version,
        }

    @property
    def filename(self) -> str:
        return heartbeat_filename(self.run, self.rank)


def check_run_name(name: object) -> str | None:
    """Why ``name`` cannot be a run name, or None when it can. Anything printable up to 128
    characters: the name goes into a label value and log lines, never into a path."""
    if not isinstance(name, str):
        return f"expected a string, got {_kind(name)}"
    if not 1 <= len(name) <= MAX_RUN_NAME:
        return f"expected 1-{MAX_RUN_NAME} characters, got {len(name)}"
    return _text_problem(name)


def heartbeat_filename(run: str, rank: int) -> str:
    """``<sanitized>-<sha8>.rank<N>.heartbeat.json``: the readable part is only a hint (run
    names may hold '/', '..' or anything else); the hash of the real name keeps names that
    sanitize alike apart. The real name is stored inside the file."""
    safe = _UNSAFE_FILE_CHARS.sub("_", run)[:48].strip("_") or "run"
    digest = hashlib.sha256(run.encode("utf-8")).hexdigest()[:8]
    return f"{safe}-{digest}.rank{rank}{SUFFIX}"


def write_heartbeat(path: str | os.PathLike[str], data: Heartbeat | Mapping[str, Any]) -> None:
    """Replace ``path`` atomically: a temp file in the same directory (created exclusively,
    so a planted symlink is never followed), written, fsynced, then ``os.replace``d. The
    directory is not fsynced: losing the newest heartbeat in a power cut leaves the previous
    one, which is all a reader needs."""
    doc = data.to_dict() if isinstance(data, Heartbeat) else dict(data)
    payload = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _flag("O_CLOEXEC") | _flag("O_BINARY")
    fd = os.open(tmp, flags, 0o644)
    try:
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_heartbeat(path: str | os.PathLike[str], *, check_name: bool = True) -> Heartbeat:
    """Read and validate one heartbeat file that anyone may have written. Raises only
    :class:`HeartbeatError`. With ``check_name`` the file name must be the one the run and
    rank inside it would get, so a copied or renamed file cannot pose as another run."""
    source = os.fspath(path)
    hb = parse_heartbeat_bytes(_read_bounded(source), source)
    if check_name:
        expected = heartbeat_filename(hb.run, hb.rank)
        if os.path.basename(source) != expected:
            raise HeartbeatError(
                f"{source}: file name does not match the run and rank inside it (expected "
                f"{expected}); a copied or renamed heartbeat is not trusted"
            )
    return hb


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise _DuplicateKey
    return out


def parse_heartbeat_bytes(raw: bytes, source: str = "<heartbeat>") -> Heartbeat:
    """Decode and validate the bytes of a heartbeat file; raises only :class:`HeartbeatError`.
    A key given twice in one object is refused: which of the two a reader takes differs
    between JSON parsers, so such a file can mean two things."""
    if len(raw) > MAX_BYTES:
        raise HeartbeatError(f"{source}: {len(raw)} bytes, larger than the 1 MiB limit; refused")
    if not raw:
        raise HeartbeatError(f"{source}: empty file (truncated or not a heartbeat)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HeartbeatError(f"{source}: not UTF-8 text (bad byte at offset {exc.start})") from None
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as exc:
        raise HeartbeatError(
            f"{source}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
            " (truncated or not a heartbeat)"
        ) from None
    except _DuplicateKey:
        raise HeartbeatError(
            f"{source}: not usable JSON: a key appears twice in one object"
        ) from None
    except (RecursionError, ValueError) as exc:  # nesting too deep, ints too long
        raise HeartbeatError(f"{source}: not usable JSON: {type(exc).__name__}") from None
    return parse_heartbeat(data, source)


def _read_bounded(source: str) -> bytes:
    nofollow = _flag("O_NOFOLLOW")
    if not nofollow:  # no O_NOFOLLOW (Windows): check first; the race is the best we can do
        try:
            if stat.S_ISLNK(os.lstat(source).st_mode):
                raise HeartbeatError(f"{source}: is a symbolic link; refused")
        except OSError as exc:
            raise HeartbeatError(f"{source}: cannot open: {exc.strerror or exc}") from None
    # O_NONBLOCK: opening a FIFO planted in the state dir must not hang the scrape
    flags = os.O_RDONLY | nofollow | _flag("O_NONBLOCK") | _flag("O_CLOEXEC") | _flag("O_BINARY")
    try:
        fd = os.open(source, flags)
    except OSError as exc:
        if nofollow and exc.errno in (errno.ELOOP, errno.EMLINK):
            raise HeartbeatError(f"{source}: is a symbolic link; refused") from None
        raise HeartbeatError(f"{source}: cannot open: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise HeartbeatError(f"{source}: not a regular file; refused")
        if st.st_size > MAX_BYTES:
            raise HeartbeatError(
                f"{source}: {st.st_size} bytes, larger than the 1 MiB limit; refused"
            )
        chunks: list[bytes] = []
        total = 0
        while total <= MAX_BYTES:
            chunk = os.read(fd, MAX_BYTES + 1 - total)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > MAX_BYTES:  # grew while being read
            raise HeartbeatError(f"{source}: larger than the 1 MiB limit; refused")
        if total == 0:
            raise HeartbeatError(f"{source}: empty file (truncated or not a heartbeat)")
        return b"".join(chunks)
    except OSError as exc:
        raise HeartbeatError(f"{source}: cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def parse_heartbeat(data: Any, source: str = "<heartbeat>") -> Heartbeat:
    """Validate an already-decoded JSON document; raises only :class:`HeartbeatError`."""
    if not isinstance(data, dict):
        raise HeartbeatError(f"{source}: expected a JSON object, got {_kind(data)}")
    if "format" not in data:
        raise HeartbeatError(f"{source}: not a trainguard heartbeat (no 'format' field)")
    fmt = data["format"]
    if fmt != FORMAT or isinstance(fmt, bool):
        shown = fmt if isinstance(fmt, int) and not isinstance(fmt, bool) else _kind(fmt)
        raise HeartbeatError(
            f"{source}: field 'format': unsupported heartbeat format {shown} (this trainguard "
            f"reads format {FORMAT})"
        )
    f = _Fields(source, "", data)
    run = f.get("run", check_run_name)
    rank = f.integer("rank", 0, MAX_RANK)
    state = f.get("state", _one_of(STATES), default="running")
    return Heartbeat(
        run=run,
        rank=rank,
        pid=f.integer("pid", 1, MAX_PID),
        create_time=f.timestamp("create_time"),
        host=f.text("host", 255, default=""),
        started=f.timestamp("started"),
        time=f.timestamp("time"),
        state=state,
        error=f.text("error", 200, optional=True),
        step=f.integer("step", 0, MAX_INT, optional=True),
        step_time=f.timestamp("step_time", optional=True),
        scalars=f.scalars("scalars"),
        world_size=f.integer("world_size", 1, MAX_RANK + 1, optional=True),
        boot_id=f.text("boot_id", 64, optional=True),
        boot_time=f.timestamp("boot_time", optional=True),
        pid_ns=f.integer("pid_ns", 0, 2**64 - 1, optional=True),
        checkpoint_dir=f.path("checkpoint_dir"),
        mirrors=f.mirrors("mirrors"),
        log_file=f.path("log_file"),
        allocator=f.allocator("allocator"),
        memory_snapshots=f.integer("memory_snapshots", 0, MAX_INT, default=0),
        deaths=f.integer("deaths", 0, MAX_INT, default=0),
        death_history=f.deaths("death_history"),
        version=f.text("version", 64, optional=True),
    )


_MISSING = object()


class _Fields:
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
                return f"expected an integer, got {_kind(v)}"
            if not lo <= v <= hi:
                return f"expected an integer in {lo}..{hi}, got {_short_int(v)}"
            return None

        return self.get(key, check, default=None if optional else default)

    def timestamp(self, key: str, *, optional: bool = False) -> Any:
        def check(v: Any) -> str | None:
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                return f"expected seconds since the epoch, got {_kind(v)}"
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
                return f"expected a string, got {_kind(v)}"
            if len(v) > limit:
                return f"expected at most {limit} characters, got {len(v)}"
            return _text_problem(v)

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
            raise self.fail(key, f"expected an object, got {_kind(value)}")
        if len(value) > limit:
            raise self.fail(key, f"expected at most {limit} entries, got {len(value)}")
        return value

    def scalars(self, key: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, v in self.mapping(key, MAX_SCALARS).items():
            if not SCALAR_NAME_RE.match(name):
                raise self.fail(key, "expected names of letters, digits and '_' (at most 64)")
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                raise self.fail(f"{key}.{name}", f"expected a number, got {_kind(v)}")
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
            sub = _Fields(self.source, f"{self.where}{key}.", {name: v})
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
            raise self.fail(key, f"expected a list, got {_kind(value)}")
        if len(value) > limit:
            raise self.fail(key, f"expected at most {limit} entries, got {len(value)}")
        for i, item in enumerate(value):
            if not isinstance(item, dict):
                raise self.fail(f"{key}[{i}]", f"expected an object, got {_kind(item)}")
        return value

    def allocator(self, key: str) -> tuple[AllocatorStats, ...]:
        out = []
        seen: set[int] = set()
        for i, item in enumerate(self.items(key, MAX_DEVICES)):
            f = _Fields(self.source, f"{self.where}{key}[{i}].", item)
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
                )
            )
        return tuple(out)

    def deaths(self, key: str) -> tuple[Death, ...]:
        out = []
        for i, item in enumerate(self.items(key, MAX_DEATH_HISTORY)):
            f = _Fields(self.source, f"{self.where}{key}[{i}].", item)
            out.append(
                Death(
                    step=f.integer("step", 0, MAX_INT, optional=True),
                    time=f.timestamp("time"),
                    detected=f.timestamp("detected"),
                    cause=f.get("cause", _one_of(CAUSES)),
                )
            )
        return tuple(out)


def _one_of(choices: tuple[str, ...]) -> Any:
    def check(v: Any) -> str | None:
        if v not in choices or not isinstance(v, str):
            return f"expected one of {', '.join(choices)}"
        return None

    return check


def _text_problem(value: str) -> str | None:
    if _CONTROL.search(value):
        return "contains control characters"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "contains an unpaired surrogate (not encodable as UTF-8)"
    return None


def _as_float(value: float) -> float | None:
    """The number as a float, None for an integer too large for one (JSON allows any size)."""
    try:
        return float(value)
    except OverflowError:
        return None


def _short_int(value: int) -> str:
    return str(value) if abs(value) < 10**30 else f"a {value.bit_length()}-bit number"


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {
        dict: "an object",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "an integer",
        float: "a number",
    }.get(type(value), f"a {type(value).__name__}")


def _flag(name: str) -> int:
    return int(getattr(os, name, 0))
