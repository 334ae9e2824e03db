"""Collector framework: every collector gathers at scrape time, and one that fails is reported
as ``trainguard_collector_success 0`` while the rest of the scrape still answers."""

from __future__ import annotations

import abc
import logging
import re
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector as _PromCollector

from trainguard._version import __version__
from trainguard.exporter.scrape import Scrape

log = logging.getLogger(__name__)

#: new error messages logged per collector and scrape; the rest are summed up in one line
MAX_LOGGED_ERRORS = 20
#: control characters (a newline in a file name) are escaped in log lines, so that whoever can
#: name a file in a watched directory cannot forge log lines
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


@dataclass(frozen=True)
class MetricSpec:
    """One metric of the contract: the single source for its name, type, labels and help, so
    that docs/metrics.md can be checked against the code."""

    name: str
    kind: Literal["gauge", "counter"]
    labels: tuple[str, ...]
    help: str

    def family(self) -> GaugeMetricFamily | CounterMetricFamily:
        if self.kind == "counter":
            return CounterMetricFamily(self.name, self.help, labels=self.labels)
        return GaugeMetricFamily(self.name, self.help, labels=self.labels)


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

#: a collector that has not finished in this many seconds is reported failed, so that the
#: scrape still answers within Prometheus's default 10 s scrape timeout
DEFAULT_COLLECTOR_TIMEOUT = 5.0


class CollectorError(Exception):
    """A failure a collector explains itself; logged without a traceback."""


class Collector(abc.ABC):
    """One concern of the exporter (one file under ``trainguard/exporter/collectors``)."""

    #: value of the ``collector`` label
    name: str
    #: every metric this collector may publish
    metrics: tuple[MetricSpec, ...] = ()

    @abc.abstractmethod
    def gather(self, scrape: Scrape) -> Iterable[Metric]:
        """Yield this scrape's metric families. A part that fails (one GPU, one heartbeat
        file, one checkpoint location) is reported with ``scrape.error(reason)`` and the rest
        is still yielded; raising fails the whole collector for this scrape."""


class ExporterCollector(_PromCollector):
    """The one prometheus_client collector registered: runs each trainguard collector,
    isolates its failures and adds the framework's own metrics."""

    def __init__(
        self, collectors: Sequence[Collector], timeout: float = DEFAULT_COLLECTOR_TIMEOUT
    ) -> None:
        self._runners = tuple(_Runner(c) for c in collectors)
        self._timeout = timeout
        self._last_errors: dict[str, tuple[str, ...]] = {}
        self._log_lock = threading.Lock()

    def collect(self) -> Iterator[Metric]:
        build = BUILD_INFO.family()
        build.add_metric([__version__], 1)
        success = COLLECTOR_SUCCESS.family()
        duration = COLLECTOR_DURATION.family()
        gathered: list[Metric] = [build]
        scrape = Scrape()
        for runner in self._runners:
            name = runner.collector.name
            start = time.perf_counter()
            families, errors = runner.run(scrape.for_collector(), self._timeout)
            elapsed = time.perf_counter() - start
            self._log_change(name, errors)
            gathered.extend(families)
            success.add_metric([name], 0 if errors else 1)
            duration.add_metric([name], elapsed)
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


def _gather(collector: Collector, scrape: Scrape) -> tuple[list[Metric], list[str]]:
    try:
        families = list(collector.gather(scrape))
        errors = scrape.errors
    except CollectorError as exc:
        families, errors = [], [str(exc)]
    except Exception as exc:  # a collector bug must not fail the scrape
        log.debug("collector %s raised", collector.name, exc_info=True)
        families, errors = [], [f"unexpected {type(exc).__name__}: {exc}"]
    return families, errors


class _Runner:
    """Runs one collector on a thread of its own and waits at most the timeout for it: a
    call that hangs (a GPU driver stuck on a lost GPU, a stat on a network filesystem whose
    server went away) costs one scrape the timeout, not the whole scrape, and while it still
    hangs later scrapes report the collector failed at once instead of queueing behind it.
    When the call returns, the next scrape runs the collector again. Scrapes that arrive
    while a run is in progress share its result rather than queueing runs of their own."""

    def __init__(self, collector: Collector) -> None:
        self.collector = collector
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._pending: tuple[int, Scrape] | None = None  # (run number, its scrape) to start
        self._started = 0  # runs started
        self._finished = 0  # number of the last run that returned: runs are one at a time, so
        # one is in progress while _finished < _started
        self._result: tuple[list[Metric], list[str]] = ([], [])
        self._abandoned = False  # a scrape gave up waiting for the run in progress

    def run(self, scrape: Scrape, timeout: float) -> tuple[list[Metric], list[str]]:
        with self._cond:
            if not self._abandoned:
                if self._finished == self._started:
                    if self._thread is None or not self._thread.is_alive():
                        self._thread = threading.Thread(
                            target=self._loop, name=f"trainguard-{self.collector.name}", daemon=True
                        )
                        self._thread.start()
                    self._started += 1
                    self._pending = (self._started, scrape)
                    self._cond.notify_all()
                run = self._started
                if self._cond.wait_for(lambda: self._finished >= run, timeout):
                    return self._result
                self._abandoned = True
        return [], [
            f"did not finish within {timeout:g} s: a call is hanging (a GPU driver, or a "
            "network filesystem that stopped answering?); the collector is skipped until it "
            "returns"
        ]

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None)
                assert self._pending is not None
                run, scrape = self._pending
                self._pending = None
            result: tuple[list[Metric], list[str]] = ([], ["interrupted"])
            try:
                result = _gather(self.collector, scrape)
            finally:
                with self._cond:
                    self._result, self._finished = result, run
                    self._abandoned = False
                    self._cond.notify_all()


def printable(message: str) -> str:
    """``message`` with control characters escaped (``\\n``, ``\\x1b``) and lone surrogates
    (undecodable bytes of a file name) shown as ``\\udcff``: one log line, whatever a file
    name holds."""
    escaped = _CONTROL.sub(lambda m: repr(m.group())[1:-1], message)
    return escaped.encode("utf-8", "backslashreplace").decode("utf-8")
