"""Count the saves that fail, by reason, and record the last success, for the exporter to page on.

A script that catches a failed save and trains on (``except OSError: log.warning(...)``) loses
everything since its last good checkpoint when it dies, and nothing said so. Every writer here
(``save``, ``save_dir``, ``mirror``, the framework integrations, and a DCP ``async_save``'s
future handed to :func:`watch_save`) reports its outcome to :func:`record_success` or
:func:`record_failure`, which fold it into the checkpoint directory's status file in the state
directory (:mod:`trainguard.shared.save_status`, which says why there). Reporting never raises
into the save nor delays it beyond one small file write; a status file that cannot be written
(the state directory full too) keeps the count in this process until a later write succeeds,
the one piece of process state here, so that no failure is lost once the disk has room again.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from trainguard.checkpoint.part import lock
from trainguard.shared.fileio import FILE_FLAGS, UntrustedFileError, read_untrusted, replace_file
from trainguard.shared.save_status import (
    MAX_BYTES,
    SaveStatus,
    SaveStatusError,
    location_key,
    parse_status,
    status_path,
)
from trainguard.shared.statedir import default_state_dir

log = logging.getLogger("trainguard.checkpoint")

_ERRNO_REASONS = {
    errno.ENOSPC: "enospc",
    errno.EDQUOT: "edquot",
    errno.EIO: "eio",
    errno.EROFS: "erofs",
}
#: the same errors as their text, for a wrapper that kept only the message
_STRERRORS = {os.strerror(code).lower(): reason for code, reason in _ERRNO_REASONS.items()}
#: below this much free space, a save that failed without an errno failed for lack of space
NEARLY_FULL_BYTES = 1 << 20
_MAX_CHAIN = 32


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, its causes and contexts, and the per-rank errors of a DCP CheckpointException."""
    todo: list[BaseException] = [exc]
    seen: set[int] = set()
    while todo and len(seen) < _MAX_CHAIN:
        e = todo.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo.extend(x for x in (e.__cause__, e.__context__) if x is not None)
        failures = getattr(e, "failures", None)  # DCP: {rank: (exception, traceback)}
        if isinstance(failures, dict):
            for value in failures.values():
                inner = value[0] if isinstance(value, tuple) and value else value
                if isinstance(inner, BaseException):
                    todo.append(inner)


def reason_of(exc: BaseException | None, directory: str | os.PathLike[str] | None = None) -> str:
    """Why a save failed: ``enospc``, ``edquot``, ``eio``, ``erofs`` or ``other``.

    From the errno of the first OSError behind ``exc`` (``torch.save`` raises a RuntimeError
    whose context is the OSError), else from the error's text (``No space left on device``),
    else, for an error that kept neither (DCP's writer thread, torch's zip writer:
    ``unexpected pos``), from the state of ``directory``'s filesystem now: mounted read-only
    is ``erofs``, less than 1 MiB available ``enospc``; so too when the error is unknown
    (None). Anything else is ``other``.
    """
    chain = list(_chain(exc)) if exc is not None else []
    errnos = [e.errno for e in chain if isinstance(e, OSError) and e.errno]
    for code in errnos:
        if code in _ERRNO_REASONS:
            return _ERRNO_REASONS[code]
    if errnos:
        return "other"
    for e in chain:
        text = str(e).lower()
        for message, reason in _STRERRORS.items():
            if message in text:
                return reason
    if directory is not None:
        with contextlib.suppress(OSError):
            fs = os.statvfs(directory)
            if fs.f_flag & getattr(os, "ST_RDONLY", 1):
                return "erofs"
            if fs.f_bavail * fs.f_frsize < NEARLY_FULL_BYTES:
                return "enospc"
    return "other"


@dataclass
class _Tally:
    """Outcomes not yet in the status file."""

    failures: dict[str, int] = field(default_factory=dict)
    last_success: float | None = None
    last_failure: float | None = None

    def merged(self, old: SaveStatus, directory: str) -> SaveStatus:
        failures = dict(old.failures)
        for reason, n in self.failures.items():
            failures[reason] = failures.get(reason, 0) + n
        return SaveStatus(
            directory=directory,
            failures=failures,
            last_success=_later(old.last_success, self.last_success),
            last_failure=_later(old.last_failure, self.last_failure),
        )


def _later(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


_lock = threading.Lock()
#: status file -> the outcomes a failed write could not add to it yet (see the module's doc)
_unwritten: dict[str, _Tally] = {}
_warned: set[str] = set()


def _warn_once(key: str, message: str, *args: Any) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message, *args)


