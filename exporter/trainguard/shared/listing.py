"""What a checkpoint directory holds: the files whose names match a pattern (finished and
``.part``), each with its lstat, and the records beside them. Links are never followed out of a
checkpoint directory."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from trainguard.shared.manifest import ManifestError, Record, read_all_records
from trainguard.shared.pattern import CheckpointPattern


class Entry(NamedTuple):
    """A checkpoint file (or ``.part``) found in a directory, with its lstat. (A named tuple:
    one is built per file per scrape, and a frozen dataclass costs several times more.)"""

    name: str
    step: int
    stat: os.stat_result


@dataclass(frozen=True)
class Listing:
    directory: Path
    files: tuple[Entry, ...]  # finished names, regular files
    partials: tuple[Entry, ...]  # ``.part`` files
    records: Mapping[str, Record]


#: name -> (step, is a .part) of the names that matched a pattern in the previous listing
StepMemo = dict[str, tuple[int, bool]]


def list_directory(
    directory: Path,
    pattern: CheckpointPattern,
    records: Mapping[str, Record],
    memo: StepMemo | None = None,
    *,
    dir_fd: int | None = None,
) -> Listing:
    """The checkpoints of a directory. Only names matching the pattern are stat'ed, so a
    directory of 100 000 unrelated entries costs one listing. A matching name that is a
    symbolic link, or a record naming anything but a regular file, is a ManifestError: links
    are never followed out of a checkpoint directory.

    ``memo`` (the same dict at every listing of this directory with this pattern) keeps the
    steps parsed from the names that matched last time; it is replaced by this listing's, so
    it only ever holds names that exist. ``dir_fd``, an open descriptor of ``directory``, is
    listed instead of the path."""
    files: list[Entry] = []
    partials: list[Entry] = []
    old = memo or {}
    seen: StepMemo = {}
    with os.scandir(directory if dir_fd is None else dir_fd) as it:
        for entry in it:
            name = entry.name
            known = old.get(name)
            if known is None:
                parsed = pattern.step(name)
                if parsed is None:
                    parsed = pattern.partial_step(name)
                    if parsed is None:
                        continue
                    known = (parsed, True)
                else:
                    known = (parsed, False)
            seen[name] = known
            step, partial = known
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # renamed or pruned since the listing (a .part just committed)
            if not stat.S_ISREG(st.st_mode):
                not_regular(directory, name, st, records)
                continue
            (partials if partial else files).append(Entry(name, step, st))
    if memo is not None:
        memo.clear()
        memo.update(seen)
    return Listing(directory, tuple(files), tuple(partials), records)


def not_regular(
    directory: Path, name: str, st: os.stat_result, records: Mapping[str, Record]
) -> None:
    """A checkpoint's name on something that is not a regular file: an error when it is a link
    or has a record, else (a directory named like a checkpoint) not a checkpoint at all."""
    if stat.S_ISLNK(st.st_mode):
        raise ManifestError(f"{directory / name} is a symbolic link; links are not followed")
    if name in records:
        raise ManifestError(f"record for {directory / name} names a non-regular file")


def read_listing(directory: str | os.PathLike[str], pattern: CheckpointPattern) -> Listing:
    """Records and checkpoints of a directory, uncached (the library side)."""
    path = Path(directory)
    return list_directory(path, pattern, read_all_records(path))
