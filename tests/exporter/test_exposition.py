"""The exporter's text writer writes what prometheus_client's ``generate_latest`` writes, byte
for byte, for any families, on the first render and on later renders that reuse its caches."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest, make_wsgi_app
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
    StateSetMetricFamily,
)
from prometheus_client.process_collector import ProcessCollector

from trainguard.exporter.http.app import metrics_app
from trainguard.exporter.scrape.collector import ExporterRegistry
from trainguard.exporter.scrape.exposition import LineFamily, TextWriter, sample_prefix, value_text


class Families:
    """A registry that yields the given families."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


label_text = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cs",)) | st.sampled_from('\\\n"{},='),
    max_size=8,
)
values = (
    st.floats(allow_nan=True, allow_infinity=True)
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([0, 0.0, -0.0, 1, True, False, 1e7, 123456789.0, 2**63])
)
names = st.sampled_from(["trainguard_x", "trainguard_y_bytes", "x:y", "with.dot", "n\u00e9"])
label_names = st.sampled_from(["gpu", "run", "label.dot", "le_x", "\u00fcml"])


@st.composite
def family(draw: st.DrawFn) -> Metric:
    kind = draw(st.sampled_from(["gauge", "counter", "info", "stateset", "unknown", "hist"]))
    name = draw(names)
    doc = draw(label_text)
    labels = draw(st.lists(label_names, max_size=3, unique=True))
    label_values = st.lists(label_text, min_size=3, max_size=3)
    rows = draw(st.lists(st.tuples(label_values, values), max_size=4))
    timestamp = draw(st.sampled_from([None, None, 1234.5]))
    if kind == "hist":
        hist = HistogramMetricFamily(name, doc, labels=labels)
        for vals, _ in rows:
            hist.add_metric(vals[: len(labels)], [("1.0", 1), ("+Inf", 2)], sum_value=3.0)
        return hist
    if kind == "info":
        info = InfoMetricFamily(name, doc, labels=labels)
        for vals, _ in rows:
            info.add_metric(vals[: len(labels)], {"version": vals[0]})
        return info
    if kind == "stateset":
        sset = StateSetMetricFamily(name, doc, labels=labels)
        for vals, v in rows:
            sset.add_metric(vals[: len(labels)], {"a": bool(v), "b": not v})
        return sset
    if kind == "counter":
        counter = CounterMetricFamily(name, doc, labels=labels)
        for vals, v in rows:
            created = draw(st.sampled_from([None, 99.5]))
            counter.add_metric(vals[: len(labels)], abs(v), created=created, timestamp=timestamp)
        return counter
    metric: Metric
    if kind == "unknown":
        metric = Metric(name, doc, kind)
    else:
        metric = GaugeMetricFamily(name, doc, labels=labels)
    for vals, v in rows:
        if kind == "unknown":
            metric.add_sample(name, dict(zip(labels, vals, strict=False)), v, timestamp)
        else:
            assert isinstance(metric, GaugeMetricFamily)
            metric.add_metric(vals[: len(labels)], v, timestamp=timestamp)
    return metric


@given(st.lists(st.lists(family(), max_size=5), min_size=1, max_size=3))
def test_same_bytes_as_prometheus_client(scrapes: list[list[Metric]]) -> None:
    """Several renders in a row with one writer: its caches from the earlier ones change
    nothing."""
    writer = TextWriter()
    for families in scrapes:
        expected = generate_latest(Families(families))  # type: ignore[arg-type]
        assert writer.render(families) == expected
        assert writer.render(families) == expected


def as_lines(metric: Metric) -> Metric:
    """``metric`` as a :class:`LineFamily` its maker rendered, where it can be one (a gauge or
    counter without timestamps or ``_created``)."""
    if metric.type not in ("gauge", "counter") or any(
        s.timestamp is not None or s.name.endswith("_created") for s in metric.samples
    ):
        return metric
    sample_name = metric.name + ("_total" if metric.type == "counter" else "")
    lines = [f"{sample_prefix(s.name, s.labels)}{value_text(s.value)}\n" for s in metric.samples]
    rows = [(s.labels, s.value) for s in metric.samples]
    return LineFamily(metric, lines, rows, sample_name)


