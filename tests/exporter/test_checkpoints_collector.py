"""The checkpoints collector: in-process with a controlled clock for the judging rules, and the
real exporter process for the field-report cases."""

from __future__ import annotations

import os
import shutil
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from helpers.exporter_proc import Exporter, Samples, poll, select, value
from helpers.wait import wait_for
from trainguard.checkpoint import mirror, save
from trainguard.exporter.collectors.checkpoints.collector import CheckpointsCollector
from trainguard.exporter.collectors.checkpoints.verifier import Verifier
from trainguard.exporter.config.model import CheckpointSettings
from trainguard.exporter.runs.targets import CheckpointTarget
from trainguard.exporter.scrape.context import Scrape
from trainguard.shared.manifest import MANIFEST_DIR, Record, record_path

RUN = "r"


def samples_of(collector: CheckpointsCollector) -> tuple[Samples, list[str]]:
    scrape = Scrape()
    out: Samples = {}
    for family in collector.gather(scrape):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out, scrape.errors


class Setup:
    """A primary and a mirror of run "r", judged by an in-process collector whose clock the
    test moves (grace period 300 s)."""

    def __init__(self, tmp_path: Path, **settings: float) -> None:
        self.p = tmp_path / "p"
        self.m = tmp_path / "m"
        self.p.mkdir()
        self.m.mkdir()
        self.now = time.time_ns()
        self.verifier = Verifier(1e9)
        self.extra: list[CheckpointTarget] = []
        self.collector = CheckpointsCollector(
            lambda _scrape: [
                CheckpointTarget(RUN, "primary", self.p),
                CheckpointTarget(RUN, "backup", self.m),
                *self.extra,
            ],
            CheckpointSettings(**settings),  # type: ignore[arg-type]
            verifier=self.verifier,
            clock_ns=lambda: self.now,
        )

    def later(self, seconds: float) -> None:
        self.now += int(seconds * 1e9)

    def scrape(self) -> tuple[Samples, list[str]]:
        return samples_of(self.collector)

    def v(
        self, samples: Samples, name: str, location: str = "primary", **labels: str
    ) -> float | None:
        return value(samples, f"trainguard_checkpoint_{name}", run=RUN, location=location, **labels)

    def settle_hashes(self, location: str = "backup") -> Samples:
        def settled() -> list[Samples] | None:
            s, _ = self.scrape()
            return [s] if self.v(s, "hash_pending_files", location) == 0 else None

        return wait_for(settled, 60, 0.02, f"no hash pending at {location}")[0]


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    s = Setup(tmp_path)
    yield s
    s.verifier.stop()


def test_complete_checkpoints_and_their_sizes(setup: Setup) -> None:
    for step in (1, 2, 3):
        save(os.urandom(1000 + step), setup.p / f"step_{step}.pt")
    mirror(setup.p / "step_2.pt", setup.m)
    s, errors = setup.scrape()
    assert errors == []
    v = setup.v
    assert v(s, "location_up") == 1 and v(s, "location_up", "backup") == 1
    assert v(s, "last_step") == 3 and v(s, "last_step", "backup") == 2
    mtime = os.stat(setup.p / "step_3.pt").st_mtime_ns / 1e9
    assert v(s, "last_timestamp_seconds") == pytest.approx(mtime)
    assert v(s, "files") == 3 and v(s, "bytes") == 3006
    assert v(s, "size_bytes", step="2") == 1002 and v(s, "expected_size_bytes", step="2") == 1002
    assert v(s, "expected_size_bytes", "backup", step="2") == 1002
    for name in ("truncated_files", "hash_mismatch_files", "partial_files", "unrecorded_files"):
        assert v(s, name) == 0, name
    assert v(s, "oldest_partial_age_seconds") is None
    assert v(s, "filesystem_avail_bytes") > 0  # type: ignore[operator]


