"""Checkpoint retention: ``prune`` old checkpoints and find the ``latest`` complete one.

Both act only on what the shared verdict calls complete, and never delete what is being written,
copied, or of unknown age, whether a checkpoint is one file or a directory per step
(:mod:`trainguard.shared.steps`).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from trainguard.checkpoint.part import DIR_FLAGS, lock
from trainguard.shared.fileio import (
    FILE_FLAGS,
    O_NONBLOCK,
    fsync_dir,
    settled,
    sha256_file,
)
from trainguard.shared.listing import Listing, read_listing
from trainguard.shared.manifest import MANIFEST_DIR, ManifestError, remove_record
from trainguard.shared.pattern import DEFAULT_CHECKPOINT_PATTERN, CheckpointPattern
from trainguard.shared.stepdir import StepDir, walk
from trainguard.shared.steps import DEFAULT_LAYOUT
from trainguard.shared.verdict import Judged, StepVerdict, judge, judge_dirs

#: a step directory being deleted is first renamed to a hidden name with this in it, so that
#: from that instant no pattern takes it for a checkpoint; a prune killed while deleting leaves
#: one, which the next prune removes
DELETING = ".trainguard-deleting-"


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint as :func:`latest` finds it.

    Usable wherever a path is (``torch.load(latest(d))``).
    """

    path: Path
    step: int
    size: int  # for a directory: all its files together
    sha256: str | None  # None for a directory (its record has one per file)
    directory: bool = False  # a step directory (a framework's or save_dir's), not one file
    #: whether the loss was finite when it was saved (its record's ``loss_finite``); None when
    #: its record does not say (saved without a trainguard.Run, or before any loss)
    loss_finite: bool | None = None

    def __fspath__(self) -> str:
        return str(self.path)


def _unlink_unused(path: Path, listed: os.stat_result) -> bool:
    """Delete ``path`` only if it is still the file that was judged and nobody has it locked.

    The lock is a mirror's, copying from it. False, and nothing deleted, otherwise.
    """
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
    """Remove records of deleted checkpoint files, and killed writers' temporaries, once settled.

    A record whose file exists is never touched, whatever its name's pattern.
    """
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


def _delete_dir(directory: Path, d: StepDir) -> bool:
    """Delete a step directory only if it is still the tree judged and nobody has it locked.

    Still the tree judged: same directory, no file added, removed or touched since; the lock is
    a ``mirror``'s, copying it. It is first renamed to a hidden name, so that a prune killed
    half-way never leaves a partial directory under a checkpoint's name. False, nothing deleted,
    otherwise.
    """
    path = directory / d.name
    try:
        fd = os.open(path, DIR_FLAGS)
    except OSError:
        return False
    try:
        if not lock(fd, exclusive=True, blocking=False):
            return False
        tree = walk(fd, path, d.name, None)
        judged = sorted(
            (e.name, e.stat.st_ino, e.stat.st_size, e.stat.st_mtime_ns) for e in d.files
        )
        now = sorted(
            (f"{d.name}/{rel}", st.st_ino, st.st_size, st.st_mtime_ns) for rel, st in tree.files
        )
        if tree.touched_ns != d.touched_ns or judged != now:
            return False  # written to since it was judged
        st = os.fstat(fd)
        cur = os.stat(path, follow_symlinks=False)
        if (cur.st_dev, cur.st_ino) != (st.st_dev, st.st_ino):
            return False
        hidden = directory / f".{d.name}{DELETING}{secrets.token_hex(4)}"
        os.rename(path, hidden)
    except (OSError, ManifestError):
        return False
    finally:
        os.close(fd)
    fsync_dir(directory)
    shutil.rmtree(hidden, ignore_errors=True)
    return True


def _remove_leftovers(directory: Path, now_ns: int, grace_ns: int) -> None:
    """Hidden directories of a prune killed while deleting, once settled."""
    with contextlib.suppress(OSError), os.scandir(directory) as it:
        for entry in it:
            if entry.name.startswith(".") and DELETING in entry.name:
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode) and settled(st, now_ns, grace_ns):
                    shutil.rmtree(entry.path, ignore_errors=True)


