"""docs/metrics.md and the code must list the same metrics, with the same types and labels."""

import re

from helpers.exporter_proc import REPO
from trainguard.exporter.collectors import COLLECTORS
from trainguard.exporter.scrape.collector import FRAMEWORK_METRICS, MetricSpec

ROW = re.compile(r"^\|\s*`(trainguard_[a-z0-9_]+)`\s*\|\s*(\w+)\s*\|([^|]*)\|")


def code_metrics() -> dict[str, MetricSpec]:
    specs = {m.name: m for m in FRAMEWORK_METRICS}
    for collector in COLLECTORS:
        for spec in collector.metrics:
            assert specs.get(spec.name, spec) == spec, f"{spec.name} defined twice"
            specs[spec.name] = spec
    return specs


def doc_metrics() -> dict[str, tuple[str, tuple[str, ...]]]:
    rows = {}
    for line in (REPO / "docs" / "metrics.md").read_text().splitlines():
        m = ROW.match(line)
        if m:
            name, kind, labels = m.groups()
            assert name not in rows, f"{name} documented twice"
            rows[name] = (kind, tuple(re.findall(r"`([a-z_]+)`", labels)))
    return rows


def test_every_metric_is_documented_and_nothing_else() -> None:
    code = code_metrics()
    docs = doc_metrics()
    assert sorted(set(code) - set(docs)) == [], "metrics missing from docs/metrics.md"
    assert sorted(set(docs) - set(code)) == [], "docs/metrics.md lists metrics the code lacks"
    for name, spec in code.items():
        assert docs[name] == (spec.kind, spec.labels), name


def test_names_follow_conventions() -> None:
    for name, spec in code_metrics().items():
        assert name.startswith("trainguard_")
        assert (spec.kind == "counter") == name.endswith("_total"), name
        assert "job" not in spec.labels and "instance" not in spec.labels, name