def test_truncated_at_once_by_its_own_record_after_the_grace_without_one(setup: Setup) -> None:
    save(os.urandom(1000), setup.p / "step_1.pt")
    save(os.urandom(10_000), setup.p / "step_2.pt")
    mirror(setup.p / "step_1.pt", setup.m)
    mirror(setup.p / "step_2.pt", setup.m)
    os.truncate(setup.m / "step_2.pt", 7300)  # the field report: a mirror cut at 73%
    # a copy another tool is still writing (no record of its own): judged against the
    # primary's record, it may still grow
    shutil.copy(setup.p / "step_1.pt", setup.m / "step_3.pt")
    save(os.urandom(5000), setup.p / "step_3.pt")
    s, _ = setup.scrape()
    # its own record was committed once the copy was whole: nothing writes it, truncated now
    assert setup.v(s, "truncated_files", "backup") == 1
    assert setup.v(s, "last_step", "backup") == 1
    # which step is damaged, so the rules can tell whether the primary still holds it intact
    assert setup.v(s, "newest_damaged_step", "backup", damage="truncated") == 2
    assert setup.v(s, "newest_damaged_step", "backup", damage="hash_mismatch") is None
    assert setup.v(s, "newest_damaged_step", damage="truncated") is None
    assert setup.v(s, "size_bytes", "backup", step="2") == 7300
    assert setup.v(s, "expected_size_bytes", "backup", step="2") == 10_000
    setup.later(301)
    s, _ = setup.scrape()
    # the unrecorded copy, settled and still short of the primary's record: truncated too
    assert setup.v(s, "truncated_files", "backup") == 2
    assert setup.v(s, "newest_damaged_step", "backup", damage="truncated") == 3
    os.unlink(setup.m / "step_3.pt")
    # larger than recorded is not complete either
    with open(setup.m / "step_1.pt", "ab") as f:
        f.write(b"junk")
    setup.later(301)
    s, _ = setup.scrape()
    assert setup.v(s, "oversized_files", "backup") == 1
    assert setup.v(s, "last_step", "backup") is None


def test_mirror_without_records_is_judged_against_the_primary(setup: Setup) -> None:
    save(os.urandom(5000), setup.p / "step_1.pt")
    (setup.m / "step_1.pt").write_bytes((setup.p / "step_1.pt").read_bytes())  # a plain cp
    (setup.p / "step_2.pt").write_bytes(b"x" * 100)  # no record on the primary either
    (setup.m / "step_2.pt").write_bytes(b"x" * 40)
    (setup.m / "step_3.pt").write_bytes(b"x")  # not on the primary at all
    s, _ = setup.scrape()
    assert setup.v(s, "last_step", "backup") == 1
    assert setup.v(s, "unrecorded_files", "backup") == 2  # primary's step 2 may be in flight
    assert setup.v(s, "unrecorded_files") == 1  # the primary's own unrecorded step 2
    setup.later(301)
    s, _ = setup.scrape()
    assert setup.v(s, "unrecorded_files", "backup") == 1
    assert setup.v(s, "truncated_files", "backup") == 1
    assert setup.v(s, "expected_size_bytes", "backup", step="2") == 100
    assert setup.v(s, "expected_size_bytes", "backup", step="3") is None
    assert setup.v(s, "last_step") == 1  # unrecorded is never complete


def test_hash_mismatch_found_in_the_background(setup: Setup) -> None:
    save(os.urandom(100_000), setup.p / "step_1.pt")
    save(os.urandom(100_000), setup.p / "step_2.pt")
    mirror(setup.p / "step_1.pt", setup.m)
    mirror(setup.p / "step_2.pt", setup.m)
    with open(setup.m / "step_2.pt", "r+b") as f:
        f.seek(50_000)
        f.write(b"\xff" * 16)  # bytes changed, size not
    s, _ = setup.scrape()
    assert setup.v(s, "hash_pending_files", "backup") == 2  # in the grace period: not hashed
    assert setup.v(s, "last_step", "backup") == 2
    assert len(setup.verifier) == 0
    setup.later(301)
    s = setup.settle_hashes()
    assert setup.v(s, "hash_mismatch_files", "backup") == 1
    assert setup.v(s, "hash_mismatch_files") == 0
    assert setup.v(s, "last_step", "backup") == 1  # known garbage is not complete
    assert setup.v(s, "newest_damaged_step", "backup", damage="hash_mismatch") == 2
    assert setup.v(s, "newest_damaged_step", "backup", damage="truncated") is None


