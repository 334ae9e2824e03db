"""The one grammar for durations and byte sizes, wherever a person writes one.

The exporter's config (``run_retention: 1w``), its flags (``--collector.timeout 8s``), the
``trainguard`` command (``--stale 30m``) and the alert thresholds (``--set stall=1w``) all read
durations and sizes through these two functions, so a value accepted in one place is accepted
in every other. Durations follow PromQL's grammar (``1h30m``, ``500ms``, units ``ms s m h d w
y`` from largest to smallest, each at most once) plus a plain number of seconds; sizes are a
plain number of bytes or a number with a binary (``GiB``) or decimal (``GB``) unit.
"""

from __future__ import annotations

import math
import re

#: seconds per PromQL duration unit
DURATION_UNITS = {
    "y": 365 * 86400.0,
    "w": 7 * 86400.0,
    "d": 86400.0,
    "h": 3600.0,
    "m": 60.0,
    "s": 1.0,
    "ms": 0.001,
}
_DURATION_PART = re.compile(r"(\d+)(ms|[smhdwy])")
_UNIT_ORDER = tuple(DURATION_UNITS)

#: bytes per size unit (case-insensitive)
SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]i?b|b)?", re.IGNORECASE)

DURATION_EXAMPLE = "300, '90s', '5m', '1h30m' or '1w'"
SIZE_EXAMPLE = "209715200, '200MiB' or '2GB'"


def parse_duration(value: object) -> float:
    """Seconds in a duration: a number of seconds or a PromQL duration string.

    Raises ValueError, saying what was expected, for anything else: a negative or non-finite
    number, a boolean, an unknown unit, units out of order (``30m1h``) or repeated.

    >>> parse_duration("1h30m"), parse_duration(90), parse_duration("1w")
    (5400.0, 90.0, 604800.0)
    """
    expected = f"expected a duration such as {DURATION_EXAMPLE}, got {value!r}"
    if isinstance(value, bool):
        raise ValueError(expected)
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value < 0:
            raise ValueError(expected)
        return float(value)
    if not isinstance(value, str):
        raise ValueError(expected)
    text = value.strip()
    try:
        number = float(text)
    except ValueError:
        pass
    else:
        if math.isfinite(number) and number >= 0:
            return number
        raise ValueError(expected)
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(expected)
    order = [_UNIT_ORDER.index(u) for _, u in parts]
    if order != sorted(set(order)):
        raise ValueError(expected + " (units from largest to smallest, each once)")
    return sum(int(n) * DURATION_UNITS[u] for n, u in parts)


def format_duration(seconds: float) -> str:
    """The shortest single-unit PromQL duration for whole seconds (``7d``, ``90m``, ``45s``).

    Weeks and years are left out: ``7d`` reads the same to everyone.

    >>> format_duration(5400), format_duration(604800)
    ('90m', '7d')
    """
    whole = int(seconds)
    if whole != seconds:
        return f"{round(seconds * 1000)}ms"
    for unit in ("d", "h", "m"):
        factor = int(DURATION_UNITS[unit])
        if whole >= factor and whole % factor == 0:
            return f"{whole // factor}{unit}"
    return f"{whole}s"


def parse_size(value: object) -> int:
    """Bytes in a size: a whole number of bytes or a number with a unit (``512MiB``, ``2GB``).

    Raises ValueError for anything else, and for a size that is not a whole number of bytes
    (``1.5``, ``0.1KiB``).

    >>> parse_size("200MiB"), parse_size(4096), parse_size("1.5KiB")
    (209715200, 4096, 1536)
    """
    expected = f"expected a size such as {SIZE_EXAMPLE}, got {value!r}"
    if isinstance(value, bool):
        raise ValueError(expected)
    if isinstance(value, int):
        if value < 0:
            raise ValueError(expected)
        return value
    if isinstance(value, float):
        if not math.isfinite(value) or value < 0:
            raise ValueError(expected)
        n = value
    elif isinstance(value, str) and (match := _SIZE.fullmatch(value.strip())):
        number, factor = match.group(1), SIZE_UNITS[(match.group(2) or "").lower()]
        if number.isdigit():
            return int(number) * factor  # exact, however large
        n = float(number) * factor
    else:
        raise ValueError(expected)
    if not n.is_integer():
        raise ValueError(f"expected a whole number of bytes, got {value!r}")
    return int(n)


def format_size(n: int) -> str:
    """The largest binary unit that divides n exactly (``2GiB``, ``512MiB``, ``1000B``)."""
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        factor = SIZE_UNITS[unit.lower()]
        if n >= factor and n % factor == 0:
            return f"{n // factor}{unit}"
    return f"{n}B"
