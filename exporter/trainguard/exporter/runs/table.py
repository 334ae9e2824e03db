"""The run table: every run the exporter knows at this scrape, and whether its process is alive.

The runs come from the heartbeat files in the state directory and the runs declared in the
config file. The table is shared by the runs collector (which publishes it), the GPU collector
(which needs the pids of live runs) and the checkpoint collector (which needs the checkpoint
locations).

The exporter never writes the state directory: dead and finished runs are dropped from the
table once their last heartbeat is older than ``run_retention`` (default 7 days), their files
stay. A state directory that does not exist is not an error (no run has started yet); one that
exists but cannot be listed is.
"""

from __future__ import annotations

import heapq
import os
import socket
import stat
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from trainguard.exporter.config.model import Config
from trainguard.exporter.runs.configured import ConfiguredRuns
from trainguard.exporter.runs.rows import LogFile, RunRow, RunView, drop_superseded, with_stops
from trainguard.exporter.runs.targets import (
    PRIMARY,
    CheckpointTarget,
    config_targets,
    merge_targets,
)
from trainguard.exporter.scrape.context import Scrape
from trainguard.exporter.scrape.relay import Unfinished
from trainguard.shared import procinfo
from trainguard.shared.heartbeat.read import read_heartbeat
from trainguard.shared.heartbeat.record import SUFFIX, Heartbeat, HeartbeatError
from trainguard.shared.pattern import DEFAULT_CHECKPOINT_PATTERN
from trainguard.shared.steps import DEFAULT_LAYOUT

#: heartbeat files read at most per scrape; more is an error (and a sign of misuse)
MAX_FILES = 10_000
#: seconds before a process of another pid namespace that could not be told found or absent
#: (unreadable namespace, ambiguous, /proc unreadable) is looked for again: a scan reads the
#: stat of every process on the host
NS_RETRY_SECONDS = 15.0

_CacheKey = tuple[int, int, int, int, int, int]


