"""Collector framework: every collector gathers at scrape time, failures isolated.

A collector that fails is reported as ``trainguard_collector_success 0`` while the rest of the
scrape still answers.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar, Literal

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector as _PromCollector
from prometheus_client.registry import CollectorRegistry

from trainguard._version import __version__
from trainguard.exporter.scrape.context import Scrape, SharedReads
from trainguard.exporter.scrape.relay import Relay, Unfinished

log = logging.getLogger(__name__)

#: new error messages logged per collector and scrape; the rest are summed up in one line
MAX_LOGGED_ERRORS = 20
#: control characters (a newline in a file name) are escaped in log lines, so that whoever can
#: name a file in a watched directory cannot forge log lines
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


@dataclass(frozen=True)
class MetricSpec:
    """One metric of the contract: the single source for its name, type, labels and help.

    Being the single source is what lets docs/metrics.md be checked against the code.
    """

    name: str
    kind: Literal["gauge", "counter"]
    labels: tuple[str, ...]
    help: str

    def family(self) -> GaugeMetricFamily | CounterMetricFamily:
        """A new, empty family of this metric, for one scrape.

        Copied from one made (and its name checked by prometheus_client) at the first call:
        making every scrape's families afresh costs a visible share of a small scrape, most of
        it in that check.
        """
        cls, attributes = self._prototype
        family = cls.__new__(cls)
        family.__dict__.update(attributes)
        family.samples = []
        return family

    @cached_property
    def _prototype(self) -> tuple[type[GaugeMetricFamily | CounterMetricFamily], dict[str, Any]]:
        made = (CounterMetricFamily if self.kind == "counter" else GaugeMetricFamily)(
            self.name, self.help, labels=self.labels
        )
        return type(made), dict(vars(made))


BUILD_INFO = MetricSpec(
    "trainguard_exporter_build_info",
    "gauge",
    ("version",),
    "Always 1; the version label says which trainguard exporter is running.",
)
COLLECTOR_SUCCESS = MetricSpec(
    "trainguard_collector_success",
    "gauge",
    ("collector",),
    "1 if the collector gathered everything it should in this scrape, 0 if any part failed.",
)
COLLECTOR_DURATION = MetricSpec(
    "trainguard_collector_duration_seconds",
    "gauge",
    ("collector",),
    "Time the collector took in this scrape.",
)
FRAMEWORK_METRICS = (BUILD_INFO, COLLECTOR_SUCCESS, COLLECTOR_DURATION)

#: the scrape's deadline when the client sets none (Prometheus does, with its scrape_timeout):
#: a collector that has not finished by then is reported failed, so that the scrape still
#: answers within Prometheus's default 10 s scrape timeout
DEFAULT_COLLECTOR_TIMEOUT = 5.0
#: a read several collectors share (the run table) is waited for this share of the scrape's
#: time at most, leaving the rest to a collector that can answer without it
READ_SHARE = 0.8


class CollectorError(Exception):
    """A failure a collector explains itself; logged without a traceback."""


class Collector(abc.ABC):
    """One concern of the exporter (one package under ``trainguard/exporter/collectors``)."""

    #: value of the ``collector`` label and of its ``--[no-]collector.NAME`` flag
    name: ClassVar[str]
    #: what it watches, in a few words: the flag's help
    help: ClassVar[str]
    #: on unless ``--no-collector.NAME``
    enabled_by_default: ClassVar[bool] = True
    #: what it reads through ``scrape.once`` that other collectors read too (the run table's
    #: view): made once per scrape before any collector starts, in a call of its own, so that a
    #: read that hangs holds no collector
    shared_reads: tuple[Callable[[Scrape], object], ...] = ()
    #: every metric this collector may publish
    metrics: ClassVar[tuple[MetricSpec, ...]] = ()

    @abc.abstractmethod
    def gather(self, scrape: Scrape) -> Iterable[Metric]:
        """Yield this scrape's metric families.

        A part that fails (one GPU, one heartbeat file, one checkpoint location) is reported
        with ``scrape.error(reason)`` and the rest is still yielded; raising fails the whole
        collector for this scrape.
        """


class ExporterCollector(_PromCollector):
    """The one prometheus_client collector registered: runs every trainguard collector.

    It runs every trainguard collector under one deadline for the whole scrape, in turn on a
    pooled thread that hands the rest on to another when one stalls
    (:class:`~trainguard.exporter.scrape.relay.Relay`); it isolates their failures and adds the
    framework's own metrics. A collector still running at the deadline is reported failed in
    that scrape while the others' series are served, and is not started again until its call
    returns.
    """

    def __init__(
        self, collectors: Sequence[Collector], timeout: float = DEFAULT_COLLECTOR_TIMEOUT
    ) -> None:
        self._collectors = tuple(collectors)
        reads = tuple(dict.fromkeys(r for c in collectors for r in c.shared_reads))
        self._reads_first = bool(reads)
        calls: list[Callable[[Scrape], Any]] = [_gatherer(c) for c in collectors]
        if reads:
            calls.insert(0, _reader(reads))
        self._relay: Relay[Scrape, Any] = Relay(calls, "trainguard-collect")
        self._timeout = timeout
        self._reads = SharedReads()
        self._last_errors: dict[str, tuple[str, ...]] = {}
        self._log_lock = threading.Lock()

    def collect(self, timeout: float | None = None) -> Iterator[Metric]:
        """Run one scrape, given ``timeout`` seconds.

        ``timeout`` is what the client waits, capped by the exporter's own
        ``--collector.timeout`` (None: that).
        """
        limit = self._timeout if timeout is None else min(max(timeout, 0.0), self._timeout)
        began = time.monotonic()
        deadline = began + limit
        scrape = Scrape(reads=self._reads, deadline=began + READ_SHARE * limit)
        calls = len(self._collectors) + self._reads_first
        outcomes = self._relay.run([scrape.for_collector() for _ in range(calls)], deadline)
        if self._reads_first:  # the shared reads' own call: its failures are the collectors'
            outcomes = outcomes[1:]
        build = BUILD_INFO.family()
        build.add_metric([__version__], 1)
        success = COLLECTOR_SUCCESS.family()
        duration = COLLECTOR_DURATION.family()
        gathered: list[Metric] = [build]
        for collector, outcome in zip(self._collectors, outcomes, strict=True):
            if isinstance(outcome, Exception):
                families: list[Metric] = []
                errors = [f"did not finish within {limit:g} s, the scrape's deadline: {outcome}"]
                if not isinstance(outcome, Unfinished):  # _gatherer catches what gather raises
                    errors = [f"unexpected {type(outcome).__name__}: {outcome}"]
                seconds = time.monotonic() - began
            else:
                (families, errors), seconds = outcome
            self._log_change(collector.name, errors)
            gathered.extend(families)
            success.add_metric([collector.name], 0 if errors else 1)
            duration.add_metric([collector.name], seconds)
        yield from gathered
        yield success
        yield duration

    def _log_change(self, name: str, errors: list[str]) -> None:
        """Log a collector's errors when they change, not at every scrape."""
        current = tuple(sorted(set(errors)))
        with self._log_lock:
            previous = self._last_errors.get(name, ())
            if current == previous:
                return
            self._last_errors[name] = current
        if not current:
            log.info("collector %s recovered", name)
            return
        old = set(previous)  # new ones in the collector's order: the most general first
        new = [m for m in dict.fromkeys(errors) if m not in old]
        for message in new[:MAX_LOGGED_ERRORS]:
            log.warning("collector %s: %s", name, printable(message))
        if len(new) > MAX_LOGGED_ERRORS:
            log.warning(
                "collector %s: %d more new errors not logged (%d in all in this scrape)",
                name,
                len(new) - MAX_LOGGED_ERRORS,
                len(current),
            )


