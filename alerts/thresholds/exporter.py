"""Thresholds of the alerts on the exporter itself (``alerts/rules/exporter.py``).

They tune the alerts on failing collectors and on a target Prometheus cannot scrape.
"""

from __future__ import annotations

from alerts.kinds import DURATION
from alerts.thresholds.threshold import Threshold

THRESHOLDS: tuple[Threshold, ...] = (
    Threshold(
        "collector_failing_for",
        "5m",
        DURATION,
        "TrainguardCollectorFailing: a collector failed every scrape for this long.",
    ),
    Threshold(
        "exporter_down_for",
        "5m",
        DURATION,
        "TrainguardExporterDown: Prometheus failed to scrape the exporter for this long.",
    ),
    Threshold(
        "exporter_down_active_lookback",
        "1d",
        DURATION,
        "TrainguardExporterDown is critical when the target was watching an active run at the "
        "last evaluation before it vanished, looking back at most this far; a target that left "
        "service discovery is remembered (and alerted on) this long.",
    ),
)
