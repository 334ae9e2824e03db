"""``prune`` and ``latest``: act only on what the shared verdict calls complete, and never
delete what is being written, copied, or of unknown age."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from trainguard.checkpoint.part import lock
from trainguard.shared.fileio import FILE_FLAGS, O_NONBLOCK, fsync_dir, settled, sha256_file
from trainguard.shared.listing import Listing, read_listing
from trainguard.shared.manifest import MANIFEST_DIR, remove_record
from trainguard.shared.pattern import DEFAULT_CHECKPOINT_PATTERN, CheckpointPattern
from trainguard.shared.verdict import Judged, judge


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint as :func:`latest` finds it; usable wherever a path is
    (``torch.load(latest(d))``)."""

    path: Path
    step: int
    size: int
    sha256: str | None

    def __fspath__(self) -> str:
        return str(self.path)


def _unlink_unused(path: Path, listed: os.stat_result) -> bool:
    """Delete ``path`` only if it is still the file that was judged and nobody holds a lock on
    it (a mirror copying from it). False, and nothing deleted, otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | FILE_FLAGS | O_NONBLOCK)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        same = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if same != (listed.st_dev, listed.st_ino, listed.st_size, listed.st_mtime_ns):
            return False  # rewritten since it was judged
        if not lock(fd, exclusive=True, blocking=False):
            return False
        now = os.stat(path, follow_symlinks=False)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            return False
        os.unlink(path)
        return True
    finally:
        os.close(fd)


def _remove_stale_records(listing: Listing, now_ns: int, grace_ns: int) -> None:
    """Records whose checkpoint file no longer exists, and temporaries of killed writers, once
    settled. A record whose file exists is never touched, whatever its name's pattern."""
    mdir = listing.directory / MANIFEST_DIR
    try:
        with os.scandir(mdir) as it:
            entries = list(it)
    except FileNotFoundError:
        return
    for entry in entries:
        name = entry.name
        if name.startswith("."):
            stale = name.endswith(".tmp")
        elif name.endswith(".json"):
            stale = not os.path.lexists(listing.directory / name[: -len(".json")])
        else:
            stale = False
        if not stale:
            continue
        with contextlib.suppress(OSError):
            if settled(entry.stat(follow_symlinks=False), now_ns, grace_ns):
                os.unlink(entry.path)


def prune(
    directory: str | os.PathLike[str],
    keep: int,
    *,
    mirrors: Iterable[str | os.PathLike[str]] = (),
    grace: float = 300.0,
    pattern: str = DEFAULT_CHECKPOINT_PATTERN,
) -> list[Path]:
    """Keep the newest ``keep`` complete checkpoints of ``directory`` and delete older ones,
    in the mirrors too (aligned on the same steps). Returns what was deleted.

    Never deleted: a ``.part``; a file touched within ``grace`` seconds; a file whose mtime is 0
    or unreadable (unknown is not old); the newest complete checkpoint of each location; a file
    another process holds locked (a mirror copying it); anything at all when fewer than
    ``keep`` complete checkpoints exist. Every location is read before anything is deleted; a
    location that cannot be read raises and nothing is deleted.
    """
    if keep < 1:
        raise ValueError("keep must be at least 1: the newest complete checkpoint is never pruned")
    pat = CheckpointPattern(pattern)
    now_ns = time.time_ns()
    grace_ns = int(grace * 1e9)
    primary = read_listing(directory, pat)
    listings = [primary, *(read_listing(m, pat) for m in mirrors)]
    judged: list[list[Judged]] = [judge(primary, now_ns=now_ns, grace_ns=grace_ns)]
    judged += [judge(m, now_ns=now_ns, grace_ns=grace_ns, primary=primary) for m in listings[1:]]
    steps = sorted({j.entry.step for j in judged[0] if j.complete}, reverse=True)
    if len(steps) < keep:
        return []
    oldest_kept = steps[keep - 1]
    deleted: list[Path] = []
    for listing, files in zip(listings, judged, strict=True):
        newest = max((j.entry.step for j in files if j.complete), default=None)
        removed = False
        for j in files:
            step = j.entry.step
            if step >= oldest_kept or step == newest or not j.settled:
                continue
            path = listing.directory / j.entry.name
            if _unlink_unused(path, j.entry.stat):
                deleted.append(path)
                removed = True
                if j.entry.name in listing.records:
                    remove_record(listing.directory, j.entry.name)
        if removed:
            fsync_dir(listing.directory)
        _remove_stale_records(listing, now_ns, grace_ns)
    return deleted


def latest(
    directory: str | os.PathLike[str],
    *,
    verify_hash: bool = False,
    primary: str | os.PathLike[str] | None = None,
    grace: float = 300.0,
    pattern: str = DEFAULT_CHECKPOINT_PATTERN,
) -> Checkpoint | None:
    """The newest complete checkpoint: its size matches its record (for a mirror without a
    record, the ``primary`` directory's record, or the primary file once ``grace`` has passed),
    its mtime is known, and with ``verify_hash`` its content hashes to the recorded SHA-256
    (a file without a recorded hash then does not qualify). None when there is none."""
    pat = CheckpointPattern(pattern)
    listing = read_listing(directory, pat)
    plisting = read_listing(primary, pat) if primary is not None else None
    judged = judge(listing, now_ns=time.time_ns(), grace_ns=int(grace * 1e9), primary=plisting)
    complete = sorted(
        (j for j in judged if j.complete), key=lambda j: (j.entry.step, j.entry.name), reverse=True
    )
    for j in complete:
        path = listing.directory / j.entry.name
        if verify_hash:
            if j.expected_sha256 is None:
                continue
            try:
                sha, size = sha256_file(path)
            except OSError:
                continue
            if sha != j.expected_sha256 or size != j.expected_size:
                continue
        return Checkpoint(
            path=path, step=j.entry.step, size=j.entry.stat.st_size, sha256=j.expected_sha256
        )
    return None
