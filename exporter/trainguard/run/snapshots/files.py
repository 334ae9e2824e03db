"""A run and rank's memory snapshot files in the state directory.

The pickle is written as ``torch.cuda.memory._dump_snapshot`` writes it (to a temp file renamed into
place, so a reader never sees half a snapshot), the rolling set trimmed to its newest files, the
snapshot from before a death or an OOM kept out of that rotation, and the temp files of dumps whose
process was killed removed. What is taken, when, and what the heartbeat says of it is
:mod:`trainguard.run.snapshots.capture`'s concern; names are :mod:`trainguard.shared.snapshots`'s.
"""

from __future__ import annotations

import contextlib
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainguard.shared.fileio import O_BINARY, O_CLOEXEC
from trainguard.shared.snapshots import metadata_name, parse_snapshot_name, snapshot_name

Warn = Callable[..., None]


class SnapshotFiles:
    """The snapshot files of the run and rank whose names start with ``stem``.

    They are written by the process ``pid``. Failures to remove or rename are given to ``warn``
    (logged once per kind), never raised: a snapshot file left behind must not end the training.
    """

    def __init__(self, directory: Path, stem: str, pid: int, warn: Warn) -> None:
        self._dir = directory
        self._stem = stem
        self._pid = pid
        self._warn = warn

    def write_pickle(self, name: str, data: Any) -> int:
        """Pickle ``data`` to ``name`` as ``torch.cuda.memory._dump_snapshot`` does; its size.

        The pickle goes to a temp file renamed into place; the size returned is in bytes.
        """
        path = self._dir / name
        tmp = self._dir / f".{name}.{self._pid}.tmp"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_CLOEXEC | O_BINARY, 0o644)
        try:
            with open(fd, "wb") as f:
                pickle.dump(data, f)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return os.stat(path).st_size

    def own(self) -> list[Any]:
        """The parsed names of this run and rank's snapshot pickles ([] when unlistable)."""
        out = []
        try:
            with os.scandir(self._dir) as entries:
                for entry in entries:
                    parsed = parse_snapshot_name(entry.name, self._stem)
                    if parsed is not None and parsed.ext == "pickle":
                        out.append(parsed)
        except OSError:
            return []
        return out

    def rotate(self, reason: str, keep: int) -> set[str]:
        """Keep the newest ``keep`` snapshots of ``reason`` (and their metadata).

        Returns the names of those removed.
        """
        numbers = sorted(n.number for n in self.own() if n.reason == reason and not n.before)
        removed = set()
        for number in numbers[:-keep]:
            name = snapshot_name(self._stem, reason, number)
            removed.add(name)
            for victim in (name, metadata_name(name)):
                try:
                    os.unlink(self._dir / victim)
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    self._warn("rotate", "trainguard: cannot remove an old snapshot: %r", exc)
        return removed

    def keep_before(self, tag: str, number: int) -> tuple[str, str] | None:
        """Rename the newest periodic snapshot (and its metadata) out of rotation's reach.

        The new name is ``<stem>.<tag>-<number>.before.*``. Returns (old name, new name), or None
        when there is none or it could not be renamed.
        """
        numbers = [n.number for n in self.own() if n.reason == "periodic" and not n.before]
        if not numbers:
            return None
        source = snapshot_name(self._stem, "periodic", max(numbers))
        target = snapshot_name(self._stem, tag, number, before=True)
        try:
            os.replace(self._dir / source, self._dir / target)
        except OSError as exc:
            self._warn("before", "trainguard: cannot keep the snapshot from before: %r", exc)
            return None
        with contextlib.suppress(OSError):
            os.replace(self._dir / metadata_name(source), self._dir / metadata_name(target))
        return source, target

    def remove_stale_temps(self) -> None:
        """Temp files of dumps whose process was killed mid-write (``.<name>.<pid>.tmp``)."""
        import psutil

        prefix = f".{self._stem}."
        try:
            with os.scandir(self._dir) as entries:
                for entry in entries:
                    if not (entry.name.startswith(prefix) and entry.name.endswith(".tmp")):
                        continue
                    head = entry.name[1:].rsplit(".", 2)
                    if len(head) != 3 or not head[1].isdigit():
                        continue
                    pid = int(head[1])
                    if parse_snapshot_name(head[0], self._stem) is None:
                        continue
                    if pid != self._pid and not psutil.pid_exists(pid):
                        with contextlib.suppress(OSError):
                            os.unlink(entry.path)
        except OSError:
            return
