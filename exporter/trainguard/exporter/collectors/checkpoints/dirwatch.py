"""What the exporter remembers of a checkpoint directory between scrapes.

It is remembered so that an unchanged directory is not listed, nor its records read and parsed,
at every scrape (see :class:`DirectoryWatch` for when an unchanged stat is trusted).
"""

from __future__ import annotations

import os
import stat
import time
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path

from trainguard.shared.fileio import DIR_FD, O_CLOEXEC, O_DIRECTORY
from trainguard.shared.listing import Found, Listing, StepMemo, list_directory, place
from trainguard.shared.manifest import (
    MANIFEST_DIR,
    Record,
    RecordKey,
    open_manifest_dir,
    read_records,
)
from trainguard.shared.pattern import CheckpointPattern
from trainguard.shared.stepdir import Entry, StepDir, Tree
from trainguard.shared.steps import DEFAULT_LAYOUT


class NotMounted(Exception):
    """A checkpoint location seen as a mount point is now a plain directory.

    Its volume was unmounted.
    """


#: a directory whose stat stays the same is trusted to hold what it held once a full read has
#: confirmed it at least this long (by our own clock) after that stat was first seen: longer
#: than any filesystem's timestamp granularity (FAT's is 2 s), so that a change made within
#: the clock tick of the stat we saw, which leaves that stat as it was, has happened before the
#: confirming read. No file timestamp is compared with our clock, so skewed NFS clocks do not
#: matter.
SETTLE_SECONDS = 3.0
#: a trusted directory is read in full again at least this often all the same: a record edited
#: in place rather than replaced by a rename (which every trainguard writer does) changes no
#: directory stat, nor does a server clock stepped back into the same tick
REVALIDATE_SECONDS = 60.0


