"""Thresholds of the alerts on jobs of many ranks over many nodes (``alerts/rules/jobs.py``).

The restarted notice per job shares ``restart_window`` with TrainingProcessRestarted
(``deaths``).
"""

from __future__ import annotations

from alerts.kinds import DURATION
from alerts.thresholds.threshold import Threshold

THRESHOLDS: tuple[Threshold, ...] = (
    Threshold(
        "job_death_for",
        "30s",
        DURATION,
        "TrainingJobRankDied: a rank of a job has been dead this long before the job's page "
        "goes out. At least two scrape intervals, so that every node's exporter has been "
        "heard: the page then names the rank that died first rather than one the launcher "
        "stopped after it, and a launcher restart within it (torchrun --max-restarts) is a "
        "TrainingJobRestarted notice, not a page.",
    ),
)