class RunTable:
    """Every run the exporter knows at a scrape, and whether its process is alive.

    Built once per scrape from the heartbeat files and the config file's runs, and read by
    every collector and ``trainguard status`` alike (:meth:`view`), so that none of them
    disagrees with another on which runs exist or which died. Heartbeat files are re-read only
    when they change.
    """

    def __init__(self, config: Config, state_dir: Path, *, max_files: int = MAX_FILES) -> None:
        self.config = config
        self.state_dir = Path(state_dir)
        self._max_files = max_files
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[_CacheKey, Heartbeat | HeartbeatError]] = {}
        # each file's last valid reading: a file that turns bad (corrupted, truncated, junk
        # written over it) keeps its run published from it, so that a dead run's death is not
        # turned into silence by a damaged heartbeat
        self._last_good: dict[str, tuple[Heartbeat, int]] = {}
        self._dir_seen = False  # the state dir existed at some scrape
        # fixed for the exporter's life: a reboot restarts the exporter too
        self._boot_id = procinfo.boot_id()
        self._boot_time = procinfo.boot_time()
        self._pid_ns = procinfo.pid_namespace()
        # the initial pid namespace sees every process: one it cannot find is gone
        self._sees_all = self._pid_ns == procinfo.INIT_PID_NS
        # processes of other pid namespaces (containers without hostPID), as found in /proc:
        # what was looked up and when (monotonic)
        self._ns_cache: dict[procinfo.NsProcess, tuple[procinfo.NsLookup, float]] = {}
        self._ticks_ok = procinfo.ticks_comparable()
        self._host = socket.gethostname()
        self._own_pid = os.getpid()
        self._configured = ConfiguredRuns(config.run_retention_seconds, self._own_pid)

    # -- what other collectors use ------------------------------------------------------

    def pid_runs(self, scrape: Scrape | None = None) -> dict[int, tuple[str, str]]:
        """Map of pid -> (run, rank) for runs whose process is alive now (a reused pid is not)."""
        out: dict[int, tuple[str, str]] = {}
        for row in self.view(scrape).rows:
            if row.up:
                for pid in row.pids:
                    out.setdefault(pid, (row.run, row.rank))
        return out

    def checkpoint_targets(self, scrape: Scrape | None = None) -> list[CheckpointTarget]:
        """Checkpoint locations: the config file's first, then those announced in heartbeats.

        Heartbeats count only for runs still in the table, lowest rank first. While the table
        cannot be read by the scrape's deadline (the state directory hangs), the config file's
        alone, and the scrape is told that the others are unknown.
        """
        announced: list[CheckpointTarget] = []
        try:
            view = self.view(scrape)
        except Unfinished as exc:
            if scrape is None:
                raise
            scrape.error(f"checkpoint locations announced in heartbeats unknown: {exc}")
            return config_targets(self.config)
        rows = sorted(view.rows, key=lambda r: (r.run, int(r.rank)))
        for row in rows:
            hb = row.heartbeat
            if hb is None:
                continue
            places = [(PRIMARY, hb.checkpoint_dir)] if hb.checkpoint_dir else []
            places += sorted(hb.mirrors.items())
            for location, path in places:
                announced.append(
                    CheckpointTarget(
                        row.run,
                        location,
                        Path(path),
                        hb.checkpoint_pattern or DEFAULT_CHECKPOINT_PATTERN,
                        owner=row.owner,
                        layout=hb.checkpoint_layout or DEFAULT_LAYOUT,
                    )
                )
        return merge_targets(config_targets(self.config), announced)

    # -- the table ------------------------------------------------------------------------

    def view(self, scrape: Scrape | None = None) -> RunView:
        """The table now.

        Within one scrape the runs, GPU and checkpoint collectors share one view instead of
        each listing the state directory and checking every pid again.
        """
        if scrape is None:
            return self._locked_view()
        return scrape.once(self, self._locked_view, f"reading the state directory {self.state_dir}")

    def _locked_view(self) -> RunView:
        with self._lock:
            return self._view()

    def _view(self) -> RunView:
        errors: list[str] = []
        bad_files: list[tuple[str, str]] = []
        heartbeats, files_ok, present = self._scan(errors, bad_files)
        now = time.time()
        rows = with_stops(self.state_dir, self._heartbeat_rows(heartbeats, now, errors), bad_files)
        known = {row.run for row in rows}
        for rc in self.config.runs:
            if rc.name not in known:
                pid, up, pids, finished = self._configured.state(rc, errors, now)
                rows.append(RunRow(rc.name, "0", self._host, pid, up, pids=pids, finished=finished))
        rows.sort(key=lambda r: (r.run, int(r.rank)))
        return RunView(
            rows=tuple(rows),
            log_files=tuple(self._log_files(rows)),
            files_ok=files_ok,
            errors=tuple(errors),
            bad_files=tuple(bad_files),
            state_dir_present=present,
        )

    def _scan(
        self, errors: list[str], bad_files: list[tuple[str, str]]
    ) -> tuple[list[tuple[Heartbeat, int]], int, bool]:
        """Parse the heartbeat files, re-reading only those changed since the last scrape.

        Changed means a new inode, size or times (the reporter replaces the file at each
        write). Returns the heartbeats with the uid owning each file, how many files were valid,
        and whether the state directory could be listed. A file that cannot be used goes to
        ``bad_files``, and its run is kept from the file's last valid reading.
        """
        try:
            it = os.scandir(self.state_dir)
        except FileNotFoundError:
            self._cache.clear()
            self._last_good.clear()
            if self._dir_seen:  # removed under running jobs: their runs are no longer watched
                errors.append(
                    f"state dir {self.state_dir}: no longer exists (it did earlier); no run "
                    "is watched until it is back"
                )
            return [], 0, False
        except OSError as exc:
            errors.append(f"state dir {self.state_dir}: cannot list: {exc.strerror or exc}")
            return [], 0, False
        self._dir_seen = True
        first = len(errors)  # the directory's own errors go before those of single files
        seen: set[str] = set()
        heartbeats: list[tuple[Heartbeat, int]] = []  # with the uid owning the file
        valid = 0
        with it:
            entries = [e for e in it if e.name.endswith(SUFFIX) and not e.name.startswith(".")]
        if len(entries) > self._max_files:
            # live reporters rewrite their file every few seconds: keeping the newest keeps
            # them, whatever else (a long sweep's leftovers, junk) fills the directory
            errors.insert(
                first,
                f"state dir {self.state_dir}: more than {self._max_files} heartbeat files; "
                f"only the {self._max_files} most recently written are read",
            )
            entries = heapq.nlargest(self._max_files, entries, key=_mtime_ns)
        for entry in entries:
            seen.add(entry.name)
            result = self._read(entry)
            if isinstance(result, HeartbeatError):
                kept = self._last_good.get(entry.name)
                why = str(result)
                if kept is not None:
                    why += "; its run is kept as last read valid"
                    heartbeats.append(kept)
                bad_files.append((entry.name, why))
            else:  # read through entry.stat() just before: cached, no new syscall
                read = (result, entry.stat(follow_symlinks=False).st_uid)
                self._last_good[entry.name] = read
                heartbeats.append(read)
                valid += 1
        for name in set(self._cache) - seen:
            del self._cache[name]
        for name in set(self._last_good) - seen:
            del self._last_good[name]
        return heartbeats, valid, True

    def _read(self, entry: os.DirEntry[str]) -> Heartbeat | HeartbeatError:
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError as exc:
            return HeartbeatError(f"{entry.path}: cannot stat: {exc.strerror or exc}")
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode)
        cached = self._cache.get(entry.name)
        if cached is not None and cached[0] == key:
            return cached[1]
        result: Heartbeat | HeartbeatError
        if stat.S_ISLNK(st.st_mode):
            result = HeartbeatError(f"{entry.path}: is a symbolic link; refused")
        else:
            try:
                result = read_heartbeat(entry.path)
            except HeartbeatError as exc:
                result = exc.with_traceback(None)  # cached: keep no frames alive
        self._cache[entry.name] = (key, result)
        return result

    def _heartbeat_rows(
        self, heartbeats: Iterable[tuple[Heartbeat, int]], now: float, errors: list[str]
    ) -> list[RunRow]:
        heartbeats = list(heartbeats)
        self._look_up_namespaces([hb for hb, _ in heartbeats])
        rows: list[RunRow] = []
        for hb, owner in heartbeats:
            up, pid = self._alive(hb, errors)
            if up is not True and now - hb.time > self.config.run_retention_seconds:
                continue  # dead or finished long ago: no longer published
            rows.append(
                RunRow(
                    run=hb.run,
                    rank=str(hb.rank),
                    host=hb.host,
                    pid=hb.pid,
                    up=up,
                    heartbeat=hb,
                    pids=() if pid is None else (pid,),
                    owner=owner,
                    finished=hb.state == "finished",
                )
            )
        return drop_superseded(rows)

    def _same_boot(self, hb: Heartbeat) -> bool | None:
        return procinfo.same_boot(hb.boot_id, hb.boot_time, self._boot_id, self._boot_time)

    def _ns_key(self, hb: Heartbeat, same_boot: bool | None) -> procinfo.NsProcess | None:
        """The process to look for in /proc when ``hb`` comes from another pid namespace."""
        if hb.pid_ns is None or self._pid_ns is None or hb.pid_ns == self._pid_ns:
            return None
        ticks = hb.start_ticks if same_boot is True and self._ticks_ok else None
        return procinfo.NsProcess(hb.pid_ns, hb.pid, hb.create_time, ticks)

    def _look_up_namespaces(self, heartbeats: list[Heartbeat]) -> None:
        """Find the host pids of processes in other pid namespaces, in one pass over /proc.

        It looks for those not found yet (or whose last lookup could not tell, a while ago);
        the ones found are re-checked at their host pid at every scrape instead
        (:meth:`_alive`).
        """
        keys = set()
        for hb in heartbeats:
            same = self._same_boot(hb)
            key = self._ns_key(hb, same) if same is not False else None
            if key is not None:
                keys.add(key)
        for stale in set(self._ns_cache) - keys:
            del self._ns_cache[stale]
        now = time.monotonic()
        wanted = [
            k
            for k in keys
            if k not in self._ns_cache
            or (
                self._ns_cache[k][0].kind in ("unverifiable", "ambiguous", "unknown")
                and now - self._ns_cache[k][1] >= NS_RETRY_SECONDS
            )
        ]
        if wanted:
            for key, found in procinfo.find_in_namespaces(wanted).items():
                self._ns_cache[key] = (found, now)

    def _alive(self, hb: Heartbeat, errors: list[str]) -> tuple[bool | None, int | None]:
        """Whether the heartbeat's process is alive, and its pid as this exporter sees it.

        The pid is the host pid of a process in a container's pid namespace; None when
        unknown.
        """
        same = self._same_boot(hb)
        if same is False:
            # written before a reboot (or on another host): not running here
            return False, None
        key = self._ns_key(hb, same)
        if key is None:
            # exact start ticks only within one boot (they count from it), else the create time
            ticks = hb.start_ticks if same is True and self._ticks_ok else None
            return procinfo.process_alive(hb.pid, hb.create_time, ticks), hb.pid
        return self._alive_elsewhere(hb, key, errors)

    def _alive_elsewhere(
        self, hb: Heartbeat, key: procinfo.NsProcess, errors: list[str]
    ) -> tuple[bool | None, int | None]:
        where = f"run {hb.run!r} rank {hb.rank}: pid {hb.pid} of pid namespace {hb.pid_ns}"
        found, at = self._ns_cache.get(key, (procinfo.NsLookup("unknown"), 0.0))
        if found.kind == "found" and found.host_pid is not None and found.start_ticks is not None:
            alive = procinfo.still_there(found.host_pid, hb.pid, found.start_ticks)
            if alive is False:  # seen alive, now gone: that is a death wherever we stand
                self._ns_cache[key] = (procinfo.NsLookup("gone"), at)
                return False, None
            if alive is None:
                errors.append(f"{where}: host pid {found.host_pid} cannot be read; unknown")
            return alive, found.host_pid
        if found.kind == "gone" or (found.kind == "absent" and self._sees_all):
            return False, None
        if found.kind == "absent":
            errors.append(
                f"{where}: no such process in this exporter's /proc, but it does not have the "
                "host's pid namespace (hostPID, --pid=host) and may not see that one; unknown"
            )
        elif found.kind == "unverifiable":
            errors.append(
                f"{where}: a process with that pid and create time exists, but its namespace "
                "cannot be read (another user's process, no ptrace access) and the heartbeat "
                "has no start_ticks (an older trainguard) to match it exactly; unknown"
            )
        elif found.kind == "ambiguous":
            errors.append(f"{where}: several processes match it exactly; unknown")
        else:
            errors.append(f"{where}: /proc cannot be scanned for it; unknown")
        return None, None

    def _log_files(self, rows: list[RunRow]) -> Iterable[LogFile]:
        configured = {rc.name: rc.log_file for rc in self.config.runs if rc.log_file}
        by_run: dict[str, list[RunRow]] = {}
        for row in rows:
            by_run.setdefault(row.run, []).append(row)
        for run, run_rows in by_run.items():
            alive = any(r.up for r in run_rows)
            path = configured.get(run)
            if path is not None:
                yield LogFile(run, Path(path), True)
                continue
            for r in run_rows:
                if r.heartbeat is not None and r.heartbeat.log_file:
                    yield LogFile(run, Path(r.heartbeat.log_file), alive, r.owner)
                    break


def _mtime_ns(entry: os.DirEntry[str]) -> int:
    try:
        return entry.stat(follow_symlinks=False).st_mtime_ns
    except OSError:
        return -1  # gone or unreadable: last


@dataclass(frozen=True)
class Setup:
    """What the exporter's collectors are built from, shared between them.

    One run table (heartbeats and configured runs) feeds the runs collector, the GPU collector
    (pids of live runs) and the checkpoint collector (checkpoint locations); it lives beside
    the table because the table is the lowest room that every collector's set-up needs.
    """

    config: Config
    state_dir: Path
    table: RunTable
