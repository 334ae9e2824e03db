"""The kinds of threshold value (duration, number, bytes, selector, url, xid codes, labels): how
each is written, checked, and turned into the placeholders the rule templates use. A check raises
ValueError with the reason; ``alerts/thresholds.py`` adds which threshold and kind it was."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
_BYTE_UNITS = {"": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def _plain(value: object) -> str | int | float:
    """The value as YAML or --set gives it; a bool, list, mapping or null is of no kind."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"not a scalar: {value!r}")
    return value


def parse_duration(value: object) -> int:
    """Seconds in a PromQL duration ("90m", "1h30m") or a plain number of seconds."""
    value = _plain(value)
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise ValueError(f"not a duration: {value!r}")
        seconds = int(value)
    else:
        text = value.strip()
        if text.isdigit():
            seconds = int(text)
        else:
            parts = re.findall(r"(\d+)([smhdwy])", text)
            if not parts or "".join(n + u for n, u in parts) != text:
                raise ValueError(f"not a duration: {value!r}")
            seconds = sum(int(n) * _UNITS[u] for n, u in parts)
    if seconds <= 0:
        raise ValueError(f"duration must be positive: {value!r}")
    return seconds


def format_duration(seconds: int) -> str:
    """The shortest single-unit PromQL duration for seconds (7d, 90m, 45s)."""
    for unit in ("d", "h", "m"):
        if seconds % _UNITS[unit] == 0:
            return f"{seconds // _UNITS[unit]}{unit}"
    return f"{seconds}s"


def parse_bytes(value: object) -> int:
    """Bytes in 1073741824, "1GiB", "512MiB"."""
    value = _plain(value)
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"not a byte size >= 0: {value!r}")
        return int(value)
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]iB|B)?\s*", value, re.IGNORECASE)
    if not match:
        raise ValueError(f"not a byte size: {value!r}")
    return int(float(match.group(1)) * _BYTE_UNITS[(match.group(2) or "").lower()])


def format_bytes(n: int) -> str:
    """The largest binary unit that divides n exactly (2GiB, 512MiB, 1000B)."""
    for unit, factor in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= factor and n % factor == 0:
            return f"{n // factor}{unit}"
    return f"{n}B"


def parse_number(value: object) -> float:
    """A positive finite number: every number threshold is a factor or a count."""
    value = _plain(value)
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"not a number: {value!r}") from None
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"must be a positive number: {value!r}")
    return number