class DirectoryWatch:
    """Whether a directory may hold other entries than at its last full read.

    Creating, renaming or removing an entry changes the directory's mtime and ctime, so an
    unchanged stat means unchanged entries, once that stat has settled (see
    :data:`SETTLE_SECONDS`). What it says nothing about is the content of the entries
    themselves.
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        revalidate: float = REVALIDATE_SECONDS,
    ) -> None:
        self._clock = clock
        self._revalidate = revalidate
        self._key: tuple[int, ...] | None = None
        self._since = 0.0  # when the directory was first seen with _key
        self._checked_at = 0.0
        self._read_at = 0.0
        self._trusted = False  # a full read confirmed _key after it settled

    def unchanged(self, st: os.stat_result) -> bool:
        """True when the directory, with this stat now, holds what the last full read saw.

        When False, read it in full and then call :meth:`read_done`.
        """
        key = (st.st_dev, st.st_ino, st.st_size, st.st_nlink, st.st_mtime_ns, st.st_ctime_ns)
        now = self._checked_at = self._clock()
        if key != self._key:
            self._key, self._since, self._trusted = key, now, False
            return False
        if self._trusted and now - self._read_at < self._revalidate:
            return True
        self._trusted = False
        return False

    def read_done(self) -> None:
        """A full read that started after the last :meth:`unchanged` succeeded."""
        self._read_at = self._checked_at
        self._trusted = self._checked_at - self._since >= SETTLE_SECONDS

    def forget(self) -> None:
        self._key, self._trusted = None, False


class RecordCache:
    """The records of one directory, re-read only where they changed.

    Every writer commits a record by a rename into ``.trainguard/``, so while that directory is
    unchanged (:class:`DirectoryWatch`) its records are not listed again; otherwise only record
    files whose inode, size, mtime or ctime changed are re-read. The mapping returned is the
    same object for as long as the records are the same.
    """

    def __init__(self, directory: Path, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.directory = directory
        self._cache: dict[str, tuple[RecordKey, Record]] = {}
        self._records: Mapping[str, Record] = {}
        self._watch = DirectoryWatch(clock)

    def read(self, dir_fd: int | None = None) -> Mapping[str, Record]:
        """All records of the directory.

        ``dir_fd`` is the directory already opened, so that the records read are those of the
        directory the caller checked. Raises ManifestError or OSError when any is unreadable,
        or when the directory itself is missing or not a directory.
        """
        dfd = open_manifest_dir(self.directory, dir_fd)
        if dfd is None:
            self._cache.clear()
            self._watch.forget()
            if self._records:
                self._records = {}
            return self._records
        try:
            if not self._watch.unchanged(os.fstat(dfd)):
                fresh = read_records(dfd, self.directory / MANIFEST_DIR, self._cache)
                old = self._cache
                if len(fresh) != len(old) or any(old.get(n) is not v for n, v in fresh.items()):
                    self._records = {name: rec for name, (_, rec) in fresh.items()}
                self._cache = fresh
                self._watch.read_done()
        finally:
            os.close(dfd)
        return self._records


def _spread(rel: str) -> float:
    """How often the directories and files of one step tree are read again in full.

    It is between half of :data:`REVALIDATE_SECONDS` and all of it, fixed per path, so that the
    trees of a location first read in one scrape do not all come due in the same later one.
    """
    return REVALIDATE_SECONDS * (0.5 + (zlib.crc32(rel.split("/", 1)[0].encode()) % 1000) / 2000)


class StepTreeMemo:
    """What is remembered of the directories under a location's step directories.

    See :class:`trainguard.shared.stepdir.TreeMemo`: each directory's file and subdirectory
    names, trusted while its stat is unchanged (:class:`DirectoryWatch`), and whether each
    ``trainer_state.json`` parsed. Whatever a walk did not visit is forgotten at its end.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._dirs: dict[str, tuple[DirectoryWatch, list[str] | None, list[str] | None]] = {}
        self._markers: dict[tuple[int, ...], bool] = {}
        self._trees: dict[str, tuple[Tree, float]] = {}  # and when its files were stat'ed
        self._step_dirs: dict[str, StepDir] = {}
        self._used: set[str] = set()
        self._used_markers: set[tuple[int, ...]] = set()

    def begin(self) -> None:
        self._used = set()
        self._used_markers = set()

    def end(self) -> None:
        for rel in [r for r in self._dirs if r not in self._used]:
            del self._dirs[rel]
        for rel in [r for r in self._trees if r not in self._used]:
            del self._trees[rel]
        for name in [n for n in self._step_dirs if n not in self._used]:
            del self._step_dirs[name]
        for key in [k for k in self._markers if k not in self._used_markers]:
            del self._markers[key]

    def tree(self, rel: str) -> Tree | None:
        """A step tree whose files were stat'ed less than its :func:`_spread` (30-60 s) ago.

        While its directories are unchanged, its files are not stat'ed again until then (a file
        cut in place under an unchanged step directory shows within that time).
        """
        cached = self._trees.get(rel)
        if cached is None or self._clock() - cached[1] >= _spread(rel):
            return None
        return cached[0]

    def store_tree(self, rel: str, tree: Tree) -> None:
        self._trees[rel] = (tree, self._clock())

    def step_dir(self, name: str) -> StepDir | None:
        return self._step_dirs.get(name)

    def store_step_dir(self, step_dir: StepDir) -> None:
        self._step_dirs[step_dir.name] = step_dir

    def known(self, rel: str, st: os.stat_result) -> tuple[list[str], list[str]] | None:
        self._used.add(rel)
        memo = self._dirs.get(rel)
        if memo is None:
            memo = self._dirs[rel] = (DirectoryWatch(self._clock, _spread(rel)), None, None)
        watch, files, dirs = memo
        if watch.unchanged(st) and files is not None and dirs is not None:
            return files, dirs
        return None

    def store(self, rel: str, st: os.stat_result, files: list[str], dirs: list[str]) -> None:
        watch = (
            self._dirs[rel][0] if rel in self._dirs else DirectoryWatch(self._clock, _spread(rel))
        )
        if rel not in self._dirs:
            watch.unchanged(st)
        self._dirs[rel] = (watch, files, dirs)
        self._used.add(rel)
        watch.read_done()

    def forget(self, rel: str) -> None:
        self._dirs.pop(rel, None)

    def marker(self, key: tuple[int, ...]) -> bool | None:
        self._used_markers.add(key)
        return self._markers.get(key)

    def store_marker(self, key: tuple[int, ...], ok: bool) -> None:
        self._used_markers.add(key)
        self._markers[key] = ok


