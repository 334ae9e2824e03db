"""The kinds of threshold value: how each is written, checked, and turned into placeholders.

The kinds are duration, number, bytes, selector, url, xid codes and labels; the placeholders are
the ones the rule templates use. A check raises ValueError with the reason;
``alerts/site.py`` adds which threshold and kind it was.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from trainguard.shared import units


def _plain(value: object) -> str | int | float:
    """The value as YAML or --set gives it; a bool, list, mapping or null is of no kind."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"not a scalar: {value!r}")
    return value


def parse_duration(value: object) -> int:
    """Parse a duration threshold into whole, positive seconds.

    The duration is in the one grammar (``90m``, ``1h30m``, ``1w``, a number of seconds;
    :func:`trainguard.shared.units.parse_duration`). Whole seconds, because a rule compares
    ages in whole seconds; positive, because a zero threshold would make an alert fire at once
    or never.
    """
    seconds = units.parse_duration(_plain(value))
    if seconds <= 0:
        raise ValueError(f"duration must be positive: {value!r}")
    if not seconds.is_integer():
        raise ValueError(f"duration must be whole seconds: {value!r}")
    return int(seconds)


def format_duration(seconds: int) -> str:
    """The shortest single-unit PromQL duration for seconds (7d, 90m, 45s)."""
    return units.format_duration(seconds)


def parse_bytes(value: object) -> int:
    """Bytes in 1073741824, "1GiB", "512MiB" (:func:`trainguard.shared.units.parse_size`)."""
    return units.parse_size(_plain(value))


def format_bytes(n: int) -> str:
    """The largest binary unit that divides n exactly (2GiB, 512MiB, 1000B)."""
    return units.format_size(n)


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
    """Check an http(s) URL without a fragment: each alert appends ``#<alertname lowercased>``.

    It may hold Go-template actions of Prometheus annotations
    (``http://{{ $labels.instance }}/x``), expanded per alert.
    """
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
    """Parse label names, "cluster, namespace, job, instance" or a YAML list.

    They are the labels that identify a scrape target (kept by every aggregation and join of the
    rules).
    """
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
    # ${k_across...}: the same without instance, for rules that judge a job across its nodes
    across = [name for name in names if name != "instance"]
    return {
        "": ", ".join(names),
        "_sel": ",".join(name + "=%q" for name in names),
        "_args": " ".join("$labels." + name for name in names),
        "_across": ", ".join(across),
        "_across_sel": ",".join(name + "=%q" for name in across),
        "_across_args": " ".join("$labels." + name for name in across),
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
    # Keep a duration the user wrote with units ("24h"), format plain seconds ("86400", 1.5e3).
    text = value.strip() if isinstance(value, str) else ""
    try:
        float(text)
    except ValueError:
        shown = text
    else:
        shown = format_duration(seconds)
    return {"": shown or format_duration(seconds), "_s": str(seconds)}


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


# ------------------------------------------------------------------------- the thresholds

Value = str | int | float


class ThresholdError(ValueError):
    """A bad override: unknown name, or a value that is not of the threshold's kind."""


@dataclass(frozen=True)
class Threshold:
    """One tunable value of the rules: its default here, its meaning in ``doc``.

    Each rule module declares the thresholds of its group at its top (``THRESHOLDS``);
    ``alerts/site.py`` declares the site-wide ones and joins them all.
    """

    name: str
    default: Value
    kind: Kind
    doc: str
