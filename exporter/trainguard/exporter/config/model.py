"""The exporter's optional YAML config file, parsed once at start and validated strictly.

Strictly: a typo is an error naming the file, the line, the field and what was expected, never a
silently ignored key.

The dataclasses below are the schema (:mod:`trainguard.exporter.config.schema`): each field a file
may set names its YAML key, converter and meaning in its metadata. Durations and sizes follow the
one grammar of :mod:`trainguard.shared.units` (``run_retention: 1w``, ``verify_rate: 200MiB``).
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.exporter.config import schema
from trainguard.exporter.config.schema import FieldError, key
from trainguard.exporter.config.yamlfile import ConfigError, load_yaml
from trainguard.shared.pattern import DEFAULT_CHECKPOINT_PATTERN, checkpoint_pattern_problem
from trainguard.shared.statedir import STATE_DIR_ENV, default_state_dir
from trainguard.shared.steps import DEFAULT_LAYOUT, layout_problem

__all__ = [
    "GENERIC_PROCESS_NAMES",
    "CheckpointLocations",
    "CheckpointSettings",
    "Config",
    "ConfigError",
    "ProcessCount",
    "RunConfig",
    "load_config",
    "parse_config",
]

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


def _mirror_name(name: Any) -> str | None:
    if name == "primary" or schema.plain_name(name):
        return "expected a mirror name other than 'primary' (letters, digits, _ . : -)"
    return None


def default_cache_file() -> Path:
    r"""``$XDG_CACHE_HOME/trainguard/verified-checkpoints.json``, else under ``~/.cache``.

    ``%LOCALAPPDATA%\trainguard\cache`` on Windows.
    """
    name = "verified-checkpoints.json"
    if sys.platform == "win32" and os.environ.get("LOCALAPPDATA"):
        return Path(os.environ["LOCALAPPDATA"]) / "trainguard" / "cache" / name
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "trainguard" / name


@dataclass(frozen=True)
class CheckpointLocations:
    """Where a run's checkpoints are written: a primary directory and/or named mirrors."""

    primary: Path | None = field(
        default=None, metadata=key(schema.abspath, "the directory the run saves to")
    )
    mirrors: Mapping[str, Path] = field(
        default_factory=dict,
        metadata=key(
            schema.mapping_of(_mirror_name, schema.abspath, "a mapping of name: path"),
            "copies of the primary, by name",
        ),
    )
    pattern: str = field(
        default=DEFAULT_CHECKPOINT_PATTERN,
        metadata=key(
            schema.checked(schema.string, checkpoint_pattern_problem),
            "checkpoint name pattern: {step} the integer step, {name} any other value, * any text",
        ),
    )
    #: a settled file with no record (its writer is not trainguard.checkpoint) counts as
    #: complete; without this it is never complete, since its size cannot be checked
    trust_unrecorded: bool = field(
        default=False, metadata=key(schema.boolean, "count a settled unrecorded file complete")
    )
    #: how step directories are committed (``auto``: told from what the location holds)
    layout: str = field(
        default=DEFAULT_LAYOUT,
        metadata=key(schema.checked(schema.string, layout_problem), "how steps are committed"),
    )

    def __post_init__(self) -> None:
        if self.primary is None and not self.mirrors:
            raise FieldError("expected at least 'primary' or 'mirrors'")


@dataclass(frozen=True)
class RunConfig:
    """A run declared in the config.

    It serves scripts that don't import trainguard, or adds extra locations for one that does
    (matched by name).
    """

    name: str = field(metadata=key(schema.name, "the run's name"))
    pid_file: Path | None = field(
        default=None, metadata=key(schema.abspath, "a file holding the run's pid")
    )
    process_match: re.Pattern[str] | None = field(
        default=None, metadata=key(schema.regex, "a regex searched in the process name")
    )
    cmdline_match: re.Pattern[str] | None = field(
        default=None, metadata=key(schema.regex, "a regex searched in the whole command line")
    )
    log_file: Path | None = field(
        default=None, metadata=key(schema.abspath, "the run's log, for its age")
    )
    checkpoints: CheckpointLocations | None = field(
        default=None,
        metadata=key(schema.section(CheckpointLocations), "the run's checkpoint locations"),
    )

    def __post_init__(self) -> None:
        ways = ("pid_file", "process_match", "cmdline_match")
        given = [k for k in ways if getattr(self, k) is not None]
        if len(given) > 1:
            raise FieldError(
                "expected one of pid_file, process_match or cmdline_match, not "
                + " and ".join(given)
            )


