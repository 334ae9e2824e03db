"""Thresholds every rule group shares.

They say how the rules find the scrape targets and tell them apart, where the runbook lives, how
often the slow recording rules run and how long alerts on a lasting state keep firing.
"""

from __future__ import annotations

from alerts.kinds import DURATION, LABELS, SELECTOR, URL
from alerts.thresholds.threshold import Threshold

THRESHOLDS: tuple[Threshold, ...] = (
    Threshold(
        "job_selector",
        'job=~"trainguard.*"',
        SELECTOR,
        "Selector for Prometheus' own `up` series of the trainguard scrape job(s), used by "
        "TrainguardExporterDown; the other alerts select by metric name.",
    ),
    Threshold(
        "target_labels",
        "cluster, namespace, job, instance",
        LABELS,
        "Labels that identify a scrape target, kept by every aggregation and join of the rules "
        "(and used to select an alert's own series in annotation queries): on a global "
        "Prometheus or Thanos, runs of two clusters stay apart and alerts keep their routing "
        "labels. A label absent from the series costs nothing; add those your relabelling sets "
        "(node, region...). Must include job and instance.",
    ),
    Threshold(
        "runbook_base",
        'http://{{ or $labels.instance "localhost:9636" }}/runbook',
        URL,
        "Where the runbook lives; each alert links to <runbook_base>#<alertname lowercased>. "
        "The default is the runbook the exporter ships and serves at /runbook, on the "
        "exporter the alert is about (a job's alert across nodes: its lowest rank's exporter; "
        "the Watchdog: localhost:9636). Set your wiki's address here "
        "(https://wiki.example.com/trainguard), "
        "or https:// where the exporter serves TLS.",
    ),
    Threshold(
        "slow_rules_interval",
        "5m",
        DURATION,
        "Evaluation interval of the group trainguard.rules.slow: the recording rules over days "
        "([7d] changes, max_over_time, min_over_time), too costly to evaluate every 15s. Their "
        "readers look back 3 intervals (last_over_time), so a late evaluation leaves no gap.",
    ),
    Threshold(
        "pace_rules_interval",
        "1m",
        DURATION,
        "Evaluation interval of the group trainguard.rules.pace: a run's completed intervals "
        "between steps, its step rate and TrainingThroughputDropped, judged over minutes. Never "
        "longer than slow_rules_interval (it is shortened to that), whose records read its own.",
    ),
    Threshold(
        "keep_firing_for",
        "10m",
        DURATION,
        "TrainingProcessDied and the other alerts on a lasting state of a run keep firing this "
        "long after their condition was last seen (Prometheus' keep_firing_for): a missed scrape, "
        "an exporter or Prometheus restart must not resolve them and page a second time.",
    ),
)
