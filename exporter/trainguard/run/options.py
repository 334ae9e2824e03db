"""The arguments of ``trainguard.Run`` and the torchrun environment, checked once at start.

The arguments include its memory snapshot schedule and experiment configuration. They are
checked at start so that a mistake is a clear error in the script rather than a heartbeat the
exporter refuses.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import numbers
import operator
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from trainguard.shared.heartbeat.record import (
    MAX_INT,
    MAX_MIRRORS,
    MAX_RANK,
    MAX_SCALARS,
    MIRROR_NAME_RE,
    SCALAR_NAME_RE,
    check_run_name,
)
from trainguard.shared.pattern import checkpoint_pattern_problem
from trainguard.shared.steps import layout_problem

log = logging.getLogger("trainguard.reporter")


#: a rank's place in the whole job, in order of preference: torchrun's (or the user's own),
#: Slurm's, Open MPI's, MPICH/Intel MPI's (PMI); see trainguard.run.job
RANK_VARS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
WORLD_VARS = ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


def resolve_rank(rank: int | None) -> int:
    """``Run``'s rank: the argument, else the launcher's global rank, else $LOCAL_RANK, else 0."""
    if rank is not None:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank <= MAX_RANK:
            raise ValueError(
                f"trainguard.Run: rank: expected an integer 0..{MAX_RANK}, got {rank!r}"
            )
        return rank
    for var in (*RANK_VARS, "LOCAL_RANK"):
        value = env_int(var, 0, MAX_RANK)
        if value is not None:
            return value
    return 0


def env_int(var: str, lo: int, hi: int, env: Mapping[str, str] | None = None) -> int | None:
    """``$var`` (of ``env``, default the process's environment) as an int in lo..hi, else None.

    A value that is set but out of range or not a number is logged and ignored.
    """
    raw = (os.environ if env is None else env).get(var)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        value = lo - 1
    if not lo <= value <= hi:
        log.warning(
            "trainguard: ignoring $%s=%r (expected an integer %d..%d)", var, raw[:32], lo, hi
        )
        return None
    return value


def abspath(path: str | os.PathLike[str] | None) -> str | None:
    if path is None:
        return None
    text = os.path.abspath(os.path.expanduser(os.fspath(path)))
    if len(text) > 4096 or "\x00" in text:
        raise ValueError(f"trainguard.Run: path too long or contains NUL: {text[:80]!r}...")
    return text


def mirror_dirs(mirrors: Mapping[str, str | os.PathLike[str]] | None) -> dict[str, str]:
    if not mirrors:
        return {}
    if len(mirrors) > MAX_MIRRORS:
        raise ValueError(f"trainguard.Run: mirrors: at most {MAX_MIRRORS}")
    out = {}
    for name, path in mirrors.items():
        if name == "primary" or not isinstance(name, str) or not MIRROR_NAME_RE.match(name):
            raise ValueError(
                f"trainguard.Run: mirrors: name {name!r}: expected 1-128 letters, digits, "
                "'_', '.', ':' or '-', other than 'primary'"
            )
        text = abspath(path)
        assert text is not None
        out[name] = text
    return out


def type_name(exc_type: type[BaseException]) -> str:
    name = getattr(exc_type, "__name__", "Exception")
    return "".join(ch for ch in str(name) if ch.isprintable())[:200] or "Exception"


def checked_step(raw: Any, warn: Callable[..., None]) -> int | None:
    """The step ``Run.step`` was given as an int 0..2**63-1, else None (logged once)."""
    try:
        step = operator.index(raw)
        if not 0 <= step <= MAX_INT:
            raise ValueError
        return step
    except (TypeError, ValueError):
        warn(
            "step",
            "trainguard: step must be an integer 0..2**63-1, got %s; ignored",
            type(raw).__name__,
        )
        return None


def checked_scalars(raw: Mapping[str, Any], warn: Callable[..., None]) -> dict[str, float]:
    """The numeric scalars ``Run.step`` was given that a heartbeat can carry.

    The others are dropped and logged once each.
    """
    scalars: dict[str, float] = {}
    for key, value in raw.items():
        if len(scalars) >= MAX_SCALARS:
            warn("scalars", "trainguard: only %d scalars are kept", MAX_SCALARS)
            break
        if not SCALAR_NAME_RE.match(key):
            warn(
                f"scalar-name:{key[:64]}",
                "trainguard: scalar name %r ignored (letters, digits and _, at most 64)",
                key[:64],
            )
            continue
        if not isinstance(value, bool) and not isinstance(value, numbers.Real):
            value = _tensor_value(value)
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            warn(
                f"scalar:{key}",
                "trainguard: scalar %r ignored: expected a number or a one-element tensor, got %s",
                key,
                type(value).__name__,
            )
            continue
        scalars[key] = float(value)
    return scalars


def _tensor_value(value: Any) -> Any:
    """A one-element tensor's number, read here (the reporter's thread), else ``value``.

    ``run.step(i, loss=loss)`` with the loss tensor itself costs the training loop nothing:
    reading it (``.item()``, which waits for the GPU to have computed it) happens on the
    reporter's thread, once a second, never on the training thread. Duck-typed, so torch is
    never imported for it.
    """
    numel = getattr(value, "numel", None)
    item = getattr(value, "item", None)
    if not callable(numel) or not callable(item):
        return value
    try:
        if numel() != 1:
            return value
        number = item()
    except Exception:  # a freed or broken tensor: dropped and logged like any bad value
        return value
    return number if isinstance(number, numbers.Real) else value


#: the experiment configuration kept with each snapshot, as JSON, at most this long
MAX_CONFIG_BYTES = 64 * 1024
#: periodic memory snapshots kept at most
MAX_KEEP = 100


@dataclass(frozen=True)
class Schedule:
    """When the reporter takes a periodic snapshot, and how many it keeps."""

    every_steps: int | None = None
    every_seconds: float | None = None
    keep: int = 2


def check_schedule(steps: object, seconds: object, keep: object, enabled: bool) -> Schedule:
    """``Run``'s snapshot arguments, checked: a clear error in the script, not at step 10000."""
    if steps is not None and (
        isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= 2**62
    ):
        raise ValueError(f"trainguard.Run: snapshot_steps: expected an integer >= 1, got {steps!r}")
    if seconds is not None and (
        isinstance(seconds, bool)
        or not isinstance(seconds, (int, float))
        or not 1 <= seconds <= 30 * 86400
    ):
        raise ValueError(
            f"trainguard.Run: snapshot_seconds: expected seconds from 1 to 30 days, got {seconds!r}"
        )
    if isinstance(keep, bool) or not isinstance(keep, int) or not 1 <= keep <= MAX_KEEP:
        raise ValueError(f"trainguard.Run: snapshot_keep: expected 1..{MAX_KEEP}, got {keep!r}")
    if (steps is not None or seconds is not None) and not enabled:
        raise ValueError(
            "trainguard.Run: snapshot_steps/snapshot_seconds need oom_snapshots=True (which "
            "records the allocation history the snapshots show)"
        )
    return Schedule(steps, None if seconds is None else float(seconds), keep)