@dataclass(frozen=True)
class ProcessCount:
    """Host processes whose name matches, counted (``trainguard_process_count``)."""

    name: str = field(metadata=key(schema.name, "the name label of the count"))
    match: re.Pattern[str] = field(metadata=key(schema.regex, "a regex on the process name"))


def _path_or_off(value: schema.Value) -> Path | None:
    """An absolute path, or ``off`` (YAML reads a bare ``off`` as false) for none."""
    return None if value.raw is False or value.raw == "off" else schema.abspath(value)


def _positive_rate(rate: int) -> str | None:
    return None if rate > 0 else "expected a positive rate in bytes per second"


@dataclass(frozen=True)
class CheckpointSettings:
    """How checkpoints are judged and verified, for every location."""

    grace_period_seconds: float = field(
        default=300.0,
        metadata=key(
            schema.duration, "a file touched this recently is still written", name="grace_period"
        ),
    )
    verify_bytes_per_second: int = field(
        default=200 * 1024**2,
        metadata=key(
            schema.checked(schema.size, _positive_rate),
            "bytes per second the background hash check may read",
            name="verify_rate",
        ),
    )
    size_series_per_location: int = field(
        default=5,
        metadata=key(schema.integer(0, 1000), "newest checkpoints with size series"),
    )
    verify_cache: Path | None = field(
        default_factory=default_cache_file,
        metadata=key(
            _path_or_off, "where the hash verdicts outlive an exporter restart ('off': nowhere)"
        ),
    )


@dataclass(frozen=True)
class Config:
    """The whole config file; ``Config()`` is the exporter without one."""

    source: str = "<defaults>"
    state_dir: Path | None = field(
        default=None, metadata=key(schema.abspath, "where trainguard.Run writes heartbeats")
    )
    run_retention_seconds: float = field(
        default=7 * 86400.0,
        metadata=key(
            schema.duration, "publish a dead or finished run this long", name="run_retention"
        ),
    )
    runs: tuple[RunConfig, ...] = field(
        default=(),
        metadata=key(schema.list_of(schema.section(RunConfig), unique="name"), "declared runs"),
    )
    process_counts: tuple[ProcessCount, ...] = field(
        default=(),
        metadata=key(
            schema.list_of(schema.section(ProcessCount), unique="name"), "process name counts"
        ),
    )
    checkpoints: CheckpointSettings = field(
        default_factory=CheckpointSettings,
        metadata=key(schema.section(CheckpointSettings), "checkpoint settings"),
    )
    #: valid but probably not what was meant; logged once at start
    warnings: tuple[str, ...] = ()


def _warnings(config: Config) -> tuple[str, ...]:
    """Warnings for each run whose process_match any interpreter matches.

    Such a match is valid, but it keeps the run up while any Python (or Java, ...) process runs
    on the host.
    """
    out = []
    for i, run in enumerate(config.runs):
        if run.process_match is None:
            continue
        generic = [n for n in GENERIC_PROCESS_NAMES if run.process_match.search(n)]
        if generic:
            out.append(
                f"{config.source}: runs[{i}].process_match: {run.process_match.pattern!r} matches "
                f"the interpreter name {generic[0]!r}: any such process on the host keeps "
                f"run {run.name!r} up; identify the run with pid_file or cmdline_match"
            )
    return tuple(out)


def parse_config(data: Any, source: str) -> Config:
    """Validate an already-parsed YAML document (from :func:`load_config`, or a plain dict)."""
    config = schema.read(Config, schema.Value.root(data, source), source=source)
    return dataclasses.replace(config, warnings=_warnings(config))


def load_config(path: str | Path | None) -> Config:
    """Read and validate the config file; no path means the defaults."""
    if path is None:
        return Config()
    return parse_config(load_yaml(path, "config file"), str(path))


def resolve_state_dir(flag: str | None, config: Config) -> Path:
    """The flag, then ``$TRAINGUARD_STATE_DIR``, then the config file, then the per-user default."""
    if flag:
        return Path(flag).expanduser()
    if os.environ.get(STATE_DIR_ENV) or config.state_dir is None:
        return default_state_dir()
    return config.state_dir