def test_content_rewritten_under_its_old_mtime_is_hashed_again(setup: Setup) -> None:
    save(os.urandom(100_000), setup.p / "step_1.pt")
    setup.later(301)
    s = setup.settle_hashes("primary")
    assert setup.v(s, "hash_mismatch_files") == 0 and setup.v(s, "last_step") == 1
    before = os.stat(setup.p / "step_1.pt")
    with open(setup.p / "step_1.pt", "r+b") as f:
        f.write(os.urandom(100_000))  # same size
    os.utime(setup.p / "step_1.pt", ns=(before.st_atime_ns, before.st_mtime_ns))
    s = setup.settle_hashes("primary")
    assert setup.v(s, "hash_mismatch_files") == 1 and setup.v(s, "last_step") is None


def test_partials_and_unknown_mtimes(setup: Setup) -> None:
    save(b"a" * 10, setup.p / "step_1.pt")
    part = setup.p / "step_2.pt.part"
    part.write_bytes(b"half")
    (setup.p / "step_3.pt.part").write_bytes(b"")
    os.utime(setup.p / "step_3.pt.part", ns=(0, 0))
    save(b"b" * 10, setup.p / "step_4.pt")
    os.utime(setup.p / "step_4.pt", ns=(0, 0))
    setup.later(400)
    s, _ = setup.scrape()
    assert setup.v(s, "partial_files") == 2
    age = (setup.now - os.stat(part).st_mtime_ns) / 1e9
    assert setup.v(s, "oldest_partial_age_seconds") == pytest.approx(age)
    assert setup.v(s, "unknown_mtime_files") == 2
    assert setup.v(s, "last_step") == 1  # step 4 has an unknown mtime: never complete
    os.truncate(setup.p / "step_4.pt", 1)
    os.utime(setup.p / "step_4.pt", ns=(0, 0))
    s, _ = setup.scrape()
    assert setup.v(s, "truncated_files") == 0  # never "old" either


def test_size_series_are_bounded(tmp_path: Path) -> None:
    s = Setup(tmp_path, size_series_per_location=3)
    try:
        for step in range(1, 11):
            save(b"x" * step, s.p / f"step_{step}.pt")
        (s.p / "step_10.extra").write_bytes(b"y" * 5)  # two files of one step add up
        samples, _ = s.scrape()
        sizes = select(samples, "trainguard_checkpoint_size_bytes", location="primary")
        assert sorted(dict(k)["step"] for k in sizes) == ["10", "8", "9"]
        assert s.v(samples, "size_bytes", step="10") == 15
        assert s.v(samples, "expected_size_bytes", step="10") is None  # one file has no record
        assert s.v(samples, "files") == 11
    finally:
        s.verifier.stop()


def break_by(kind: str, target: Path, tmp_path: Path) -> str:
    """Make a location unreadable in one of the ways the field sees; returns the expected
    words of the reason."""
    if kind == "vanished":
        os.rename(target, tmp_path / "elsewhere")
        return "No such file or directory"
    if kind == "replaced-by-file":
        os.rename(target, tmp_path / "elsewhere")
        target.write_text("not a directory")
        return "Not a directory"
    if kind == "dangling-link":
        os.rename(target, tmp_path / "elsewhere")
        target.symlink_to(tmp_path / "nowhere")
        return "No such file or directory"
    if kind == "link-loop":
        os.rename(target, tmp_path / "elsewhere")
        target.symlink_to(target)
        return "symbolic link loop"
    if kind == "malformed-manifest":
        (target / MANIFEST_DIR / "step_1.pt.json").write_text('{"version": 1')
        return "not a JSON record"
    if kind == "manifest-points-outside":
        rec = (
            Record("step_1.pt", 1, 10, None, 1.0)
            .encode()
            .replace(b'"step_1.pt"', b'"../step_1.pt"')
        )
        (target / MANIFEST_DIR / "step_1.pt.json").write_bytes(rec)
        return "not a plain file name"
    if kind == "record-is-a-link":
        rp = record_path(target, "step_1.pt")
        os.rename(rp, tmp_path / "moved.json")
        rp.symlink_to(tmp_path / "moved.json")
        return "link"
    if kind == "checkpoint-is-a-link":
        (target / "step_5.pt").symlink_to("/etc/hostname")
        return "is a symbolic link"
    raise AssertionError(kind)


BREAKS = [
    "vanished",
    "replaced-by-file",
    "dangling-link",
    "link-loop",
    "malformed-manifest",
    "manifest-points-outside",
    "record-is-a-link",
    "checkpoint-is-a-link",
]