def _read(path: Path, directory: str) -> SaveStatus:
    empty = SaveStatus(directory)
    try:
        status = parse_status(read_untrusted(path, MAX_BYTES)[0])
    except FileNotFoundError:
        return empty
    except (UntrustedFileError, SaveStatusError) as exc:
        _warn_once(
            f"bad:{path}", "trainguard: save status %s unusable, started again: %s", path, exc
        )
        return empty
    return status if status.directory == directory else empty


def _fold(path: Path, directory: str, tally: _Tally) -> None:
    """Add ``tally`` to the status file, under a lock every process saving there takes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT | FILE_FLAGS, 0o644)
    try:
        lock(fd, exclusive=True, blocking=True)
        replace_file(path, tally.merged(_read(path, directory), directory).encode())
    finally:
        os.close(fd)


def _record(directory: str | os.PathLike[str], reason: str | None) -> None:
    """Fold one outcome (a failure's reason, or None for a success) into the status file."""
    try:
        key = location_key(directory)
        path = status_path(default_state_dir(), key)
    except Exception as exc:  # never into the save
        _warn_once("path", "trainguard: save outcome not recorded: %r", exc)
        return
    now = time.time()
    with _lock:
        tally = _unwritten.pop(str(path), None) or _Tally()
        if reason is None:
            tally.last_success = _later(tally.last_success, now)
        else:
            tally.failures[reason] = tally.failures.get(reason, 0) + 1
            tally.last_failure = _later(tally.last_failure, now)
        try:
            _fold(path, key, tally)
        except Exception as exc:
            _unwritten[str(path)] = tally
            _warn_once(
                f"write:{type(exc).__name__}:{getattr(exc, 'errno', '')}",
                "trainguard: cannot write the save status %s: %s; the outcome is kept and "
                "written with the next one",
                path,
                exc,
            )


def record_success(directory: str | os.PathLike[str]) -> None:
    """A save into ``directory`` (the checkpoint location) completed."""
    _record(directory, None)


def record_failure(directory: str | os.PathLike[str], exc: BaseException | None) -> str:
    """A save into ``directory`` failed with ``exc`` (None: unknown); the reason recorded."""
    try:
        reason = reason_of(exc, directory)
    except Exception:
        reason = "other"
    _record(directory, reason)
    return reason


#: what ends a save without it having failed: the process is being stopped
_NOT_FAILURES = (KeyboardInterrupt, SystemExit, GeneratorExit)


@contextlib.contextmanager
def tracked(directory: str | os.PathLike[str], *, success: bool = True) -> Iterator[None]:
    """Record the block's outcome for ``directory``: a failure if it raises.

    ``success=False`` records failures only (a rank whose success another rank records).
    KeyboardInterrupt, SystemExit and GeneratorExit are not a failed save and pass
    unrecorded; any other BaseException is one (DCP's ``CheckpointException`` is a
    BaseException).
    """
    try:
        yield
    except _NOT_FAILURES:
        raise
    except BaseException as exc:
        record_failure(directory, exc)
        raise
    if success:
        record_success(directory)


F = TypeVar("F")


def watch_save(future: F, path: str | os.PathLike[str]) -> F:
    """Record the outcome of an asynchronous save of the checkpoint ``path`` when it completes.

    ``future`` is what ``torch.distributed.checkpoint.async_save`` returned: a
    ``concurrent.futures.Future``, or an ``AsyncSaveResponse`` whose ``upload_completion`` is
    watched. A failure is counted (by the reason behind DCP's ``CheckpointException``) in the
    location of ``path``, its parent directory, as :func:`~trainguard.checkpoint.save` counts
    its own; a cancelled save is not counted. Returns ``future``, untouched::

        future = checkpoint.watch_save(dcp.async_save(state, checkpoint_id=path), path)
    """
    target = getattr(future, "upload_completion", future)
    add: Callable[[Callable[[Any], None]], None] | None = getattr(target, "add_done_callback", None)
    if add is None:
        raise TypeError(f"watch_save needs a Future, got {type(future).__name__}")
    directory = Path(location_key(path)).parent

    def done(f: Any) -> None:
        try:
            if f.cancelled():
                return
            exc = f.exception()
        except Exception as err:  # a future that cannot say: count it failed
            exc = err
        if exc is None:
            record_success(directory)
        else:
            record_failure(directory, exc)

    add(done)
    return future
