"""What the checkpoint collector skips at a scrape when nothing changed, and proof that skipping
never changes an answer: the manifest directory is not listed again while its stat is the same
(and settled), a checkpoint directory's known names are stat'ed without listing it, and a
location whose files, records, primary and verifier answers are unchanged is not judged again.
Each is checked on real directories against the uncached answer."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.exporter_proc import Samples
from test_checkpoints_collector import samples_of
from trainguard.checkpoint import mirror, save
from trainguard.exporter.collectors.checkpoints.collector import CheckpointsCollector
from trainguard.exporter.collectors.checkpoints.dirwatch import (
    REVALIDATE_SECONDS,
    SETTLE_SECONDS,
    CheckpointDirectory,
    DirectoryWatch,
    RecordCache,
)
from trainguard.exporter.collectors.checkpoints.verifier import Verifier
from trainguard.exporter.config.model import CheckpointSettings
from trainguard.exporter.runs.targets import CheckpointTarget
from trainguard.shared import manifest
from trainguard.shared.manifest import Record, record_path, write_record
from trainguard.shared.pattern import CheckpointPattern

#: longer than the mtime granularity of the filesystems tests run on (ext4, tmpfs, xfs: a
#: jiffy at most): the caches assume that a directory changed after a stat we saw gets a
#: new timestamp once the clock has moved on, which a test that moves its own clock by seconds
#: while real time moves by microseconds must make true by waiting before each change
TICK = 0.02


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def fake_stat(mtime_ns: int, ctime_ns: int | None = None) -> os.stat_result:
    c = mtime_ns if ctime_ns is None else ctime_ns
    # the ten visible fields, then float times, then the nanosecond times
    return os.stat_result((0o40755, 7, 1, 2, 0, 0, 4096, 0, 0, 0, 0.0, 0.0, 0.0, 0, mtime_ns, c))


def test_directory_watch_trusts_a_stat_only_once_it_settled() -> None:
    clock = Clock()
    w = DirectoryWatch(clock)
    a = fake_stat(5_000_000_000)
    assert not w.unchanged(a)  # never seen
    w.read_done()
    # the same stat within the settle time: something may have changed in the same tick
    clock.now += SETTLE_SECONDS / 2
    assert not w.unchanged(a)
    w.read_done()  # this read started before the stat settled: it confirms nothing
    clock.now += SETTLE_SECONDS / 2
    assert not w.unchanged(a)
    w.read_done()  # started SETTLE_SECONDS after the stat was first seen: confirms it
    clock.now += 1
    assert w.unchanged(a)
    assert not w.unchanged(fake_stat(5_000_000_000, 6_000_000_000))  # ctime moved
    w.read_done()
    clock.now += SETTLE_SECONDS
    assert not w.unchanged(fake_stat(5_000_000_000, 6_000_000_000))
    w.read_done()
    assert w.unchanged(fake_stat(5_000_000_000, 6_000_000_000))
    # trusted, but read in full again after REVALIDATE_SECONDS whatever the stat says
    clock.now += REVALIDATE_SECONDS
    assert not w.unchanged(fake_stat(5_000_000_000, 6_000_000_000))
    # a full read that failed (no read_done) leaves it untrusted
    clock.now += 1
    assert not w.unchanged(fake_stat(5_000_000_000, 6_000_000_000))
    w.read_done()
    assert w.unchanged(fake_stat(5_000_000_000, 6_000_000_000))
    w.forget()
    assert not w.unchanged(fake_stat(5_000_000_000, 6_000_000_000))


def trusted_record_cache(directory: Path, clock: Clock) -> RecordCache:
    cache = RecordCache(directory, clock=clock)
    cache.read()
    clock.now += SETTLE_SECONDS
    cache.read()  # confirms the manifest directory's stat
    return cache


def test_record_cache_skips_an_unchanged_manifest_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    write_record(tmp_path, Record("step_1.pt", 1, 10, None, 1.0))
    cache = trusted_record_cache(tmp_path, clock)
    first = cache.read()
    listed: list[object] = []
    real = manifest.scandir_fd
    monkeypatch.setattr(manifest, "scandir_fd", lambda *a: listed.append(a) or real(*a))
    clock.now += 1
    assert cache.read() is first and listed == []  # trusted: not listed, same mapping
    # a record committed the way every writer does (rename) changes the directory: seen at once
    time.sleep(TICK)
    write_record(tmp_path, Record("step_2.pt", 2, 20, None, 2.0))
    assert set(cache.read()) == {"step_1.pt", "step_2.pt"} and len(listed) == 1
    time.sleep(TICK)
    os.unlink(record_path(tmp_path, "step_1.pt"))
    assert set(cache.read()) == {"step_2.pt"}


def test_a_record_edited_in_place_is_seen_within_the_revalidation_time(tmp_path: Path) -> None:
    """The documented limit: an in-place edit changes no directory stat. Before the directory
    settled it is seen at once, after that within REVALIDATE_SECONDS."""
    clock = Clock()
    write_record(tmp_path, Record("step_1.pt", 1, 10, None, 1.0))
    cache = RecordCache(tmp_path, clock=clock)
    assert cache.read()["step_1.pt"].size == 10

    def edit(size: int) -> None:
        path = record_path(tmp_path, "step_1.pt")
        with open(path, "r+b") as fh:  # in place, same inode: no directory change
            data = Record("step_1.pt", 1, size, None, 1.0).encode()
            fh.write(data)
            fh.truncate(len(data))

    edit(11)
    assert cache.read()["step_1.pt"].size == 11  # not trusted yet: read in full
    clock.now += SETTLE_SECONDS
    assert cache.read()["step_1.pt"].size == 11  # confirms
    edit(12)
    clock.now += REVALIDATE_SECONDS - 1
    assert cache.read()["step_1.pt"].size == 11  # trusted: the edit is not looked for
    clock.now += 1
    assert cache.read()["step_1.pt"].size == 12


def test_checkpoint_directory_stats_known_names_without_listing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    for step in (1, 2):
        (tmp_path / f"step_{step}.pt").write_bytes(b"x" * 100)
    (tmp_path / "step_3.pt.part").write_bytes(b"y")
    d = CheckpointDirectory(tmp_path, CheckpointPattern(), clock=clock)
    recs = RecordCache(tmp_path, clock=clock)
    d.read(recs)
    clock.now += SETTLE_SECONDS
    d.read(recs)  # confirms the directory's stat
    listings: list[object] = []
    real = os.scandir

    def scandir(*a: object) -> object:
        listings.append(a)
        return real(*a)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "scandir", scandir)
    # a checkpoint cut in place changes no directory stat: seen through its own stat
    os.truncate(tmp_path / "step_2.pt", 40)
    listing = d.read(recs)
    assert listings == []
    assert {e.name: e.stat.st_size for e in listing.files} == {"step_1.pt": 100, "step_2.pt": 40}
    assert [e.name for e in listing.partials] == ["step_3.pt.part"]
    # a new file changes the directory: listed in full
    time.sleep(TICK)
    (tmp_path / "step_4.pt").write_bytes(b"z")
    assert sorted(e.name for e in d.read(recs).files) == ["step_1.pt", "step_2.pt", "step_4.pt"]
    assert len(listings) == 1
    # a known name swapped for a link is refused, whichever way it is found
    clock.now += SETTLE_SECONDS
    d.read(recs)
    assert len(listings) == 2
    time.sleep(TICK)
    os.unlink(tmp_path / "step_1.pt")
    os.symlink("/etc/hostname", tmp_path / "step_1.pt")
    with pytest.raises(manifest.ManifestError, match="symbolic link"):
        d.read(recs)


def test_a_mirror_is_judged_again_when_its_primary_settles(
    tmp_path: Path, stopped_verifier: Verifier
) -> None:
    """A mirror's unrecorded file takes its expected size from the primary's file once that
    has settled: the mirror's verdict must not outlive the primary's unsettled files."""
    now = [time.time_ns()]
    (tmp_path / "p").mkdir()
    (tmp_path / "m").mkdir()
    for d in ("p", "m"):
        (tmp_path / d / "step_1.pt").write_bytes(b"x" * 100)
    old = now[0] - 2 * GRACE * 10**9
    os.utime(tmp_path / "m" / "step_1.pt", ns=(old, old))  # the copy settled, the primary not
    collector = CheckpointsCollector(
        lambda _scrape: [
            CheckpointTarget("r", "primary", tmp_path / "p"),
            CheckpointTarget("r", "backup", tmp_path / "m"),
        ],
        CheckpointSettings(grace_period_seconds=GRACE),
        verifier=stopped_verifier,
        clock_ns=lambda: now[0],
    )

    def backup(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str) -> object:
        return samples.get(
            (f"trainguard_checkpoint_{name}", frozenset({("run", "r"), ("location", "backup")}))
        )

    s, _ = samples_of(collector)
    assert backup(s, "unrecorded_files") == 1 and backup(s, "last_step") is None
    now[0] += (GRACE + 1) * 10**9
    s, _ = samples_of(collector)
    assert backup(s, "unrecorded_files") == 0 and backup(s, "last_step") == 1


def test_the_directory_checked_is_the_directory_read(tmp_path: Path) -> None:
    """The owner check sees the stat of the open directory, and records and checkpoints are
    read through that same descriptor: swapping the path right after the check (for a link to,
    or a directory of, someone else's checkpoints) changes nothing that scrape."""
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    for d, size in ((mine, 10), (theirs, 99)):
        d.mkdir()
        save(b"x" * size, d / "step_1.pt")
    location = tmp_path / "loc"
    os.rename(mine, location)
    checked: list[int] = []

    def check_then_swap(st: os.stat_result) -> None:
        checked.append(st.st_ino)
        os.rename(location, tmp_path / "moved")
        os.symlink(theirs, location)

    d = CheckpointDirectory(location, CheckpointPattern())
    listing = d.read(RecordCache(location), check_then_swap)
    assert checked == [os.stat(tmp_path / "moved").st_ino]
    assert [(e.name, e.stat.st_size) for e in listing.files] == [("step_1.pt", 10)]
    assert listing.records["step_1.pt"].size == 10


# -- the cached collector answers exactly what an uncached one does ----------------------------

GRACE = 300
OPS = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "save",
                "mirror",
                "truncate",
                "append",
                "rewrite_same_size",
                "backdate",
                "remove",
                "remove_record",
                "unrecorded",
                "unrecorded_both",
                "part",
                "commit_part",
                "later",
                "much_later",
            ]
        ),
        st.integers(1, 4),
    ),
    min_size=1,
    max_size=12,
)


