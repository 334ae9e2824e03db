"""Every threshold of trainguard's alert rules, with its kind and meaning.

This is the ONE place to change a default. Overrides (``--set``, ``--config``: see
``alerts/site.py``) are validated here, by kind (``alerts/kinds.py``), so a typo is an error
naming the threshold and the kind of value it expects instead of a rule file Prometheus rejects
(or, worse, loads).

The tables are split by concern, one module per rule group they tune (``shared``: what every
group uses; ``runs``, ``checkpoints``, ``gpu``, ``allocator``, ``exporter``, ``deaths``,
``gpu_health``, ``training_health``, ``stuck``, ``signals``, ``jobs``, ``saves``, ``restore``,
``jobs_slow``),
and joined here in that order: the order of the generated file's header and of ``--list``.

The rule modules (``alerts/rules/``) refer to a threshold as ``${name}``. A duration also
provides ``${name_s}`` (its seconds, for comparisons with ages) and a byte size ``${name_h}``
(``2GiB``, for annotations); see :func:`resolve`. ``${slow_rules_lookback}`` is derived:
three times ``slow_rules_interval``.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from alerts.kinds import format_duration
from alerts.thresholds import (
    allocator,
    checkpoints,
    deaths,
    exporter,
    gpu,
    gpu_health,
    jobs,
    jobs_slow,
    restore,
    runs,
    saves,
    shared,
    signals,
    stuck,
    training_health,
)
from alerts.thresholds.threshold import Threshold, ThresholdError, Value

__all__ = [
    "BY_NAME",
    "DEFAULTS",
    "THRESHOLDS",
    "Threshold",
    "ThresholdError",
    "Value",
    "resolve",
    "shown",
]

# Order matters: it is the order of the generated file's header and of --list.
THRESHOLDS: tuple[Threshold, ...] = (
    *shared.THRESHOLDS,
    *runs.THRESHOLDS,
    *checkpoints.THRESHOLDS,
    *gpu.THRESHOLDS,
    *allocator.THRESHOLDS,
    *exporter.THRESHOLDS,
    *deaths.THRESHOLDS,
    *gpu_health.THRESHOLDS,
    *training_health.THRESHOLDS,
    *stuck.THRESHOLDS,
    *signals.THRESHOLDS,
    *jobs.THRESHOLDS,
    *saves.THRESHOLDS,
    *restore.THRESHOLDS,
    *jobs_slow.THRESHOLDS,
)

BY_NAME: Mapping[str, Threshold] = MappingProxyType({t.name: t for t in THRESHOLDS})
DEFAULTS: Mapping[str, Value] = MappingProxyType({t.name: t.default for t in THRESHOLDS})


def _check_names(overrides: Mapping[str, object]) -> None:
    for key in overrides:
        if key not in BY_NAME:
            raise ThresholdError(f"unknown threshold {key!r}; known: {', '.join(sorted(BY_NAME))}")


def _placeholders(threshold: Threshold, value: object) -> dict[str, str]:
    try:
        parts = threshold.kind.placeholders(value)
    except ValueError as exc:
        kind = threshold.kind
        raise ThresholdError(
            f"threshold {threshold.name} ({kind.name}): {exc}; expected e.g. {kind.hint}"
        ) from None
    return {threshold.name + suffix: text for suffix, text in parts.items()}


def resolve(overrides: Mapping[str, object] | None = None) -> dict[str, str]:
    """Validate overrides and return the placeholder table of the rule templates.

    For a duration ``k``: ``${k}`` is the PromQL duration, ``${k_s}`` the seconds. For a byte
    size ``k``: ``${k}`` is the integer, ``${k_h}`` a human string such as 2GiB.
    """
    overrides = overrides or {}
    _check_names(overrides)
    table: dict[str, str] = {}
    for threshold in THRESHOLDS:
        table.update(_placeholders(threshold, overrides.get(threshold.name, threshold.default)))
    # the pace group feeds the slow group: never evaluated less often than it
    if int(table["pace_rules_interval_s"]) > int(table["slow_rules_interval_s"]):
        table["pace_rules_interval"] = table["slow_rules_interval"]
        table["pace_rules_interval_s"] = table["slow_rules_interval_s"]
    if int(table["stall_gap_lookback_s"]) <= 2 * int(table["pace_rules_interval_s"]):
        raise ThresholdError(
            f"threshold stall_gap_lookback ({table['stall_gap_lookback']}) must be more than "
            f"twice pace_rules_interval ({table['pace_rules_interval']}): the pace group would "
            "miss the intervals that end between its evaluations"
        )
    # how far a reader of the slow group's series looks back: three of its intervals
    table["slow_rules_lookback"] = format_duration(3 * int(table["slow_rules_interval_s"]))
    return table


def shown(table: Mapping[str, str]) -> dict[str, str]:
    """Each threshold's value as people write it (2GiB, not 2147483648), in THRESHOLDS order."""
    return {t.name: table[t.name + t.kind.shown] for t in THRESHOLDS}