@pytest.mark.parametrize("kind", BREAKS)
def test_a_broken_location_fails_alone(setup: Setup, tmp_path: Path, kind: str) -> None:
    save(b"x" * 10, setup.p / "step_1.pt")
    mirror(setup.p / "step_1.pt", setup.m)
    reason = break_by(kind, setup.m, tmp_path)
    s, errors = setup.scrape()
    assert setup.v(s, "location_up", "backup") == 0
    assert setup.v(s, "last_step", "backup") is None
    assert setup.v(s, "files", "backup") is None
    assert setup.v(s, "location_up") == 1 and setup.v(s, "last_step") == 1
    assert len(errors) == 1
    assert errors[0].startswith(f"checkpoints of run 'r', location 'backup' at {setup.m}: ")
    assert reason in errors[0], errors[0]


def test_permission_denied_in_process(setup: Setup, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same path as chmod 000 for a non-root exporter, whoever runs the tests."""
    real = os.open

    def open_(path: object, *args: Any, **kwargs: Any) -> int:
        if str(path) == str(setup.m):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", open_)
    s, errors = setup.scrape()
    assert setup.v(s, "location_up", "backup") == 0 and setup.v(s, "location_up") == 1
    assert errors == [f"checkpoints of run 'r', location 'backup' at {setup.m}: Permission denied"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a chmod 000 directory anyway")
def test_chmod_000_directory(setup: Setup) -> None:
    os.chmod(setup.m, 0)
    try:
        s, errors = setup.scrape()
    finally:
        os.chmod(setup.m, 0o755)
    assert setup.v(s, "location_up", "backup") == 0 and "Permission denied" in errors[0]


def test_a_bad_pattern_from_a_heartbeat_fails_its_location_only(setup: Setup) -> None:
    setup.extra.append(CheckpointTarget(RUN, "odd", setup.m, pattern=".hidden_{step}"))
    s, errors = setup.scrape()
    assert setup.v(s, "location_up", "odd") == 0 and setup.v(s, "location_up") == 1
    assert "pattern" in errors[0]


@pytest.mark.slow
def test_a_huge_directory_costs_one_listing(
    many_files_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """100 000 unrelated names next to 200 checkpoints: a scrape lists the directory once and
    stats no unrelated name (its time is measured by bench/bench_big_dirs.py)."""
    s = Setup(many_files_path)
    try:
        for i in range(100_000):
            os.close(os.open(s.p / f"other_{i}.log", os.O_CREAT | os.O_WRONLY, 0o644))
        for step in range(200):
            (s.p / f"step_{step}.pt").write_bytes(b"x")
        s.scrape()  # warm
        listed: list[str] = []
        stats = [0]
        real_scandir, real_stat, real_lstat = os.scandir, os.stat, os.lstat

        def scandir(target: Any = ".") -> Any:
            fd_path = f"/proc/self/fd/{target}"
            listed.append(os.readlink(fd_path) if isinstance(target, int) else os.fspath(target))
            return real_scandir(target)

        def counted(real: Any) -> Any:
            def call(*a: Any, **kw: Any) -> Any:
                stats[0] += 1
                return real(*a, **kw)

            return call

        monkeypatch.setattr(os, "scandir", scandir)
        monkeypatch.setattr(os, "stat", counted(real_stat))
        monkeypatch.setattr(os, "lstat", counted(real_lstat))
        samples, errors = s.scrape()
        monkeypatch.undo()
        assert errors == [] and s.v(samples, "files") == 200
        assert listed.count(os.path.realpath(s.p)) <= 1, listed
        assert stats[0] < 1000, stats  # not a stat per name in the directory
        tracemalloc.start()
        s.scrape()
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak < 5 * 1024 * 1024, peak  # what is kept is the 200 matches, not 100 000 names
    finally:
        s.verifier.stop()


# --- the real exporter process --------------------------------------------------------------


def exporter_config(tmp_path: Path, p: Path, m: Path, grace: str = "1s") -> Path:
    cfg = tmp_path / "tg.yml"
    cfg.write_text(
        f"runs:\n  - name: {RUN}\n    checkpoints:\n      primary: {p}\n"
        f"      mirrors: {{backup: {m}}}\n"
        f"checkpoints: {{grace_period: {grace}, verify_rate: 100MiB}}\n"
    )
    return cfg


def ck(s: Samples, name: str, location: str = "primary") -> float | None:
    return value(s, f"trainguard_checkpoint_{name}", run=RUN, location=location)


def test_exporter_field_cases(tmp_path: Path) -> None:
    """Through the real exporter, with the grace period from the config file: a mirror
    truncated to 73%, a mirror whose bytes changed but not its size, and an orphan .part.
    The files are first inside the grace period (5 minutes: however slow the machine, the
    first scrape comes sooner), then dated back past it, as if the time had passed."""
    p, m = tmp_path / "p", tmp_path / "m"
    p.mkdir()
    m.mkdir()
    for step in (1, 2, 3):
        save(os.urandom(200_000), p / f"step_{step}.pt")
        mirror(p / f"step_{step}.pt", m)
    os.truncate(m / "step_3.pt", 146_000)
    with open(m / "step_2.pt", "r+b") as f:
        f.seek(1000)
        f.write(b"\0" * 100)
    (p / "step_4.pt.part").write_bytes(b"orphan of a writer that died")
    cfg = exporter_config(tmp_path, p, m, grace="5m")
    with Exporter(args=[f"--config.file={cfg}"], state_dir=tmp_path) as exp:
        s = exp.scrape()
        # shorter than its own record: truncated at once, whatever the grace period
        assert ck(s, "truncated_files", "backup") == 1
        assert ck(s, "hash_mismatch_files", "backup") == 0  # not hashed within the grace
        assert ck(s, "last_step", "backup") == 2  # step 3 is short: not complete
        old = time.time() - 600
        for f in [*p.iterdir(), *m.iterdir()]:
            if f.is_file():
                os.utime(f, (old, old))
        s = poll(exp, lambda s: ck(s, "hash_mismatch_files", "backup") == 1)
        assert ck(s, "truncated_files", "backup") == 1
        assert ck(s, "hash_mismatch_files", "backup") == 1
        assert ck(s, "last_step", "backup") == 1
        assert ck(s, "last_step") == 3 and ck(s, "truncated_files") == 0
        assert ck(s, "hash_mismatch_files") == 0
        assert ck(s, "partial_files") == 1
        assert ck(s, "oldest_partial_age_seconds") >= 600  # type: ignore[operator]
        assert value(s, "trainguard_collector_success", collector="checkpoints") == 1


def test_exporter_broken_locations(tmp_path: Path) -> None:
    p, m = tmp_path / "p", tmp_path / "m"
    p.mkdir()
    m.mkdir()
    save(b"x" * 10, p / "step_1.pt")
    mirror(p / "step_1.pt", m)
    cfg = exporter_config(tmp_path, p, m)
    with Exporter(args=[f"--config.file={cfg}"], state_dir=tmp_path) as exp:
        assert value(exp.scrape(), "trainguard_collector_success", collector="checkpoints") == 1
        for kind in ("malformed-manifest", "vanished"):
            (tmp_path / kind).mkdir()
            reason = break_by(kind, m, tmp_path / kind)
            s = exp.scrape()
            assert ck(s, "location_up", "backup") == 0 and ck(s, "last_step", "backup") is None
            assert ck(s, "location_up") == 1 and ck(s, "last_step") == 1
            assert value(s, "trainguard_collector_success", collector="checkpoints") == 0
        log = exp.stop()
    assert f"checkpoints of run 'r', location 'backup' at {m}: " in log
    assert reason in log and "Traceback" not in log


def test_unrecorded_checkpoints_are_complete_only_when_trusted(tmp_path: Path) -> None:
    """A script that saves without trainguard.checkpoint leaves no records: its files can't be
    checked, so they are never complete, unless the config trusts them; then a settled,
    non-empty one is, and its mirror is still judged against it."""
    trusted, untrusted = tmp_path / "trusted", tmp_path / "untrusted"
    for d in (trusted, untrusted, trusted / "m"):
        d.mkdir()
    old = time.time() - 3600
    for d in (trusted, untrusted):
        for step in (100, 200):
            f = d / f"step_{step}.pt"
            f.write_bytes(os.urandom(50_000))
            os.utime(f, (old, old))
        (d / "step_300.pt").write_bytes(b"")  # settled but empty: never a checkpoint
        os.utime(d / "step_300.pt", (old, old))
        (d / "step_400.pt").write_bytes(b"still being written")  # inside the grace period
    (trusted / "m" / "step_200.pt").write_bytes((trusted / "step_200.pt").read_bytes()[:30_000])
    os.utime(trusted / "m" / "step_200.pt", (old, old))
    cfg = tmp_path / "tg.yml"
    cfg.write_text(
        "runs:\n"
        f"  - name: plain\n    checkpoints: {{primary: {untrusted}}}\n"
        f"  - name: legacy\n    checkpoints:\n      primary: {trusted}\n"
        f"      mirrors: {{backup: {trusted / 'm'}}}\n"
        "      trust_unrecorded: true\n"
        "checkpoints: {grace_period: 5m}\n"
    )
    with Exporter(args=[f"--config.file={cfg}"], state_dir=tmp_path / "s") as exp:
        s = exp.scrape()
    plain = {"run": "plain", "location": "primary"}
    legacy = {"run": "legacy", "location": "primary"}
    backup = {"run": "legacy", "location": "backup"}
    assert value(s, "trainguard_checkpoint_last_step", **plain) is None
    assert value(s, "trainguard_checkpoint_unrecorded_files", **plain) == 4
    assert value(s, "trainguard_checkpoint_last_step", **legacy) == 200
    assert value(s, "trainguard_checkpoint_unrecorded_files", **legacy) == 4
    # the mirror's copy of step 200 is judged against the settled primary file: truncated
    assert value(s, "trainguard_checkpoint_truncated_files", **backup) == 1
    assert value(s, "trainguard_checkpoint_last_step", **backup) is None


@pytest.mark.parametrize("trust", [False, True])
def test_mirror_smaller_than_the_settled_primary_is_truncated_whatever_the_trust(
    tmp_path: Path, trust: bool
) -> None:
    """The field report scaled down: a 2.47 GB primary (saved without records, the config
    trusting unrecorded files) mirrored while it was still being written, the copy stopping at
    1.82 GB and recorded at that size in the mirror's own manifest. Once the primary has
    settled, the copy is smaller than the primary of the same step: truncated, never complete,
    whatever the trust setting and whatever the mirror's own record says."""
    p, m = tmp_path / "p", tmp_path / "m"
    p.mkdir()
    m.mkdir()
    (p / "step_1.pt").write_bytes(os.urandom(1820))  # still being written
    mirror(p / "step_1.pt", m)  # the copy and its record: 1820 bytes
    with open(p / "step_1.pt", "ab") as f:
        f.write(os.urandom(650))  # the save completes: 2470 bytes
    now = time.time_ns()
    verifier = Verifier(1e9)
    collector = CheckpointsCollector(
        lambda _scrape: [
            CheckpointTarget(RUN, "primary", p, trust_unrecorded=trust),
            CheckpointTarget(RUN, "backup", m, trust_unrecorded=trust),
        ],
        CheckpointSettings(),
        verifier=verifier,
        clock_ns=lambda: now + 301 * 10**9,
    )
    try:
        s, _ = samples_of(collector)
    finally:
        verifier.stop()

    def v(name: str, location: str) -> float | None:
        return value(s, f"trainguard_checkpoint_{name}", run=RUN, location=location)

    assert v("truncated_files", "backup") == 1
    assert v("last_step", "backup") is None
    assert v("last_step", "primary") == (1 if trust else None)


def test_location_info_says_whether_unrecorded_files_are_trusted(
    setup: Setup, tmp_path: Path
) -> None:
    """Rules alert on unrecorded files only where the location is expected to have records: the
    exporter says which locations trust unrecorded files, also while a location cannot be read."""
    (tmp_path / "legacy").mkdir()
    setup.extra = [
        CheckpointTarget("legacy", "primary", tmp_path / "legacy", trust_unrecorded=True),
        CheckpointTarget("gone", "primary", tmp_path / "missing"),
    ]
    s, _ = setup.scrape()
    info = "trainguard_checkpoint_location_info"
    assert value(s, info, run=RUN, location="primary", trust_unrecorded="false") == 1
    assert value(s, info, run=RUN, location="backup", trust_unrecorded="false") == 1
    assert value(s, info, run="legacy", location="primary", trust_unrecorded="true") == 1
    assert value(s, info, run="gone", location="primary", trust_unrecorded="false") == 1