class Locations:
    def __init__(self, root: Path, clock_ns: list[int], mono: Clock) -> None:
        self.p = root / "p"
        self.m = root / "m"
        self.p.mkdir()
        self.m.mkdir()
        self.clock_ns = clock_ns
        self.mono = mono

    def targets(self, _scrape: object = None) -> list[CheckpointTarget]:
        return [
            CheckpointTarget("r", "primary", self.p),
            CheckpointTarget("r", "backup", self.m),
            CheckpointTarget("u", "primary", self.m, trust_unrecorded=True),
        ]

    def apply(self, op: str, step: int) -> None:
        p, m = self.p / f"step_{step}.pt", self.m / f"step_{step}.pt"
        if op == "later":
            self.clock_ns[0] += 200 * 10**9  # crosses the grace period every other time
            self.mono.now += SETTLE_SECONDS
            return
        if op == "much_later":
            self.clock_ns[0] += 10 * GRACE * 10**9
            self.mono.now += REVALIDATE_SECONDS
            return
        time.sleep(TICK)
        if op == "save":
            save(os.urandom(100 + step), p)
        elif op == "mirror" and p.exists():
            # a truncated or rewritten source is refused: that is fine here
            with contextlib.suppress(Exception):
                mirror(p, self.m)
        elif op in ("truncate", "append", "rewrite_same_size", "backdate"):
            target = p if step % 2 else m
            if not target.exists():
                return
            if op == "truncate":
                os.truncate(target, max(0, target.stat().st_size - 7))
            elif op == "append":
                with open(target, "ab") as fh:
                    fh.write(b"more")
            elif op == "rewrite_same_size":
                st0 = target.stat()
                with open(target, "r+b") as fh:
                    fh.write(os.urandom(st0.st_size))
                os.utime(target, ns=(st0.st_atime_ns, st0.st_mtime_ns))  # only ctime moves
            else:
                t = self.clock_ns[0] - 3 * GRACE * 10**9
                os.utime(target, ns=(t, t))
        elif op == "remove":
            for f in (p, m):
                if f.exists():
                    f.unlink()
        elif op == "remove_record":
            for d in (self.p, self.m):
                rec = record_path(d, f"step_{step}.pt")
                if rec.exists():
                    rec.unlink()
        elif op == "unrecorded":
            (m if step % 2 else p).write_bytes(os.urandom(50 + step))
        elif op == "unrecorded_both":
            data = os.urandom(60 + step)
            for f in (p, m):
                f.write_bytes(data)
        elif op == "part":
            (self.p / f"step_{step}.pt.part").write_bytes(b"half")
        elif op == "commit_part":
            part = self.p / f"step_{step}.pt.part"
            if part.exists():
                os.rename(part, p)