def format_number(value: float) -> str:
    """3 for 3.0, 1.5 for 1.5: as PromQL reads it and as a user would write it."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


_LABEL = r'(?:[A-Za-z_][A-Za-z0-9_]*|"(?:[^"\\\n]|\\.)*")'
_STRING = r'(?:"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'|`[^`]*`)'
_MATCHER = rf"\s*{_LABEL}\s*(?:=~|!~|!=|=)\s*{_STRING}\s*"
_SELECTOR = re.compile(rf"{_MATCHER}(?:,{_MATCHER})*,?\s*")


def parse_selector(value: object) -> str:
    """PromQL label matchers without the braces, e.g. ``job=~"trainguard.*"``."""
    text = _plain(value)
    if not isinstance(text, str) or not _SELECTOR.fullmatch(text):
        raise ValueError(f"not a label selector: {value!r}")
    return text


#: a Go-template action of an annotation, e.g. ``{{ $labels.instance }}``
_TEMPLATE_ACTION = re.compile(r"\{\{[^{}]*\}\}")


def parse_url(value: object) -> str:
    """An http(s) URL without a fragment: each alert appends ``#<alertname lowercased>``. It
    may hold Go-template actions of Prometheus annotations (``http://{{ $labels.instance }}/x``),
    expanded per alert."""
    text = _plain(value)
    plain = _TEMPLATE_ACTION.sub("x", text) if isinstance(text, str) else ""
    if not isinstance(text, str) or not re.fullmatch(r"https?://[^\s/#?{}]+[^\s#{}]*", plain):
        raise ValueError(f"not an http(s) URL without #fragment: {value!r}")
    return text


#: the largest Xid code accepted; NVIDIA's catalogue ends well below it
MAX_XID = 9999


def parse_xids(value: object) -> list[int]:
    """Xid codes: "79,48,95" (or one code, or a YAML list of codes), sorted, each once."""
    items: list[object]
    if isinstance(value, list):
        items = list(value)
    elif isinstance(value, str):
        items = [part.strip() for part in value.split(",")]
    else:
        items = [_plain(value)]
    codes: set[int] = set()
    for item in items:
        if isinstance(item, bool):
            raise ValueError(f"not an Xid code: {item!r}")
        text = str(item).strip()
        if not text.isdigit() or not 0 < int(text) <= MAX_XID:
            raise ValueError(f"not an Xid code (1-{MAX_XID}): {item!r} in {value!r}")
        codes.add(int(text))
    if not codes:
        raise ValueError(f"no Xid codes in {value!r}")
    return sorted(codes)


def _xid_placeholders(value: object) -> dict[str, str]:
    codes = [str(c) for c in parse_xids(value)]
    # ${k}: a regex for PromQL's xid=~"..." (anchored by Prometheus); ${k_list}: as written
    return {"": "|".join(codes), "_list": ", ".join(codes)}


_LABEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: labels of trainguard's own series and of alerts: never a target's
OWN_LABELS = frozenset(
    {"run", "rank", "location", "step", "damage", "device", "uuid", "gpu", "xid", "pid"}
    | {"trust_unrecorded", "severity", "alertname", "__name__"}
)


def parse_labels(value: object) -> list[str]:
    """Label names, "cluster, namespace, job, instance" or a YAML list: the labels that
    identify a scrape target (kept by every aggregation and join of the rules)."""
    items: list[object]
    if isinstance(value, list):
        items = list(value)
    elif isinstance(value, str):
        items = [part.strip() for part in value.split(",")]
    else:
        raise ValueError(f"not a list of label names: {value!r}")
    names: list[str] = []
    for item in items:
        if not isinstance(item, str) or not _LABEL_NAME.fullmatch(item):
            raise ValueError(f"not a label name: {item!r} in {value!r}")
        if item in OWN_LABELS:
            raise ValueError(f"{item!r} is a label of trainguard's own series, not a target's")
        if item in names:
            raise ValueError(f"{item!r} given twice in {value!r}")
        names.append(item)
    missing = [name for name in ("job", "instance") if name not in names]
    if missing:
        raise ValueError(f"must include job and instance (the exporter's target): {missing}")
    return names


def _labels_placeholders(value: object) -> dict[str, str]:
    names = parse_labels(value)
    # ${k}: for by (...) and on (...); ${k_sel}, ${k_args}: a printf selector of an annotation
    # query and its arguments (a label the alert lacks is "" there: it matches the same absence)
    return {
        "": ", ".join(names),
        "_sel": ",".join(name + "=%q" for name in names),
        "_args": " ".join("$labels." + name for name in names),
    }


@dataclass(frozen=True)
class Kind:
    """How a threshold's value is written, checked and turned into placeholders."""

    name: str
    hint: str
    """Examples of good values, for error messages."""
    placeholders: Callable[[object], dict[str, str]]
    """Placeholder suffix ("" for the threshold's own name) to text; raises ValueError."""
    shown: str = ""
    """The suffix whose text the rules file header and ``--list`` show."""


def _duration_placeholders(value: object) -> dict[str, str]:
    seconds = parse_duration(value)
    # Keep a duration the user wrote as text ("24h"), format plain seconds ("86400").
    text = value.strip() if isinstance(value, str) else ""
    return {
        "": text if text and not text.isdigit() else format_duration(seconds),
        "_s": str(seconds),
    }


def _bytes_placeholders(value: object) -> dict[str, str]:
    n = parse_bytes(value)
    return {"": str(n), "_h": format_bytes(n)}


DURATION = Kind("duration", "30m, 6h, 7d, or seconds such as 1800", _duration_placeholders)
NUMBER = Kind("number", "3 or 1.5", lambda v: {"": format_number(parse_number(v))})
BYTES = Kind("bytes", "2GiB, 512MiB or 1073741824", _bytes_placeholders, "_h")
SELECTOR = Kind(
    "selector", 'job=~"trainguard.*" or job="gpu",env="prod"', lambda v: {"": parse_selector(v)}
)
URL = Kind(
    "url",
    "https://wiki.example.com/trainguard/runbook or http://{{ $labels.instance }}/runbook",
    lambda v: {"": parse_url(v)},
)
XIDS = Kind("xid codes", "79,48,95 (comma-separated Xid codes)", _xid_placeholders, "_list")
LABELS = Kind("labels", "cluster, namespace, job, instance", _labels_placeholders)
KINDS = (DURATION, NUMBER, BYTES, SELECTOR, URL, XIDS, LABELS)