def _reader(reads: Sequence[Callable[[Scrape], object]]) -> Callable[[Scrape], None]:
    """The call that makes a scrape's shared reads; each collector reports what failed in them."""

    def read(scrape: Scrape) -> None:
        for shared in reads:
            with contextlib.suppress(Exception):
                shared(scrape)

    return read


def _gatherer(collector: Collector) -> Callable[[Scrape], tuple[list[Metric], list[str]]]:
    def gather(scrape: Scrape) -> tuple[list[Metric], list[str]]:
        try:
            families = list(collector.gather(scrape))
            errors = scrape.errors
        except (CollectorError, Unfinished) as exc:
            families, errors = [], [str(exc)]
        except Exception as exc:  # a collector bug must not fail the scrape
            log.debug("collector %s raised", collector.name, exc_info=True)
            families, errors = [], [f"unexpected {type(exc).__name__}: {exc}"]
        return families, errors

    return gather


class ExporterRegistry(CollectorRegistry):
    """The exporter's registry, seen per scrape through :meth:`within`.

    :meth:`within` is the registry as one scrape with its own deadline sees it (the client's
    scrape timeout), with no state shared between requests.
    """

    def __init__(self) -> None:
        super().__init__(auto_describe=False)
        self._ordered: list[_PromCollector] = []

    def register(self, collector: _PromCollector) -> None:
        super().register(collector)
        self._ordered.append(collector)

    def unregister(self, collector: _PromCollector) -> None:
        super().unregister(collector)
        self._ordered.remove(collector)

    def within(self, timeout: float | None) -> _Within:
        return _Within(tuple(self._ordered), timeout)


class _Within:
    """A registry's collectors for one scrape of ``timeout`` seconds.

    ``timeout`` None means the exporter's own limit. This is what ``generate_latest`` is given
    per request.
    """

    def __init__(self, collectors: tuple[_PromCollector, ...], timeout: float | None) -> None:
        self._collectors = collectors
        self._timeout = timeout

    def collect(self) -> Iterator[Metric]:
        for c in self._collectors:
            if isinstance(c, ExporterCollector):
                yield from c.collect(self._timeout)
            else:
                yield from c.collect()


def printable(message: str) -> str:
    r"""``message`` as one log line, whatever a file name holds.

    Control characters are escaped (``\n``, ``\x1b``) and lone surrogates (undecodable bytes of
    a file name) shown as ``\udcff``.
    """
    escaped = _CONTROL.sub(lambda m: repr(m.group())[1:-1], message)
    return escaped.encode("utf-8", "backslashreplace").decode("utf-8")