def _complete_steps(
    judged: list[Judged], steps: list[StepVerdict], listing: Listing | None = None
) -> set[int]:
    """Steps of the complete checkpoints; with ``listing``, only those not saved with a NaN loss."""

    def wanted(name: str) -> bool:
        return listing is None or _loss_finite(listing, None, name) is not False

    out = {j.entry.step for j in judged if j.complete and wanted(j.entry.name)}
    out.update(sv.dir.step for sv in steps if sv.complete and wanted(sv.dir.name))
    return out


def _loss_finite(listing: Listing, primary: Listing | None, name: str) -> bool | None:
    """What the checkpoint's record (or, for a mirror without one, the primary's) says."""
    record = listing.records.get(name)
    if record is None and primary is not None:
        record = primary.records.get(name)
    return None if record is None else record.loss_finite


def prune(
    directory: str | os.PathLike[str],
    keep: int,
    *,
    mirrors: Iterable[str | os.PathLike[str]] = (),
    grace: float = 300.0,
    pattern: str = DEFAULT_CHECKPOINT_PATTERN,
    layout: str = DEFAULT_LAYOUT,
) -> list[Path]:
    """Keep the newest ``keep`` complete checkpoints of ``directory``, delete older ones.

    Older ones are deleted in the mirrors too (aligned on the same steps). Returns what was
    deleted.

    A checkpoint is a file or a step directory (committed by a trainguard record or its
    framework's marker, ``layout`` as in the exporter's config). Never deleted: a ``.part`` or
    a step directory in flight (temporary name, not committed); a file or directory touched
    within ``grace`` seconds (anything under it, for a directory); one whose mtime is 0 or
    unreadable (unknown is not old); the newest complete checkpoint of each location, and the
    newest one not saved with a non-finite loss (its record's ``loss_finite``, see
    :func:`latest`: after a NaN the checkpoints saved since count towards ``keep``, but the last
    one worth resuming from stays); one another process holds locked (a mirror copying it);
    anything at all when fewer than ``keep`` complete checkpoints exist. Every location is read
    before anything is deleted; a location that cannot be read raises and nothing is deleted. A
    directory is renamed to a hidden name before it is removed, so a prune killed half-way
    leaves no partial checkpoint.

    Example::

        checkpoint.save(model.state_dict(), f"/data/ckpt/step_{step}.pt")
        checkpoint.prune("/data/ckpt", keep=3, mirrors=["/mnt/backup/ckpt"])
    """
    if keep < 1:
        raise ValueError("keep must be at least 1: the newest complete checkpoint is never pruned")
    pat = CheckpointPattern(pattern)
    now_ns = time.time_ns()
    grace_ns = int(grace * 1e9)
    primary = read_listing(directory, pat, layout)
    listings = [primary, *(read_listing(m, pat, layout, primary.layout) for m in mirrors)]
    judged: list[list[Judged]] = [judge(primary, now_ns=now_ns, grace_ns=grace_ns)]
    judged += [judge(m, now_ns=now_ns, grace_ns=grace_ns, primary=primary) for m in listings[1:]]
    dirs = [judge_dirs(primary, now_ns=now_ns, grace_ns=grace_ns)]
    dirs += [judge_dirs(m, now_ns=now_ns, grace_ns=grace_ns, primary=primary) for m in listings[1:]]
    steps = sorted(_complete_steps(judged[0], dirs[0]), reverse=True)
    if len(steps) < keep:
        return []
    oldest_kept = steps[keep - 1]
    finite = max(_complete_steps(judged[0], dirs[0], primary), default=None)
    deleted: list[Path] = []
    for listing, files, step_dirs in zip(listings, judged, dirs, strict=True):
        newest = max(_complete_steps(files, step_dirs), default=None)
        kept = {newest, finite, max(_complete_steps(files, step_dirs, listing), default=None)}
        removed = False
        for j in files:
            step = j.entry.step
            if step >= oldest_kept or step in kept or not j.settled:
                continue
            path = listing.directory / j.entry.name
            if _unlink_unused(path, j.entry.stat):
                deleted.append(path)
                removed = True
                if j.entry.name in listing.records:
                    remove_record(listing.directory, j.entry.name)
        for sv in step_dirs:
            d = sv.dir
            if d.step >= oldest_kept or d.step in kept or not sv.settled:
                continue
            if _delete_dir(listing.directory, d):
                deleted.append(listing.directory / d.name)
                removed = True
                if d.name in listing.records:
                    remove_record(listing.directory, d.name)
        if removed:
            fsync_dir(listing.directory)
        _remove_stale_records(listing, now_ns, grace_ns)
        _remove_leftovers(listing.directory, now_ns, grace_ns)
    return deleted


