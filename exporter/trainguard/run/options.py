"""The arguments of ``trainguard.Run`` and the torchrun environment, checked once at start so
that a mistake is a clear error in the script rather than a heartbeat the exporter refuses."""

from __future__ import annotations

import logging
import numbers
import operator
import os
from collections.abc import Callable, Mapping
from typing import Any

from trainguard.shared.heartbeat import (
    MAX_INT,
    MAX_MIRRORS,
    MAX_RANK,
    MAX_SCALARS,
    MIRROR_NAME_RE,
    SCALAR_NAME_RE,
)

log = logging.getLogger("trainguard.reporter")


def resolve_rank(rank: int | None) -> int:
    if rank is not None:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank <= MAX_RANK:
            raise ValueError(
                f"trainguard.Run: rank: expected an integer 0..{MAX_RANK}, got {rank!r}"
            )
        return rank
    for var in ("RANK", "LOCAL_RANK"):
        value = env_int(var, 0, MAX_RANK)
        if value is not None:
            return value
    return 0


def env_int(var: str, lo: int, hi: int) -> int | None:
    raw = os.environ.get(var)
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
    """The numeric scalars ``Run.step`` was given that a heartbeat can carry; the others are
    dropped and logged once each."""
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
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            warn(
                f"scalar:{key}",
                "trainguard: scalar %r ignored: expected a number, got %s (pass .item())",
                key,
                type(value).__name__,
            )
            continue
        scalars[key] = float(value)
    return scalars