@given(st.lists(st.lists(family(), max_size=5), min_size=1, max_size=3))
def test_rendered_lines_are_prometheus_clients(scrapes: list[list[Metric]]) -> None:
    """Families whose maker rendered their lines (the GPU health series) come out as
    generate_latest writes the same samples, beside plain families, render after render; and
    their samples, built on demand, are the same samples."""
    writer = TextWriter()
    for families in scrapes:
        expected = generate_latest(Families(families))  # type: ignore[arg-type]
        mixed = [as_lines(m) for m in families]
        assert writer.render(mixed) == expected
        assert writer.render(mixed) == expected
        assert generate_latest(Families(mixed)) == expected  # type: ignore[arg-type]
        assert [m.samples for m in mixed] == [m.samples for m in families]


def test_negative_zero_is_not_zero() -> None:
    """0.0 == -0.0 as dictionary keys, but prometheus_client writes them apart."""
    g = GaugeMetricFamily("trainguard_z", "z", labels=["k"])
    for i, v in enumerate([0.0, -0.0, 0, -0.0, 0.0, math.inf, -math.inf, math.nan]):
        g.add_metric([str(i)], v)
    writer = TextWriter()
    assert writer.render([g]) == generate_latest(Families([g]))  # type: ignore[arg-type]
    assert b'trainguard_z{k="1"} -0.0\n' in writer.render([g])


class Fixed:
    """A collector with fixed families that describes itself (so ``name[]`` can select)."""

    def __init__(self) -> None:
        self.a = GaugeMetricFamily("trainguard_a", "A.", labels=["gpu"])
        self.a.add_metric(["0"], 1.5)
        self.b = CounterMetricFamily("trainguard_b", "B.", labels=["run"])
        self.b.add_metric(["r"], 3)

    def collect(self) -> list[Metric]:
        return [self.a, self.b]

    def describe(self) -> list[Metric]:
        return self.collect()


def test_app_answers_as_prometheus_client() -> None:
    """Every request the metrics path gets, answered as prometheus_client's WSGI app answers a
    client that asks for the text format: same status, headers and body (the exporter's app
    serves no ``name[]`` selection: a query string changes nothing)."""
    theirs_registry = CollectorRegistry()
    theirs_registry.register(Fixed())  # type: ignore[arg-type]
    ours_registry = ExporterRegistry()
    ours_registry.register(Fixed())  # type: ignore[arg-type]
    ours = metrics_app(ours_registry)
    theirs = make_wsgi_app(theirs_registry, disable_compression=True)

    def call(app: Any, method: str, query: str = "") -> tuple[Any, bytes]:
        environ = {
            "REQUEST_METHOD": method,
            "PATH_INFO": "/metrics",
            "QUERY_STRING": query,
            "HTTP_ACCEPT": "text/plain",
            "HTTP_X_PROMETHEUS_SCRAPE_TIMEOUT_SECONDS": "10",
        }
        answer: list[Any] = []
        body = b"".join(app(environ, lambda *a: answer.append(a)))
        return answer, body

    for method, query in [
        ("GET", ""),
        ("HEAD", ""),
        ("POST", ""),
        ("OPTIONS", ""),
    ]:
        assert call(ours, method, query) == call(theirs, method, query), (method, query)
    assert call(ours, "GET", "other=1") == call(theirs, "GET", "")


def test_process_collector() -> None:
    """The families the exporter registers besides its own: prometheus_client's process
    metrics (their values move between two renders, so the start is compared)."""
    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    ours = TextWriter().render(registry.collect()).decode()
    theirs = generate_latest(registry).decode()
    assert (
        ours.splitlines()[:2]
        == theirs.splitlines()[:2]
        == [
            "# HELP process_virtual_memory_bytes Virtual memory size in bytes.",
            "# TYPE process_virtual_memory_bytes gauge",
        ]
    )
    assert [line.split(" ")[0] for line in ours.splitlines()] == [
        line.split(" ")[0] for line in theirs.splitlines()
    ]
