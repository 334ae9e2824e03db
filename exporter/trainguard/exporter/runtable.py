"""The run table: every run the exporter knows at this scrape, from the heartbeat files in the
state directory and the runs declared in the config file, with whether each run's process is
alive. Shared by the runs collector (which publishes it), the GPU collector (which needs the
pids of live runs) and the checkpoint collector (which needs the checkpoint locations).

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

import psutil

from trainguard.exporter.config import Config, RunConfig
from trainguard.exporter.scrape import Scrape
from trainguard.exporter.targets import PRIMARY, CheckpointTarget, config_targets, merge_targets
from trainguard.shared import procinfo
from trainguard.shared.heartbeat import SUFFIX, Heartbeat, HeartbeatError
from trainguard.shared.heartbeat_read import read_heartbeat

#: heartbeat files read at most per scrape; more is an error (and a sign of misuse)
MAX_FILES = 10_000
#: seconds before a process of another pid namespace that could not be told found or absent
#: (unreadable namespace, ambiguous, /proc unreadable) is looked for again: a scan reads the
#: stat of every process on the host
NS_RETRY_SECONDS = 15.0

_CacheKey = tuple[int, int, int, int, int, int]


@dataclass(frozen=True)
class RunRow:
    """One run and rank. ``up`` is None when it cannot be known (no pid to check, a pid of a
    pid namespace this exporter cannot see, access denied). ``pid`` is the pid the process
    recorded (in its own pid namespace), ``pids`` the live ones as this exporter's /proc (and
    NVML, with the host's pid namespace) numbers them."""

    run: str
    rank: str
    host: str
    pid: int | None
    up: bool | None
    heartbeat: Heartbeat | None = None
    pids: tuple[int, ...] = ()  # the live pids of this row (several for a process_match)
    owner: int | None = None  # uid owning the heartbeat file (None: not from a heartbeat)
    #: the run ended cleanly; None when that cannot be told (a configured run)
    finished: bool | None = None


#: ``_pid_from_file``'s answer when there is no pid file
_MISSING = object()


@dataclass(frozen=True)
class _Seen:
    """What this exporter saw last of a configured run's process (kept in memory only: the
    exporter never writes the state directory, so a restart forgets it): ``alive``, ``dead``
    (seen alive, or a pid file left behind, and then gone), ``finished`` (its pid file
    removed after it was seen alive) or ``expired`` (dead longer than ``run_retention``),
    since ``since`` (wall time), last ``pid``."""

    state: str
    since: float
    pid: int | None


@dataclass(frozen=True)
class LogFile:
    run: str
    path: Path
    report_errors: bool  # configured, or the run is alive: a missing log is news
    #: uid that owns the heartbeat that announced it (it must own the file too, see
    #: :func:`~trainguard.exporter.targets.ownership_problem`); None for a log file from the
    #: config file
    owner: int | None = None


@dataclass(frozen=True)
class RunView:
    rows: tuple[RunRow, ...]
    log_files: tuple[LogFile, ...]
    files_ok: int
    file_errors: int
    errors: tuple[str, ...]


