"""Runs declared in the config file without a heartbeat: running, finished or dead.

These are scripts that do not import trainguard; whether each is running, finished or dead comes
from a pid file or a process match. A run is not running until its process is seen alive: a run
that has not started yet is nothing to page about. What this exporter saw of each is kept in
memory only (it never writes the state directory), so a restart of the exporter forgets it.

Pid files: the pid file is named by the operator, but it lives where the run (or anyone who can
write that directory) puts it, so it is read as every file others may write is
(:func:`trainguard.shared.fileio.read_untrusted`): a FIFO planted in its place cannot block a
scrape, a device or a huge file is not read. A pid file that is a symbolic link is followed only to
a file owned by the owner of the link (Apache's ``SymLinksIfOwnerMatch``): a service that links its
pid file elsewhere keeps working, and a link someone made to another user's file (a private file) is
refused, naming the file, before a byte of it is read.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

import psutil

from trainguard.exporter.config.model import RunConfig
from trainguard.shared import procinfo
from trainguard.shared.fileio import UntrustedFileError, read_untrusted

#: ``_pid_from_file``'s answer when there is no pid file
_MISSING = object()


@dataclass(frozen=True)
class _Seen:
    """What this exporter saw last of a configured run's process.

    It is kept in memory only: the exporter never writes the state directory, so a restart
    forgets it. The state is ``alive``, ``dead`` (seen alive, or a pid file left behind, and
    then gone), ``finished`` (its pid file removed after it was seen alive) or ``expired`` (dead
    longer than ``run_retention``), since ``since`` (wall time), with the last ``pid``.
    """

    state: str
    since: float
    pid: int | None


class ConfiguredRuns:
    """What this exporter has seen of each configured run's process."""

    def __init__(self, retention_seconds: float, own_pid: int) -> None:
        self._retention = retention_seconds
        self._own_pid = own_pid
        self._seen: dict[str, _Seen] = {}  # configured run -> what was seen of it

    def state(
        self, rc: RunConfig, errors: list[str], now: float
    ) -> tuple[int | None, bool | None, tuple[int, ...], bool | None]:
        """(pid, up, pids of its processes, finished) of a config-file run with no heartbeat."""
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
        return pid, up, pids, finished

    def _expired(self, seen: _Seen, now: float) -> bool:
        return now - seen.since > self._retention

    def _pid_file_state(
        self, rc: RunConfig, errors: list[str], now: float
    ) -> tuple[int | None, bool | None, bool | None]:
        """(pid, up, finished) of a run with a pid file.

        Not running until its process is seen alive; once seen, a pid file removed is a clean
        finish (daemons remove theirs at exit). A pid file whose process is gone (or whose pid
        another process took) is a death: a crash leaves its pid file behind, so this holds
        even for a process this exporter never saw alive (it died while the exporter was
        down). Removing that file ends it (someone decided not to restart the run).
        """
        name = rc.name
        seen = self._seen.get(name)
        pid, up = self._pid_from_file(rc, errors)
        if up is _MISSING:
            if seen is not None and seen.state == "alive":
                seen = self._seen[name] = _Seen("finished", now, seen.pid)
            if seen is not None and seen.state == "finished" and not self._expired(seen, now):
                return seen.pid, False, True
            self._seen.pop(name, None)  # never started, or a death acknowledged
            return None, None, None
        if up is None:
            return pid, None, None  # cannot tell (the reason is in errors)
        if up:
            self._seen[name] = _Seen("alive", now, pid)
            return pid, True, False
        if seen is None or seen.pid != pid or seen.state in ("alive", "finished"):
            seen = self._seen[name] = _Seen("dead", now, pid)
        if seen.state == "dead" and self._expired(seen, now):
            seen = self._seen[name] = _Seen("expired", seen.since, pid)
        if seen.state == "expired":
            return pid, None, None  # dead for longer than run_retention: no longer published
        return pid, False, False

    def _match_state(
        self, name: str, found: tuple[int, ...], now: float
    ) -> tuple[tuple[int, ...], int | None, bool | None]:
        """(pids, pid, up) of a run found by a process name or command line match.

        Up while a process matches; never seen matching, not running (nothing to page about);
        seen and then no longer matching, dead (a match cannot tell a clean exit from a death)
        until a process matches again or ``run_retention`` passes.
        """
        seen = self._seen.get(name)
        if found:
            self._seen[name] = _Seen("alive", now, found[0])
            return found, found[0], True  # the oldest match is the run's main process
        if seen is None:
            return (), None, None
        if seen.state == "alive":
            seen = self._seen[name] = _Seen("dead", now, seen.pid)
        if self._expired(seen, now):
            del self._seen[name]
            return (), None, None
        return (), seen.pid, False

    def _pid_from_file(self, rc: RunConfig, errors: list[str]) -> tuple[int | None, object]:
        """(pid, up) from a run's pid file.

        up is ``_MISSING`` when there is no pid file, None when it cannot be told. A pid whose
        process started after the file was written belongs to another process (the pid was
        reused): the run's process is gone.
        """
        assert rc.pid_file is not None
        where = f"run {rc.name!r}: pid file {rc.pid_file}"
        try:
            raw, written = read_pid_file(rc.pid_file)
        except FileNotFoundError:
            return None, _MISSING
        except UntrustedFileError as exc:  # a link to another's file, a FIFO, too big
            errors.append(f"{where}: {exc.why}")
            return None, None
        except OSError as exc:
            errors.append(f"{where}: cannot read: {exc.strerror or exc}")
            return None, None
        text = raw.strip()
        if not text.isdigit() or not 0 < int(text) < 2**32:
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


#: a pid is at most 10 digits; a line end and some blanks around it are tolerated
MAX_BYTES = 64


def read_pid_file(path: Path) -> tuple[bytes, float]:
    """The content (at most :data:`MAX_BYTES`) and modification time of a pid file.

    FileNotFoundError when there is none (a link to nothing counts as none: its daemon removed
    the file it pointed to); :class:`UntrustedFileError` when it is refused, its ``why`` saying
    why (for a link, naming the file it points to).
    """
    link = os.lstat(path)
    if not stat.S_ISLNK(link.st_mode):
        raw, st = read_untrusted(path, MAX_BYTES)
        return raw, st.st_mtime
    target = os.path.realpath(path)

    def foreign(st: os.stat_result) -> str | None:  # the file opened, not a name: no race
        if st.st_uid == link.st_uid:
            return None
        return f"owned by uid {st.st_uid}, not by the link's owner (uid {link.st_uid}); refused"

    try:
        raw, st = read_untrusted(target, MAX_BYTES, refuse=foreign)  # no link, regular, capped
    except UntrustedFileError as exc:
        raise UntrustedFileError(
            str(path), f"is a symbolic link to {target}: {exc.why}", too_large=exc.too_large
        ) from None
    return raw, st.st_mtime
