"""The exporter's optional YAML config file: parsed once at start and validated strictly, so a
typo is an error naming the file, the field and what was expected, never a silently ignored key."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trainguard.shared.pattern import DEFAULT_CHECKPOINT_PATTERN, checkpoint_pattern_problem
from trainguard.shared.steps import DEFAULT_LAYOUT, layout_problem

_DURATION_RE = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
_SIZE_RE = re.compile(r"^(\d+)\s*(B|KiB|MiB|GiB|TiB|KB|MB|GB|TB)?$")
_SIZE_UNITS = {
    None: 1,
    "B": 1,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
    "TiB": 1024**4,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "TB": 1000**4,
}
_NAME_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
#: process names of interpreters that run many unrelated programs: a run's process_match that
#: matches one keeps the run "up" while any of them runs (use pid_file or cmdline_match)
GENERIC_PROCESS_NAMES = (
    "python",
    "python3",
    "python3.11",
    "python3.12",
    "pythonw",
    "java",
    "node",
    "bash",
    "sh",
    "perl",
    "ruby",
    "julia",
)


class ConfigError(ValueError):
    """A config file that cannot be used, with the file and field it is about."""


@dataclass(frozen=True)
class CheckpointLocations:
    primary: Path | None = None
    mirrors: Mapping[str, Path] = field(default_factory=dict)
    pattern: str = DEFAULT_CHECKPOINT_PATTERN
    #: a settled file with no record (its writer is not trainguard.checkpoint) counts as
    #: complete; without this it is never complete, since its size cannot be checked
    trust_unrecorded: bool = False
    #: how step directories are committed (``auto``: told from what the location holds)
    layout: str = DEFAULT_LAYOUT


@dataclass(frozen=True)
class RunConfig:
    """A run declared in the config: for scripts that don't import trainguard, or extra
    locations for one that does (matched by name)."""

    name: str
    pid_file: Path | None = None
    process_match: re.Pattern[str] | None = None  # searched in the process name
    cmdline_match: re.Pattern[str] | None = None  # searched in the whole command line
    log_file: Path | None = None
    checkpoints: CheckpointLocations | None = None


@dataclass(frozen=True)
class ProcessCount:
    name: str
    match: re.Pattern[str]


@dataclass(frozen=True)
class CheckpointSettings:
    grace_period_seconds: float = 300.0
    verify_bytes_per_second: int = 200 * 1024**2
    size_series_per_location: int = 5


@dataclass(frozen=True)
class Config:
    source: str = "<defaults>"
    state_dir: Path | None = None
    run_retention_seconds: float = 7 * 86400.0
    runs: tuple[RunConfig, ...] = ()
    process_counts: tuple[ProcessCount, ...] = ()
    checkpoints: CheckpointSettings = field(default_factory=CheckpointSettings)
    #: valid but probably not what was meant; logged once at start
    warnings: tuple[str, ...] = ()


def parse_duration(value: Any) -> float:
    """Seconds from a number or a Prometheus-style duration such as ``90s``, ``5m``, ``1h30m``."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 300, '5m' or '24h', got a boolean")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"expected a non-negative duration, got {value}")
        return float(value)
    if isinstance(value, str):
        m = _DURATION_RE.match(value.strip())
        if m and any(m.groups()):
            d, h, mi, s = (int(g) if g else 0 for g in m.groups())
            return float(((d * 24 + h) * 60 + mi) * 60 + s)
    raise ValueError(f"expected a duration such as 300, '5m' or '24h', got {value!r}")


