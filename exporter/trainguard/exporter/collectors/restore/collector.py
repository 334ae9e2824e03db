"""Restore drill results: the step a scheduled ``trainguard verify --restore`` last loaded.

The drill leaves one result file per location in the state directory's ``restore/``
(:mod:`trainguard.exporter.collectors.restore.result`); this collector reads them (bounded, each
field checked, re-read only when changed) and exports, per run and location, the newest step a drill
loaded, when, and whether the last drill succeeded. A result is attributed to a run by its
``--run``/``--location``, else by its directory: the location of that path the exporter watches
(config file or heartbeat). One it cannot attribute is not exported.
"""

from __future__ import annotations

import heapq
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from prometheus_client.core import Metric

from trainguard.exporter.collectors.restore.metrics import (
    LAST_AGE,
    LAST_SUCCESS,
    LAST_TIME,
    METRICS,
    VERIFIED_AGE,
    VERIFIED_STEP,
    VERIFIED_TIME,
)
from trainguard.exporter.collectors.restore.result import (
    SUFFIX,
    Result,
    ResultError,
    read_result,
    results_dir,
)
from trainguard.exporter.runs.rows import age
from trainguard.exporter.runs.table import Setup
from trainguard.exporter.runs.targets import PRIMARY, CheckpointTarget
from trainguard.exporter.scrape.collector import Collector
from trainguard.exporter.scrape.context import Scrape

#: result files read per scrape, the most recently written first
MAX_RESULTS = 1000

Targets = Callable[[Scrape], Iterable[CheckpointTarget]]
_Key = tuple[int, int, int, int]  # dev, inode, size, mtime_ns


class RestoreCollector(Collector):
    """Reads the restore drill results in the state directory at every scrape."""

    name = "restore"
    help = "restore drill results (trainguard verify --restore) in the state directory"
    metrics = METRICS

    @classmethod
    def build(cls, setup: Setup) -> RestoreCollector:
        collector = cls(results_dir(setup.state_dir), setup.table.checkpoint_targets)
        collector.shared_reads = (setup.table.view,)
        return collector

    def __init__(self, results: Path, targets: Targets) -> None:
        self._state_dir = results  # <state dir>/restore
        self._targets = targets
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[_Key, Result | ResultError]] = {}

    def gather(self, scrape: Scrape) -> Iterable[Metric]:
        with self._lock:
            results = self._read(scrape)
        families = {spec.name: spec.family() for spec in self.metrics}
        if not results:
            return families.values()
        need_targets = any(r.run is None or r.location is None for r, _ in results)
        targets = list(self._targets(scrape)) if need_targets else []
        chosen: dict[tuple[str, str], Result] = {}
        for result, uid in results:
            labels = _attribute(result, uid, targets, scrape)
            if labels is not None and (labels not in chosen or chosen[labels].time < result.time):
                chosen[labels] = result
        # the ages on this host's clock, the one the drill that wrote here read (a drill writes
        # into its own node's state directory): comparable across exporters where the
        # timestamps, each of its own host's clock, are not
        now = time.time()
        for labels, r in sorted(chosen.items()):
            if r.verified_step is not None and r.verified_time is not None:
                families[VERIFIED_STEP.name].add_metric(list(labels), r.verified_step)
                families[VERIFIED_TIME.name].add_metric(list(labels), r.verified_time)
                families[VERIFIED_AGE.name].add_metric(list(labels), age(now, r.verified_time))
            families[LAST_SUCCESS.name].add_metric(list(labels), 1 if r.ok else 0)
            families[LAST_TIME.name].add_metric(list(labels), r.time)
            families[LAST_AGE.name].add_metric(list(labels), age(now, r.time))
        return families.values()

    def _read(self, scrape: Scrape) -> list[tuple[Result, int]]:
        """Every readable result with the uid owning its file; unreadable ones are errors."""
        try:
            with os.scandir(self._state_dir) as it:
                entries = [e for e in it if e.name.endswith(SUFFIX) and not e.name.startswith(".")]
        except FileNotFoundError:
            self._cache.clear()
            return []
        except OSError as exc:
            scrape.error(f"restore results {self._state_dir}: cannot list: {exc.strerror or exc}")
            return []
        if len(entries) > MAX_RESULTS:
            scrape.error(
                f"restore results {self._state_dir}: more than {MAX_RESULTS}; only the "
                f"{MAX_RESULTS} most recently written are read"
            )
            entries = heapq.nlargest(MAX_RESULTS, entries, key=_mtime)
        out: list[tuple[Result, int]] = []
        cache: dict[str, tuple[_Key, Result | ResultError]] = {}
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            cached = self._cache.get(entry.name)
            if cached is not None and cached[0] == key:
                got = cached[1]
            else:
                try:
                    got = read_result(entry.path)
                except FileNotFoundError:
                    continue
                except ResultError as exc:
                    got = exc
            cache[entry.name] = (key, got)
            if isinstance(got, ResultError):
                scrape.error(str(got))
            else:
                out.append((got, st.st_uid))
        self._cache = cache
        return out


def _mtime(entry: os.DirEntry[str]) -> int:
    try:
        return entry.stat(follow_symlinks=False).st_mtime_ns
    except OSError:
        return 0


def _attribute(
    result: Result, uid: int, targets: list[CheckpointTarget], scrape: Scrape
) -> tuple[str, str] | None:
    """The (run, location) a result is exported as, or None when none can be told.

    By its own run and location where the drill named them; else by the watched location
    with its directory. A location announced in a heartbeat takes only results written by
    that heartbeat's owner (or root), as it is watched only for them.
    """
    path = os.path.normpath(result.path)
    match = next(
        (
            t
            for t in targets
            if os.path.normpath(str(t.path)) == path and result.run in (None, t.run)
        ),
        None,
    )
    if match is not None and match.owner not in (None, 0) and uid not in (0, match.owner):
        scrape.error(
            f"restore result for {result.path}: written by uid {uid}, but run {match.run!r} "
            f"announced that location from uid {match.owner}; not exported"
        )
        return None
    run = result.run if result.run is not None else (match.run if match else None)
    if run is None:
        return None
    location = result.location or (match.location if match else PRIMARY)
    return run, location
