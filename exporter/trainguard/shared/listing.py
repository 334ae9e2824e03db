"""What a checkpoint directory holds: matching files, step directories and their records.

The files whose names match a pattern (finished and ``.part``), each with its lstat, the step
directories whose names match it (committed or in flight, see :mod:`trainguard.shared.steps`),
and the records beside them. Links are never followed out of a checkpoint directory.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from trainguard.shared.manifest import ManifestError, Record, read_all_records
from trainguard.shared.pattern import PARTIAL_SUFFIX, CheckpointPattern
from trainguard.shared.stepdir import Entry, InFlight, StepDir, TreeMemo
from trainguard.shared.steps import DEFAULT_LAYOUT, TRACKERS, step_directories


@dataclass(frozen=True)
class Listing:
    directory: Path
    files: tuple[Entry, ...]  # finished names, regular files
    partials: tuple[Entry, ...]  # ``.part`` files
    records: Mapping[str, Record]
    dirs: tuple[StepDir, ...] = ()  # committed step directories
    inflight: tuple[InFlight, ...] = ()  # step directories being written, or orphans
    layout: str = "files"  # the layout the step directories were judged by (auto resolved)


#: name -> (step, is a .part) of the names that matched a pattern in the previous listing
#: (step -1: a tracker file of a framework, beside its step directories)
StepMemo = dict[str, tuple[int, bool]]


class Found:
    """What one listing gathers beyond the checkpoint files: step directories and tracker files.

    They are resolved into committed and in-flight steps by :meth:`finish`.
    """

    def __init__(
        self, pattern: CheckpointPattern, layout: str, fallback: str | None = None
    ) -> None:
        self.pattern = pattern
        self.layout = layout
        self.fallback = fallback if fallback not in (None, "none", "files") else None
        self.dirs_wanted = layout != "files"
        self.candidates: list[tuple[str, int, bool]] = []
        self.trackers: set[str] = set()

    def directory(self, name: str, step: int, partial: bool) -> bool:
        """Note a directory whose name matched the pattern; True when it is a step directory.

        ``partial``: it matched as a .part. A step directory may be under its final or temporary
        name.
        """
        if not self.dirs_wanted:
            return False
        final = None if partial else self.pattern.dir_step(name)
        if final is not None:
            self.candidates.append((name, final, False))
            return True
        temp = self.pattern.temp_dir_step(name)
        if temp is not None:
            self.candidates.append((name, temp, True))
            return True
        return False

    def finish(
        self,
        directory: Path,
        dir_fd: int | None,
        records: Mapping[str, Record],
        memo: TreeMemo | None,
    ) -> tuple[tuple[StepDir, ...], tuple[InFlight, ...], str]:
        if not self.candidates and not self.trackers:
            return (), (), "files" if self.layout == "files" else "none"
        return step_directories(
            directory,
            dir_fd,
            self.pattern,
            self.layout,
            records,
            self.candidates,
            self.trackers,
            memo,
            self.fallback,
        )


def classify(pattern: CheckpointPattern, name: str, dirs: bool) -> tuple[int, bool] | None:
    """(step, is a .part) of a name the pattern matches; (-1, False) for a tracker file.

    The name may match as a file, a .part, or (where ``dirs``) a step directory under a final or
    temporary name.
    """
    parsed = pattern.step(name)
    if parsed is not None:
        return parsed, False
    parsed = pattern.partial_step(name)
    if parsed is not None:
        return parsed, True
    if not dirs:
        return None
    if name in TRACKERS:
        return -1, False
    parsed = pattern.temp_dir_step(name)
    if parsed is not None:
        return parsed, True
    return None


def list_directory(
    directory: Path,
    pattern: CheckpointPattern,
    records: Mapping[str, Record],
    memo: StepMemo | None = None,
    *,
    dir_fd: int | None = None,
    layout: str = DEFAULT_LAYOUT,
    tree_memo: TreeMemo | None = None,
    fallback: str | None = None,
) -> Listing:
    """The checkpoints of a directory.

    Only names matching the pattern are stat'ed, so a directory of 100 000 unrelated entries
    costs one listing. A matching name that is a symbolic link, or a record naming anything but
    a regular file, is a ManifestError: links are never followed out of a checkpoint directory.

    ``memo`` (the same dict at every listing of this directory with this pattern) keeps the
    steps parsed from the names that matched last time; it is replaced by this listing's, so
    it only ever holds names that exist. ``dir_fd``, an open descriptor of ``directory``, is
    listed instead of the path. ``layout`` says how step directories are committed
    (:data:`trainguard.shared.steps.LAYOUTS`); ``tree_memo`` remembers their trees between
    listings; ``fallback`` is the layout taken where ``auto`` finds nothing to tell by (a
    mirror's: its primary's).
    """
    files: list[Entry] = []
    partials: list[Entry] = []
    old = memo or {}
    seen: StepMemo = {}
    found = Found(pattern, layout, fallback)
    with os.scandir(directory if dir_fd is None else dir_fd) as it:
        for entry in it:
            name = entry.name
            known = old.get(name)
            if known is None:
                known = classify(pattern, name, found.dirs_wanted)
                if known is None:
                    continue
            seen[name] = known
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # renamed or pruned since the listing (a .part just committed)
            place(directory, name, known, st, records, files, partials, found)
    if memo is not None:
        memo.clear()
        memo.update(seen)
    dirs, inflight, resolved = found.finish(directory, dir_fd, records, tree_memo)
    return Listing(directory, tuple(files), tuple(partials), records, dirs, inflight, resolved)


def place(
    directory: Path,
    name: str,
    known: tuple[int, bool],
    st: os.stat_result,
    records: Mapping[str, Record],
    files: list[Entry],
    partials: list[Entry],
    found: Found,
) -> None:
    """File a matched name by its lstat.

    It is a checkpoint file or .part, a step directory, or a tracker file.
    """
    step, partial = known
    if stat.S_ISREG(st.st_mode):
        if step < 0:
            found.trackers.add(name)
        elif not partial:
            files.append(Entry(name, step, st))
        elif name.endswith(PARTIAL_SUFFIX):  # not a file under a directory's temporary name
            partials.append(Entry(name, step, st))
        return
    if stat.S_ISDIR(st.st_mode) and step >= 0 and found.directory(name, step, partial):
        return
    not_regular(directory, name, st, records)


def not_regular(
    directory: Path, name: str, st: os.stat_result, records: Mapping[str, Record]
) -> None:
    """Check a checkpoint's name on something neither a regular file nor a step directory.

    It is an error when it is a link or has a record, else (a directory named like a checkpoint
    where step directories are not watched) not a checkpoint at all.
    """
    if stat.S_ISLNK(st.st_mode):
        raise ManifestError(f"{directory / name} is a symbolic link; links are not followed")
    rec = records.get(name)
    if rec is not None and not (stat.S_ISDIR(st.st_mode) and rec.files is not None):
        raise ManifestError(f"record for {directory / name} names a non-regular file")


def read_listing(
    directory: str | os.PathLike[str],
    pattern: CheckpointPattern,
    layout: str = DEFAULT_LAYOUT,
    fallback: str | None = None,
) -> Listing:
    """Records and checkpoints of a directory, uncached (the library side)."""
    path = Path(directory)
    return list_directory(path, pattern, read_all_records(path), layout=layout, fallback=fallback)