class RunTable:
    def __init__(self, config: Config, state_dir: Path, *, max_files: int = MAX_FILES) -> None:
        self.config = config
        self.state_dir = Path(state_dir)
        self._max_files = max_files
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[_CacheKey, Heartbeat | HeartbeatError]] = {}
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
        self._config_seen: dict[str, _Seen] = {}  # configured run -> what was seen of it

    # -- what other collectors use ------------------------------------------------------

    def pid_runs(self, scrape: Scrape | None = None) -> dict[int, tuple[str, str]]:
        """pid -> (run, rank) for runs whose process is alive now (a reused pid is not)."""
        out: dict[int, tuple[str, str]] = {}
        for row in self.view(scrape).rows:
            if row.up:
                for pid in row.pids:
                    out.setdefault(pid, (row.run, row.rank))
        return out

    def checkpoint_targets(self, scrape: Scrape | None = None) -> list[CheckpointTarget]:
        """Checkpoint locations: the config file's first, then those announced in heartbeats
        (lowest rank first) of runs still in the table."""
        announced: list[CheckpointTarget] = []
        rows = sorted(self.view(scrape).rows, key=lambda r: (r.run, int(r.rank)))
        for row in rows:
            hb = row.heartbeat
            if hb is None:
                continue
            places = [(PRIMARY, hb.checkpoint_dir)] if hb.checkpoint_dir else []
            places += sorted(hb.mirrors.items())
            for location, path in places:
                announced.append(CheckpointTarget(row.run, location, Path(path), owner=row.owner))
        return merge_targets(config_targets(self.config), announced)

    # -- the table ------------------------------------------------------------------------

    def view(self, scrape: Scrape | None = None) -> RunView:
        """The table now; within one scrape the runs, GPU and checkpoint collectors share one
        view instead of each listing the state directory and checking every pid again."""
        if scrape is None:
            return self._locked_view()
        return scrape.once(self, self._locked_view)

    def _locked_view(self) -> RunView:
        with self._lock:
            return self._view()

    def _view(self) -> RunView:
        errors: list[str] = []
        heartbeats, files_ok, file_errors = self._scan(errors)
        now = time.time()
        rows = self._heartbeat_rows(heartbeats, now, errors)
        known = {row.run for row in rows}
        for rc in self.config.runs:
            if rc.name not in known:
                rows.append(self._config_row(rc, errors, now))
        rows.sort(key=lambda r: (r.run, int(r.rank)))
        return RunView(
            rows=tuple(rows),
            log_files=tuple(self._log_files(rows)),
            files_ok=files_ok,
            file_errors=file_errors,
            errors=tuple(errors),
        )

    def _scan(self, errors: list[str]) -> tuple[list[tuple[Heartbeat, int]], int, int]:
        """Parse the heartbeat files, re-reading only those whose inode, size or times
        changed since the last scrape (the reporter replaces the file at each write)."""
        try:
            it = os.scandir(self.state_dir)
        except FileNotFoundError:
            self._cache.clear()
            if self._dir_seen:  # removed under running jobs: their runs are no longer watched
                errors.append(
                    f"state dir {self.state_dir}: no longer exists (it did earlier); no run "
                    "is watched until it is back"
                )
            return [], 0, 0
        except OSError as exc:
            errors.append(f"state dir {self.state_dir}: cannot list: {exc.strerror or exc}")
            return [], 0, 0
        self._dir_seen = True
        first = len(errors)  # the directory's own errors go before those of single files
        seen: set[str] = set()
        heartbeats: list[tuple[Heartbeat, int]] = []  # with the uid owning the file
        bad = 0
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
                bad += 1
                errors.append(str(result))
            else:  # read through entry.stat() just before: cached, no new syscall
                heartbeats.append((result, entry.stat(follow_symlinks=False).st_uid))
        for name in set(self._cache) - seen:
            del self._cache[name]
        return heartbeats, len(heartbeats), bad

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
        return _drop_superseded(rows)

    def _same_boot(self, hb: Heartbeat) -> bool | None:
        return procinfo.same_boot(hb.boot_id, hb.boot_time, self._boot_id, self._boot_time)

    def _ns_key(self, hb: Heartbeat, same_boot: bool | None) -> procinfo.NsProcess | None:
        """The process to look for in /proc when ``hb`` comes from another pid namespace."""
        if hb.pid_ns is None or self._pid_ns is None or hb.pid_ns == self._pid_ns:
            return None
        ticks = hb.start_ticks if same_boot is True and self._ticks_ok else None
        return procinfo.NsProcess(hb.pid_ns, hb.pid, hb.create_time, ticks)

    def _look_up_namespaces(self, heartbeats: list[Heartbeat]) -> None:
        """One pass over /proc for the processes of other pid namespaces not found yet (or
        whose last lookup could not tell, a while ago); the ones found are re-checked at
        their host pid at every scrape instead (:meth:`_alive`)."""
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
        """Whether the heartbeat's process is alive, and its pid as this exporter sees it
        (the host pid of a process in a container's pid namespace; None when unknown)."""
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

    def _config_row(self, rc: RunConfig, errors: list[str], now: float) -> RunRow:
        """A run from the config file that no heartbeat reports: rank "0". What this exporter
        has seen of its process is kept in memory (see :class:`_Seen`)."""
        pid: int | None = None
        up: bool | None = None
        finished: bool | None = None
        pids: tuple[int, ...] = ()
        if rc.pid_file is not None:
            pid, up, finished = self._pid_file_state(rc, errors, now)
            pids = (pid,) if up and pid is not None else ()
        elif rc.process_match is not None or rc.cmdline_match is not None:
            cmdline = rc.process_match is None
            pattern = rc.cmdline_match if cmdline else rc.process_match
            assert pattern is not None
            try:
                found = sorted(
                    procinfo.iter_matching(pattern, self._own_pid, cmdline=cmdline),
                    key=lambda m: (m[1], m[0]),
                )
            except Exception as exc:
                errors.append(f"run {rc.name!r}: cannot list processes: {exc}")
            else:
                pids, pid, up = self._match_state(rc.name, tuple(p for p, _ in found), now)
        return RunRow(
            run=rc.name, rank="0", host=self._host, pid=pid, up=up, pids=pids, finished=finished
        )

    def _expired(self, seen: _Seen, now: float) -> bool:
        return now - seen.since > self.config.run_retention_seconds

    def _pid_file_state(
        self, rc: RunConfig, errors: list[str], now: float
    ) -> tuple[int | None, bool | None, bool | None]:
        """(pid, up, finished) of a run with a pid file. Not running until its process is
        seen alive; once seen, a pid file removed is a clean finish (daemons remove theirs at
        exit). A pid file whose process is gone (or whose pid another process took) is a
        death: a crash leaves its pid file behind, so this holds even for a process this
        exporter never saw alive (it died while the exporter was down). Removing that file
        ends it (someone decided not to restart the run)."""
        name = rc.name
        seen = self._config_seen.get(name)
        pid, up = self._pid_from_file(rc, errors)
        if up is _MISSING:
            if seen is not None and seen.state == "alive":
                seen = self._config_seen[name] = _Seen("finished", now, seen.pid)
            if seen is not None and seen.state == "finished" and not self._expired(seen, now):
                return seen.pid, False, True
            self._config_seen.pop(name, None)  # never started, or a death acknowledged
            return None, None, None
        if up is None:
            return pid, None, None  # cannot tell (the reason is in errors)
        if up:
            self._config_seen[name] = _Seen("alive", now, pid)
            return pid, True, False
        if seen is None or seen.pid != pid or seen.state in ("alive", "finished"):
            seen = self._config_seen[name] = _Seen("dead", now, pid)
        if seen.state == "dead" and self._expired(seen, now):
            seen = self._config_seen[name] = _Seen("expired", seen.since, pid)
        if seen.state == "expired":
            return pid, None, None  # dead for longer than run_retention: no longer published
        return pid, False, False

    def _match_state(
        self, name: str, found: tuple[int, ...], now: float
    ) -> tuple[tuple[int, ...], int | None, bool | None]:
        """(pids, pid, up) of a run found by a process name or command line match: up while a
        process matches; never seen matching, not running (nothing to page about); seen and
        then no longer matching, dead (a match cannot tell a clean exit from a death) until a
        process matches again or ``run_retention`` passes."""
        seen = self._config_seen.get(name)
        if found:
            self._config_seen[name] = _Seen("alive", now, found[0])
            return found, found[0], True  # the oldest match is the run's main process
        if seen is None:
            return (), None, None
        if seen.state == "alive":
            seen = self._config_seen[name] = _Seen("dead", now, seen.pid)
        if self._expired(seen, now):
            del self._config_seen[name]
            return (), None, None
        return (), seen.pid, False

    def _pid_from_file(self, rc: RunConfig, errors: list[str]) -> tuple[int | None, object]:
        """(pid, up): up is ``_MISSING`` when there is no pid file, None when it cannot be
        told. A pid whose process started after the file was written belongs to another
        process (the pid was reused): the run's process is gone."""
        assert rc.pid_file is not None
        where = f"run {rc.name!r}: pid file {rc.pid_file}"
        try:
            with open(rc.pid_file, "rb") as fh:
                raw = fh.read(65)
                written = os.fstat(fh.fileno()).st_mtime
        except FileNotFoundError:
            return None, _MISSING
        except OSError as exc:
            errors.append(f"{where}: cannot read: {exc.strerror or exc}")
            return None, None
        text = raw.strip()
        if len(raw) > 64 or not text.isdigit() or not 0 < int(text) < 2**32:
            errors.append(f"{where}: expected a process id")
            return None, None
        pid = int(text)
        try:
            proc = psutil.Process(pid)
            if proc.create_time() > written + procinfo.CREATE_TIME_TOLERANCE:
                return pid, False
            return pid, proc.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return pid, False
        except (psutil.AccessDenied, OSError) as exc:
            errors.append(f"{where}: cannot check pid {pid}: {exc}")
            return pid, None

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


def _drop_superseded(rows: list[RunRow]) -> list[RunRow]:
    """A run restarted with fewer ranks leaves the old higher ranks' heartbeats behind: drop
    a rank that is not alive, is at or above the world size of a later start of the same run,
    and last wrote before that start."""
    newest: dict[str, Heartbeat] = {}
    for row in rows:
        hb = row.heartbeat
        if hb is not None and hb.world_size is not None:
            best = newest.get(row.run)
            if best is None or hb.started > best.started:
                newest[row.run] = hb
    out = []
    for row in rows:
        hb, latest = row.heartbeat, newest.get(row.run)
        if (
            hb is not None
            and latest is not None
            and latest.world_size is not None
            and not row.up
            and hb.rank >= latest.world_size
            and hb.time < latest.started
        ):
            continue
        out.append(row)
    return out
