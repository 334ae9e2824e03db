"""One threshold of the rules (name, default, kind, meaning) and the error a bad override raises.

A threshold is the record every table in this package is made of.
"""

from __future__ import annotations

from dataclasses import dataclass

from alerts.kinds import Kind

Value = str | int | float


class ThresholdError(ValueError):
    """A bad override: unknown name, or a value that is not of the threshold's kind."""


@dataclass(frozen=True)
class Threshold:
    """One tunable value of the rules: its default here, its meaning in ``doc``."""

    name: str
    default: Value
    kind: Kind
    doc: str