def check_config(config: object) -> Any:
    """The experiment configuration as plain JSON data.

    It may be given as a mapping, an ``argparse.Namespace`` or a dataclass instance; values JSON
    cannot hold become their ``str()``.
    """
    if config is None:
        return None
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        data: Any = dataclasses.asdict(config)
    elif isinstance(config, Mapping):
        data = dict(config)
    elif _is_namespace(config):
        data = vars(config)
    else:
        raise ValueError(
            "trainguard.Run: config: expected a mapping, an argparse.Namespace or a dataclass, "
            f"got {type(config).__name__}"
        )
    try:
        text = json.dumps(data, default=str, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"trainguard.Run: config: not JSON-serialisable: {exc}") from None
    if len(text.encode("utf-8")) > MAX_CONFIG_BYTES:
        raise ValueError(f"trainguard.Run: config: larger than {MAX_CONFIG_BYTES} bytes as JSON")
    return json.loads(text)


def _is_namespace(value: object) -> bool:
    import argparse  # only for a config that may be one: most scripts imported it already

    return isinstance(value, argparse.Namespace)


def check_naming(name: str, pattern: str | None, layout: str | None) -> None:
    """The run's name, and its checkpoints' pattern and layout where given."""
    problems = {
        "name": check_run_name(name),
        "checkpoint_pattern": None if pattern is None else checkpoint_pattern_problem(pattern),
        "checkpoint_layout": None if layout is None else layout_problem(layout),
    }
    for label, problem in problems.items():
        if problem:
            raise ValueError(f"trainguard.Run: {label}: {problem}")


def check_seconds(label: str, value: object) -> None:
    """A period of ``Run`` (``interval``, ``keepalive``, ``close_timeout``): 0 < seconds < 1 day."""
    if not isinstance(value, (int, float)) or not 0 < value < 86400:
        raise ValueError(f"trainguard.Run: {label}: expected seconds > 0, got {value!r}")