def latest(
    directory: str | os.PathLike[str],
    *,
    verify_hash: bool = False,
    primary: str | os.PathLike[str] | None = None,
    grace: float = 300.0,
    pattern: str = DEFAULT_CHECKPOINT_PATTERN,
    layout: str = DEFAULT_LAYOUT,
    allow_nonfinite: bool = False,
) -> Checkpoint | None:
    """The newest complete checkpoint of ``directory`` worth resuming from, or None.

    A checkpoint whose record says the loss was NaN or infinite when it was saved
    (``loss_finite`` false: written by :func:`save` while the process's ``trainguard.Run`` had
    last reported a non-finite loss) is skipped, since its weights are most likely NaN too;
    ``allow_nonfinite=True`` takes it like any other. A checkpoint whose record says nothing of
    the loss (no run in the saving process, or an older trainguard) is taken.

    Complete: its size matches its record (for a mirror without a record, the ``primary``
    directory's record, or the primary file once ``grace`` has passed), its mtime is known, and
    with ``verify_hash`` its content hashes to the recorded SHA-256 (a file without a recorded
    hash then does not qualify).

    A step directory qualifies when committed (its trainguard record, or its framework's
    marker: ``layout`` as in the exporter's config, ``auto`` by default) with every file its
    record lists at its recorded size, or, committed by a marker only, nothing under it
    touched for ``grace`` seconds; a mirror's directory must also hold every file of the
    primary's directory of that step at its size. With ``verify_hash`` every file of the
    directory must hash to its record's SHA-256.

    Example::

        found = checkpoint.latest("/data/ckpt")          # a Checkpoint (path-like) or None
        if found is not None:
            model.load_state_dict(torch.load(found))
            first_step = found.step + 1
        out = checkpoint.latest("/data/out", pattern="checkpoint-{step}")   # Trainer dirs
        trainer.train(resume_from_checkpoint=str(out.path) if out else None)
    """
    pat = CheckpointPattern(pattern)
    plisting = read_listing(primary, pat, layout) if primary is not None else None
    listing = read_listing(directory, pat, layout, None if plisting is None else plisting.layout)
    now_ns = time.time_ns()
    grace_ns = int(grace * 1e9)
    judged = judge(listing, now_ns=now_ns, grace_ns=grace_ns, primary=plisting)
    steps = judge_dirs(listing, now_ns=now_ns, grace_ns=grace_ns, primary=plisting)
    candidates: list[tuple[int, str, Judged | StepVerdict]] = [
        (j.entry.step, j.entry.name, j) for j in judged if j.complete
    ]
    candidates += [(sv.dir.step, sv.dir.name, sv) for sv in steps if sv.complete]
    candidates.sort(key=lambda c: (c[0], c[1]), reverse=True)
    for step, name, found in candidates:
        finite = _loss_finite(listing, plisting, name)
        if finite is False and not allow_nonfinite:
            continue
        path = listing.directory / name
        files = found.files if isinstance(found, StepVerdict) else [found]
        if verify_hash and not all(_hash_matches(listing.directory, j) for j in files):
            continue
        if isinstance(found, StepVerdict):
            size = sum(j.entry.stat.st_size for j in found.files)
            return Checkpoint(
                path=path, step=step, size=size, sha256=None, directory=True, loss_finite=finite
            )
        return Checkpoint(
            path=path,
            step=step,
            size=found.entry.stat.st_size,
            sha256=found.expected_sha256,
            loss_finite=finite,
        )
    return None


def _hash_matches(directory: Path, j: Judged) -> bool:
    if j.expected_sha256 is None:
        return False
    try:
        sha, size = sha256_file(directory / j.entry.name)
    except OSError:
        return False
    return sha == j.expected_sha256 and size == j.expected_size
