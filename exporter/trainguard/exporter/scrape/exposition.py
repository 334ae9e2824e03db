"""The Prometheus text format (0.0.4) of a scrape, at a fraction of prometheus_client's cost.

It writes byte for byte what prometheus_client's ``generate_latest`` writes.

Why: prometheus_client renders every sample from scratch at every scrape (it checks each
metric and label name against its regular expressions, sorts and escapes each label set and
formats each value), which was a third of the exporter's CPU per scrape. Between two scrapes
almost nothing of that changes: the same families with the same help, the same label sets
(a GPU, a run, a checkpoint location) and mostly the same values. :class:`TextWriter` keeps
what it rendered in the last scrape, keyed by what it was rendered from, and renders only
what is new; what the last scrape did not use is dropped, so the memory is one scrape's.
Families with anything this writer does not handle itself (timestamps, OpenMetrics-only
samples such as ``_created``) are handed to prometheus_client whole. A :class:`LineFamily`
comes with its sample lines already rendered by its maker (the GPU health series, which a
collector can render cheaper than any generic path: it knows which of its labels and values
changed), and is written as it is.
``tests/exporter/test_exposition.py`` checks the output against ``generate_latest`` byte for byte.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.exposition import escape_label_name, escape_metric_name
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

#: how prometheus_client's text format names and types a family of each OpenMetrics type
_TEXT_TYPE = {
    "counter": ("_total", "counter"),
    "info": ("_info", "gauge"),
    "stateset": ("", "gauge"),
    "gaugehistogram": ("", "histogram"),
    "unknown": ("", "untyped"),
}
#: samples that prometheus_client moves to a gauge family of their own after the family
_OM_SUFFIXES = ("_created", "_gsum", "_gcount")


class _One:
    """A registry of one family, to hand a family prometheus_client's writer."""

    def __init__(self, metric: Any) -> None:
        self._metric = metric

    def collect(self) -> list[Any]:
        return [self._metric]


def _escape_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _header(metric: Any) -> str:
    suffix, kind = _TEXT_TYPE.get(metric.type, ("", metric.type))
    name = escape_metric_name(metric.name + suffix)
    doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {name} {doc}\n# TYPE {name} {kind}\n"


def _prefix(sample: Sample) -> str:
    """The sample's line up to its value: name and sorted, escaped labels."""
    name = escape_metric_name(sample.name)
    if not sample.labels:
        return f"{name} "
    labels = ",".join(
        f'{escape_label_name(k)}="{_escape_value(v)}"' for k, v in sorted(sample.labels.items())
    )
    return f"{name}{{{labels}}} "


def sample_prefix(name: str, labels: dict[str, str]) -> str:
    """A sample's line up to its value, as :class:`TextWriter` and generate_latest write it."""
    return _prefix(Sample(name, labels, 0.0))


def value_text(value: float) -> str:
    """A sample's value as the text format writes it."""
    return floatToGoString(value)


class LineFamily(Metric):
    """A family whose sample lines its maker rendered (``sample_prefix(...) + value_text(v)``).

    Why: rendering a line from its parts at every scrape is most of what a series costs; a
    maker that keeps a series' prefix and its last line renders only the values that changed.
    ``samples`` is built on demand from ``rows`` (the same labels and values, in the same
    order) for every reader but :class:`TextWriter`, so the family is still a family.
    """

    def __init__(
        self,
        family: Metric,
        lines: list[str],
        rows: list[tuple[dict[str, str], float]],
        sample_name: str,
    ) -> None:
        self._rows = rows
        self._built: list[Sample] | None = None
        super().__init__(family.name, family.documentation, family.type)
        self.lines = lines
        self._sample_name = sample_name

    @property
    def samples(self) -> list[Sample]:
        if self._built is None:
            name = self._sample_name
            self._built = [Sample(name, labels, value) for labels, value in self._rows]
        return self._built

    @samples.setter
    def samples(self, value: list[Sample]) -> None:
        self._built = value or None


class TextWriter:
    """Renders families in the text format, reusing what the last render rendered.

    Safe to call from several threads at once (each render reads the last one's caches and
    builds its own; the last to finish is kept).
    """

    def __init__(self) -> None:
        self._headers: dict[tuple[str, str, str], str] = {}
        self._prefixes: dict[tuple[object, ...], str] = {}
        self._values: dict[float, str] = {}

    def render(self, families: Iterable[Any]) -> bytes:
        old_headers, old_prefixes, old_values = self._headers, self._prefixes, self._values
        headers: dict[tuple[str, str, str], str] = {}
        prefixes: dict[tuple[object, ...], str] = {}
        values: dict[float, str] = {}
        out: list[str] = []
        append = out.append
        for metric in families:
            name = metric.name
            lines = metric.lines if isinstance(metric, LineFamily) else None
            if lines is None and not self._plain(metric):
                append(generate_latest(_One(metric)).decode("utf-8"))
                continue
            hkey = (name, metric.type, metric.documentation)
            header = old_headers.get(hkey)
            if header is None:
                header = _header(metric)
            headers[hkey] = header
            append(header)
            if lines is not None:  # rendered by its maker
                append("".join(lines))
                continue
            for s in metric.samples:
                key = (s.name, *s.labels.items())
                prefix = prefixes.get(key)
                if prefix is None:
                    prefix = old_prefixes.get(key)
                    if prefix is None:
                        prefix = _prefix(s)
                    prefixes[key] = prefix
                value = s.value
                text = values.get(value)
                if text is None:
                    text = old_values.get(value)
                    if text is None:
                        text = floatToGoString(value)
                    if value:  # 0.0 == -0.0, which are written apart
                        values[value] = text
                append(f"{prefix}{text}\n")
        self._headers, self._prefixes, self._values = headers, prefixes, values
        return "".join(out).encode("utf-8")

    @staticmethod
    def _plain(metric: Any) -> bool:
        """No timestamps and no sample that prometheus_client would move elsewhere."""
        name = metric.name
        for s in metric.samples:
            if s.timestamp is not None:
                return False
            sname = s.name
            if len(sname) > len(name) and sname[len(name) :] in _OM_SUFFIXES:
                return False
        return True