class CheckpointDirectory:
    """A checkpoint location as the exporter reads it at every scrape.

    While the directory is unchanged (:class:`DirectoryWatch`) the names that matched at the
    last full listing are the ones there, so each is stat'ed directly instead of listing the
    directory and parsing names again; each file is still stat'ed at every scrape, since a
    checkpoint overwritten in place changes no directory stat. The directories under step
    directories are treated alike (:class:`StepTreeMemo`): an unchanged one is not listed
    again, its files are stat'ed.
    """

    def __init__(
        self,
        directory: Path,
        pattern: CheckpointPattern,
        *,
        layout: str = DEFAULT_LAYOUT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.directory = directory
        self.pattern = pattern
        self.layout = layout
        self._steps: StepMemo = {}
        self._watch = DirectoryWatch(clock)
        self._tree = StepTreeMemo(clock)
        self._mounted_dev: int | None = None  # the device it was seen mounted from, if any
        #: the layout ``auto`` takes where this location's contents tell nothing (for a
        #: mirror: its primary's, set by the caller before each read)
        self.fallback: str | None = None

    def read(
        self, records: RecordCache, check: Callable[[os.stat_result], None] | None = None
    ) -> Listing:
        """The records (from ``records``, the cache of this directory) and checkpoints.

        All are read through one open descriptor of the directory after ``check`` has seen its
        stat (and not raised): a directory swapped for another after the check is not read.
        """
        if not DIR_FD:  # no openat (Windows): by path
            st = os.stat(self.directory)
            if check is not None:
                check(st)
            return list_directory(
                self.directory,
                self.pattern,
                records.read(),
                self._steps,
                layout=self.layout,
                fallback=self.fallback,
            )
        fd = os.open(self.directory, os.O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if check is not None:
                check(st)
            self._check_mounted(st, os.stat("..", dir_fd=fd))
            recs = records.read(dir_fd=fd)
            self._tree.begin()
            if self._watch.unchanged(st):
                listing = self._restat(fd, recs)
                if listing is not None:
                    self._tree.end()
                    return listing
                self._watch.forget()
            listing = list_directory(
                self.directory,
                self.pattern,
                recs,
                self._steps,
                dir_fd=fd,
                layout=self.layout,
                tree_memo=self._tree,
                fallback=self.fallback,
            )
            self._tree.end()
            self._watch.read_done()
            return listing
        finally:
            os.close(fd)

    def _check_mounted(self, st: os.stat_result, parent: os.stat_result) -> None:
        """Raise :class:`NotMounted` when a location seen as a mount point no longer is one.

        A location that is a volume's mount point shows, once the volume is unmounted, the
        empty directory underneath: "no checkpoints" where the truth is "cannot see them".
        Having seen it on another device than its parent, a later stat on its parent's device
        is an error, not an empty location.
        """
        if st.st_dev != parent.st_dev:
            self._mounted_dev = st.st_dev
        elif self._mounted_dev is not None:
            raise NotMounted(
                f"not mounted: the directory was a mount point (device {self._mounted_dev}) and "
                "is now on its parent's filesystem, so the checkpoints on that volume cannot be "
                "seen; mount it again (or restart the exporter if the volume is gone for good)"
            )

    def _restat(self, fd: int, records: Mapping[str, Record]) -> Listing | None:
        """The last listing's names, stat'ed afresh.

        None when one has gone (the directory changed after its stat was taken: list it).
        """
        files: list[Entry] = []
        partials: list[Entry] = []
        found = Found(self.pattern, self.layout, self.fallback)
        lstat = os.stat
        directory = self.directory
        for name, known in self._steps.items():
            try:
                st = lstat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                return None
            if stat.S_ISREG(st.st_mode) and known[0] >= 0 and not known[1]:
                files.append(Entry(name, known[0], st))  # the common case, inlined
                continue
            place(directory, name, known, st, records, files, partials, found)
        dirs, inflight, layout = found.finish(directory, fd, records, self._tree)
        return Listing(directory, tuple(files), tuple(partials), records, dirs, inflight, layout)