def without_free_space(result: tuple[Samples, list[str]]) -> tuple[Samples, list[str]]:
    """The samples with free space present but not compared: it is read afresh at every scrape
    (never cached), and anything else writing to the same disk changes it between the two
    reads."""
    samples, errors = result
    return {
        key: (1.0 if key[0] == "trainguard_checkpoint_filesystem_avail_bytes" else v)
        for key, v in samples.items()
    }, errors


@pytest.fixture
def stopped_verifier() -> Iterator[Verifier]:
    """A verifier that never hashes: every answer stays "pending", so both collectors see the
    same answers whenever they ask."""
    v = Verifier(1e9)
    v.stop()
    yield v


@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(ops=OPS)
def test_cached_answers_equal_uncached_ones(
    tmp_path_factory: pytest.TempPathFactory, stopped_verifier: Verifier, ops: list[tuple[str, int]]
) -> None:
    clock_ns = [time.time_ns()]
    mono = Clock()
    locs = Locations(tmp_path_factory.mktemp("caches"), clock_ns, mono)

    def collector() -> CheckpointsCollector:
        return CheckpointsCollector(
            locs.targets,
            CheckpointSettings(grace_period_seconds=GRACE),
            verifier=stopped_verifier,
            clock_ns=lambda: clock_ns[0],
            monotonic=mono,
        )

    cached = collector()
    for op, step in [("save", 1), *ops, ("later", 1), ("later", 1)]:
        locs.apply(op, step)
        got = without_free_space(samples_of(cached))
        want = without_free_space(samples_of(collector()))  # knows nothing: reads everything
        diff = {
            k: (got[0].get(k), want[0].get(k))
            for k in set(got[0]) | set(want[0])
            if got[0].get(k) != want[0].get(k)
        }
        assert got == want, (op, step, diff)
