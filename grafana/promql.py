"""What every dashboard query filters on, and which labels it keeps for one site.

The site is :class:`alerts.site.Site`, the configuration the rules are generated from.

The dashboards only use raw ``trainguard_*`` metrics (plus ``ALERTS``/``up``), so they work
without the recording rules. Every query is filtered on ``cluster=~"$cluster"`` and
``instance=~"$instance"`` (:data:`I`) and, where the metric has a ``run`` label, on
``run=~"$run"`` (:data:`IR`). Per-rank series are kept where a straggler matters (step,
heartbeat, allocator); summaries are aggregated by ``run`` so a run spread over several nodes
(one exporter each) reads as one line.

Every aggregation and join keeps the site's run labels (:attr:`Promql.keep`): its
``target_labels`` but ``job`` and ``instance``, ``cluster, namespace`` by default, so that
same-named runs of two clusters, namespaces (or regions, where a site adds ``region``) stay two.
Absent from the series (a single Prometheus without those labels) they change nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from alerts.site import Site

# Label matchers used in every query. `cluster=~""` (the variable with no values: no cluster
# label anywhere) matches series without the label.
I = 'cluster=~"$cluster", instance=~"$instance"'  # noqa: E741 - short: in every expression
R = 'run=~"$run"'
IR = f"{I}, {R}"


@dataclass(frozen=True)
class Promql:
    """The query builders of one site's dashboards.

    ``site`` also holds the thresholds the panels draw.
    """

    site: Site

    @property
    def keep(self) -> tuple[str, ...]:
        """The labels every aggregation and join keeps (the site's run labels)."""
        return self.site.run_labels

    def labels(self, labels: str) -> str:
        """``labels`` (``"run, rank"``) after the labels every grouping keeps."""
        return ", ".join([*self.keep, *(name.strip() for name in labels.split(","))])

    def group_by(self, labels: str) -> str:
        """``by (<kept labels>, labels)``, for an aggregation."""
        return f"by ({self.labels(labels)})"

    def join_on(self, labels: str) -> str:
        """``on (<kept labels>, labels)``, for a join of two vectors."""
        return f"on ({self.labels(labels)})"

    def by(self, labels: str, metric: str, op: str = "max", matchers: str = IR) -> str:
        """``op by (<kept labels>, labels) (metric{matchers})``: one series per ``labels``.

        Whatever the exporter, kept apart per cluster and namespace (see :attr:`keep`).
        """
        return f"{op} {self.group_by(labels)} ({metric}{{{matchers}}})"