def parse_size(value: Any) -> int:
    """Bytes from an integer or a string such as ``200MiB``."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        m = _SIZE_RE.match(value.strip())
        if m:
            return int(m.group(1)) * _SIZE_UNITS[m.group(2)]
    raise ValueError(f"expected a size such as 209715200 or '200MiB', got {value!r}")


class _Fields:
    """Reads one mapping of the config, tracking the path of each field for error messages."""

    def __init__(self, source: str, where: str, value: Any, allowed: tuple[str, ...]) -> None:
        self.source = source
        self.where = where
        if not isinstance(value, dict):
            self.fail(where, f"expected a mapping, got {_kind(value)}")
        unknown = sorted(str(k) for k in value if k not in allowed)
        if unknown:
            self.fail(
                f"{where}.{unknown[0]}" if where else unknown[0],
                f"unknown key; expected one of: {', '.join(allowed)}",
            )
        self.value: dict[str, Any] = value

    def path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def fail(self, path: str, message: str) -> None:
        raise ConfigError(f"{self.source}: {path or '<top level>'}: {message}")

    def get(self, key: str) -> Any:
        return self.value.get(key)

    def string(self, key: str, *, required: bool = False) -> str | None:
        value = self.value.get(key)
        if value is None:
            if required:
                self.fail(self.path(key), "is required (expected a string)")
            return None
        if not isinstance(value, str) or not value:
            self.fail(self.path(key), f"expected a non-empty string, got {_kind(value)}")
        return value

    def name(self, key: str) -> str:
        value = self.string(key, required=True)
        assert value is not None
        if not _NAME_RE.match(value):
            self.fail(
                self.path(key),
                "expected 1-128 characters of letters, digits, '_', '.', ':' or '-', "
                f"got {value!r}",
            )
        return value

    def abspath(self, key: str) -> Path | None:
        value = self.string(key)
        if value is None:
            return None
        path = Path(value).expanduser()
        if not path.is_absolute():
            self.fail(self.path(key), f"expected an absolute path, got {value!r}")
        return path

    def regex(self, key: str, *, required: bool = False) -> re.Pattern[str] | None:
        value = self.string(key, required=required)
        if value is None:
            return None
        try:
            return re.compile(value)
        except re.error as exc:
            self.fail(self.path(key), f"invalid regular expression {value!r}: {exc}")
        raise AssertionError("unreachable")

    def convert(self, key: str, parse: Any, default: Any) -> Any:
        value = self.value.get(key)
        if value is None:
            return default
        try:
            return parse(value)
        except ValueError as exc:
            self.fail(self.path(key), str(exc))

    def items(self, key: str) -> list[Any]:
        value = self.value.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            self.fail(self.path(key), f"expected a list, got {_kind(value)}")
        return value


def _kind(value: Any) -> str:
    if value is None:
        return "nothing"
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), f"a {type(value).__name__}"
    )


def _checkpoints(source: str, where: str, value: Any) -> CheckpointLocations:
    f = _Fields(
        source, where, value, ("primary", "mirrors", "pattern", "trust_unrecorded", "layout")
    )
    mirrors: dict[str, Path] = {}
    raw_mirrors = f.get("mirrors")
    if raw_mirrors is not None:
        if not isinstance(raw_mirrors, dict):
            f.fail(f.path("mirrors"), f"expected a mapping of name: path, got {_kind(raw_mirrors)}")
        m = _Fields(source, f.path("mirrors"), raw_mirrors, tuple(str(k) for k in raw_mirrors))
        for key in raw_mirrors:
            name = str(key)
            if name == "primary" or not _NAME_RE.match(name):
                m.fail(
                    m.path(name),
                    "expected a mirror name other than 'primary' (letters, digits, _ . : -)",
                )
            path = m.abspath(key)
            if path is None:
                m.fail(m.path(name), "expected an absolute path")
            assert path is not None
            mirrors[name] = path
    pattern = f.string("pattern") or DEFAULT_CHECKPOINT_PATTERN
    problem = checkpoint_pattern_problem(pattern)
    if problem:
        f.fail(f.path("pattern"), problem)
    primary = f.abspath("primary")
    if primary is None and not mirrors:
        f.fail(where, "expected at least 'primary' or 'mirrors'")
    trust = f.get("trust_unrecorded")
    if trust is not None and not isinstance(trust, bool):
        f.fail(f.path("trust_unrecorded"), f"expected true or false, got {_kind(trust)}")
    layout = f.string("layout") or DEFAULT_LAYOUT
    problem = layout_problem(layout)
    if problem:
        f.fail(f.path("layout"), problem)
    return CheckpointLocations(
        primary=primary,
        mirrors=mirrors,
        pattern=pattern,
        trust_unrecorded=bool(trust),
        layout=layout,
    )


def parse_config(data: Any, source: str) -> Config:
    """Validate an already-parsed YAML document."""
    if data is None:
        return Config(source=source)
    top = _Fields(
        source,
        "",
        data,
        ("state_dir", "run_retention", "runs", "process_counts", "checkpoints"),
    )
    runs: list[RunConfig] = []
    warnings: list[str] = []
    seen_runs: set[str] = set()
    for i, item in enumerate(top.items("runs")):
        f = _Fields(
            source,
            f"runs[{i}]",
            item,
            ("name", "pid_file", "process_match", "cmdline_match", "log_file", "checkpoints"),
        )
        name = f.name("name")
        if name in seen_runs:
            f.fail(f.path("name"), f"duplicate run name {name!r}")
        seen_runs.add(name)
        pid_file = f.abspath("pid_file")
        process_match = f.regex("process_match")
        cmdline_match = f.regex("cmdline_match")
        given = [k for k, v in [("pid_file", pid_file), ("process_match", process_match)] if v]
        given += ["cmdline_match"] if cmdline_match is not None else []
        if len(given) > 1:
            f.fail(
                f.where,
                "expected one of pid_file, process_match or cmdline_match, not "
                + " and ".join(given),
            )
        if process_match is not None:
            generic = [n for n in GENERIC_PROCESS_NAMES if process_match.search(n)]
            if generic:
                warnings.append(
                    f"{source}: {f.path('process_match')}: {process_match.pattern!r} matches "
                    f"the interpreter name {generic[0]!r}: any such process on the host keeps "
                    f"run {name!r} up; identify the run with pid_file or cmdline_match"
                )
        ckpt = f.get("checkpoints")
        runs.append(
            RunConfig(
                name=name,
                pid_file=pid_file,
                process_match=process_match,
                cmdline_match=cmdline_match,
                log_file=f.abspath("log_file"),
                checkpoints=None
                if ckpt is None
                else _checkpoints(source, f.path("checkpoints"), ckpt),
            )
        )
    counts: list[ProcessCount] = []
    seen_counts: set[str] = set()
    for i, item in enumerate(top.items("process_counts")):
        f = _Fields(source, f"process_counts[{i}]", item, ("name", "match"))
        name = f.name("name")
        if name in seen_counts:
            f.fail(f.path("name"), f"duplicate process_counts name {name!r}")
        seen_counts.add(name)
        match = f.regex("match", required=True)
        assert match is not None
        counts.append(ProcessCount(name=name, match=match))
    settings = CheckpointSettings()
    raw_settings = top.get("checkpoints")
    if raw_settings is not None:
        c = _Fields(
            source,
            "checkpoints",
            raw_settings,
            ("grace_period", "verify_rate", "size_series_per_location"),
        )
        size_series = c.get("size_series_per_location")
        if size_series is not None and (
            not isinstance(size_series, int)
            or isinstance(size_series, bool)
            or not 0 <= size_series <= 1000
        ):
            c.fail(
                c.path("size_series_per_location"),
                f"expected an integer 0-1000, got {size_series!r}",
            )
        rate = c.convert("verify_rate", parse_size, settings.verify_bytes_per_second)
        if rate <= 0:
            c.fail(c.path("verify_rate"), "expected a positive rate in bytes per second")
        settings = CheckpointSettings(
            grace_period_seconds=c.convert(
                "grace_period", parse_duration, settings.grace_period_seconds
            ),
            verify_bytes_per_second=rate,
            size_series_per_location=(
                settings.size_series_per_location if size_series is None else size_series
            ),
        )
    return Config(
        source=source,
        state_dir=top.abspath("state_dir"),
        run_retention_seconds=top.convert("run_retention", parse_duration, 7 * 86400.0),
        runs=tuple(runs),
        process_counts=tuple(counts),
        checkpoints=settings,
        warnings=tuple(warnings),
    )


def load_config(path: str | Path | None) -> Config:
    """Read and validate the config file; no path means the defaults."""
    if path is None:
        return Config()
    source = str(path)
    try:
        with open(path, "rb") as fh:
            raw = fh.read(1024 * 1024 + 1)
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read config file: {exc.strerror or exc}") from exc
    if len(raw) > 1024 * 1024:
        raise ConfigError(f"{source}: config file is larger than 1 MiB")
    try:
        data = yaml.safe_load(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{source}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{source}: invalid YAML: {where}{problem}") from exc
    return parse_config(data, source)
