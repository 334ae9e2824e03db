"""Directory checkpoints written by the real writers: ``trainguard.checkpoint.save_dir`` (one
process and several real ranks over gloo), torch.distributed.checkpoint killed at random
points, and the Hugging Face Trainer killed while saving. What the library and the exporter
call complete must load."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers.exporter_proc import Samples, child_env, free_port, value
from helpers.paths import HELPERS
from helpers.wait import wait_for
from helpers.zygote import Forked, Zygote
from trainguard.checkpoint import CheckpointError, latest, mirror, prune, save_dir
from trainguard.exporter.collectors.checkpoints.collector import CheckpointsCollector
from trainguard.exporter.collectors.checkpoints.dirwatch import REVALIDATE_SECONDS
from trainguard.exporter.collectors.checkpoints.verifier import Verifier
from trainguard.exporter.config.model import CheckpointSettings
from trainguard.exporter.runs.targets import CheckpointTarget
from trainguard.exporter.scrape.context import Scrape
from trainguard.shared.listing import read_listing
from trainguard.shared.manifest import read_record
from trainguard.shared.pattern import CheckpointPattern
from trainguard.shared.verdict import judge_dirs


def load_all(path: Path, world: int, step: int) -> None:
    """dcp.load of every rank's tensors (tests/helpers/dist_child.py); skips without torch."""
    pytest.importorskip("torch")
    from helpers import dist_child

    dist_child.load_all(path, world, step)


DIST_CHILD = HELPERS / "dist_child.py"
RUN = "r"


class Scraper:
    """An in-process collector whose monotonic clock the test moves (``later``): files under an
    unchanged step directory are stat'ed again only every REVALIDATE_SECONDS."""

    def __init__(self, targets: list[CheckpointTarget], grace: float = 300) -> None:
        self.verifier = Verifier(1e9)
        self.now = time.monotonic()
        self.collector = CheckpointsCollector(
            lambda _s: targets,
            CheckpointSettings(grace_period_seconds=grace),
            verifier=self.verifier,
            monotonic=lambda: self.now,
        )

    def later(self, seconds: float = REVALIDATE_SECONDS) -> None:
        self.now += seconds

    def scrape(self) -> tuple[Samples, list[str]]:
        scrape = Scrape()
        out: Samples = {}
        for family in self.collector.gather(scrape):
            for s in family.samples:
                out[(s.name, frozenset(s.labels.items()))] = s.value
        return out, scrape.errors

    def until_verified(self, location: str = "primary") -> Samples:
        result: list[Samples] = []

        def done() -> bool:
            s, _ = self.scrape()
            result.append(s)
            return (
                value(s, "trainguard_checkpoint_hash_pending_files", run=RUN, location=location)
                == 0
            )

        wait_for(done, 120, what="background hash verification")
        return result[-1]


def ck(s: Samples, name: str, location: str = "primary") -> float | None:
    return value(s, f"trainguard_checkpoint_{name}", run=RUN, location=location)


# -- save_dir in one process ------------------------------------------------------------------


def test_save_dir_commits_a_record_of_every_file(tmp_path: Path) -> None:
    with save_dir(tmp_path / "step-1", pattern="step-{step}") as tmp:
        assert tmp == tmp_path / "step-1.part" and tmp.is_dir()
        (tmp / "model.bin").write_bytes(b"m" * 5000)
        (tmp / "shards").mkdir()
        (tmp / "shards" / "0.bin").write_bytes(b"a" * 700)
        (tmp / ".metadata").write_bytes(b"x" * 10)
        assert not (tmp_path / "step-1").exists()  # not under its final name while written
    assert not (tmp_path / "step-1.part").exists()
    rec = read_record(tmp_path, "step-1")
    assert rec is not None and rec.step == 1 and rec.size == 5710 and rec.sha256 is None
    assert [(p, n) for p, n, _ in rec.files or ()] == [
        (".metadata", 10),
        ("model.bin", 5000),
        ("shards/0.bin", 700),
    ]
    import hashlib

    assert rec.file_map()["model.bin"][1] == hashlib.sha256(b"m" * 5000).hexdigest()
    found = latest(tmp_path, pattern="step-{step}", verify_hash=True)
    assert found is not None and found.directory and found.step == 1
    # no second checkpoint under the same name, and a failed block leaves nothing
    with pytest.raises(FileExistsError), save_dir(tmp_path / "step-1", pattern="step-{step}"):
        pass
    with pytest.raises(RuntimeError), save_dir(tmp_path / "step-2", pattern="step-{step}") as tmp:
        (tmp / "half.bin").write_bytes(b"h")
        raise RuntimeError("the framework failed")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".trainguard", "step-1"]
    with (
        pytest.raises(ValueError, match="not a step directory name"),
        save_dir(tmp_path / "ckpt-3", pattern="step-{step}"),
    ):
        pass


def test_a_share_being_written_is_not_taken_for_a_checkpoint_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two ranks (threads): rank 1 is held with its share half-written (before its rename)
    while rank 0 lists the tree to divide the hashing. Rank 0 must not count rank 1's
    temporary share as a checkpoint file: it once sorted before ``.metadata`` and shifted
    which rank hashes what, so nobody hashed ``.metadata`` and the save failed (seen in CI
    with three real gloo ranks)."""
    import threading

    barrier = threading.Barrier(2, timeout=30)
    share_half_written = threading.Event()
    rank0_listed = threading.Event()
    real_replace = os.replace

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        name = Path(src).name
        if "trainguard-rank-1" in name:
            share_half_written.set()
            assert rank0_listed.wait(30)
        elif "trainguard-rank-0" in name:
            rank0_listed.set()  # rank 0 writes its share only after it listed and hashed
        real_replace(src, dst)

    def sync_for(rank: int) -> Callable[[], object]:
        calls = 0

        def sync() -> None:
            nonlocal calls
            barrier.wait()
            calls += 1
            if rank == 0 and calls == 2:  # every file is in: now rank 0 lists, late
                assert share_half_written.wait(30)

        return sync

    monkeypatch.setattr(os, "replace", replace)
    errors: list[BaseException] = []

    def rank_main(rank: int) -> None:
        try:
            with save_dir(
                tmp_path / "step-1",
                pattern="step-{step}",
                rank=rank,
                world_size=2,
                barrier=sync_for(rank),
            ) as tmp:
                if rank == 0:
                    (tmp / ".metadata").write_bytes(b"m" * 10)
                (tmp / f"shard{rank}.bin").write_bytes(b"s" * (100 + rank))
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()
            rank0_listed.set()
            share_half_written.set()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    rec = read_record(tmp_path, "step-1")
    assert rec is not None
    assert [(p, n) for p, n, _ in rec.files or ()] == [
        (".metadata", 10),
        ("shard0.bin", 100),
        ("shard1.bin", 101),
    ]


def test_a_directory_record_is_verified_in_the_background(tmp_path: Path) -> None:
    for step in (1, 2):
        with save_dir(tmp_path / f"step-{step}", pattern="step-{step}") as tmp:
            for r in range(4):
                (tmp / f"rank{r}.bin").write_bytes(os.urandom(3000))
    # grace 0: hashes are only checked once a file has settled
    sc = Scraper([CheckpointTarget(RUN, "primary", tmp_path, "step-{step}")], grace=0)
    try:
        s = sc.until_verified()
        assert ck(s, "last_step") == 2 and ck(s, "files") == 8
        assert ck(s, "hash_mismatch_files") == 0 and ck(s, "unrecorded_files") == 0
        # one byte flipped in place, same size and mtime: the hash finds it, the step is out
        victim = tmp_path / "step-2" / "rank3.bin"
        st = victim.stat()
        with open(victim, "r+b") as fh:
            fh.seek(100)
            byte = fh.read(1)[0]
            fh.seek(100)
            fh.write(bytes([byte ^ 1]))
        os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
        sc.later()  # changed in place, its directory not: seen within REVALIDATE_SECONDS
        s = sc.until_verified()
        assert ck(s, "hash_mismatch_files") == 1
        assert ck(s, "last_step") == 1
        # cut short: truncation against the record, at once (the record says the size)
        os.truncate(tmp_path / "step-1" / "rank0.bin", 10)
        os.utime(tmp_path / "step-1" / "rank0.bin", ns=(st.st_atime_ns, st.st_mtime_ns))
        sc.later()
        s, _ = sc.scrape()
        assert ck(s, "truncated_files") == 1 and ck(s, "last_step") is None
    finally:
        sc.verifier.stop()


def test_mirror_a_directory(tmp_path: Path) -> None:
    p, m = tmp_path / "p", tmp_path / "m"
    p.mkdir()
    m.mkdir()
    with save_dir(p / "step-1", pattern="step-{step}") as tmp:
        (tmp / "a").mkdir()
        (tmp / "a" / "x.bin").write_bytes(os.urandom(20000))
        (tmp / "y.bin").write_bytes(os.urandom(100))
    rec = mirror(p / "step-1", m, pattern="step-{step}")
    assert rec.files == read_record(p, "step-1").files  # type: ignore[union-attr]
    assert rec.source == str(p / "step-1")
    assert (m / "step-1" / "a" / "x.bin").read_bytes() == (
        p / "step-1" / "a" / "x.bin"
    ).read_bytes()
    assert not (m / "step-1.part").exists()
    found = latest(m, pattern="step-{step}", verify_hash=True)
    assert found is not None and found.step == 1
    # a primary directory cut short is not propagated
    with save_dir(p / "step-2", pattern="step-{step}") as tmp:
        (tmp / "z.bin").write_bytes(os.urandom(5000))
    os.truncate(p / "step-2" / "z.bin", 4000)
    with pytest.raises(CheckpointError, match="should be 5000"):
        mirror(p / "step-2", m, pattern="step-{step}")
    assert not (m / "step-2").exists() and not (m / "step-2.part").exists()
    # a framework's directory (no record): copied once committed by its marker
    dcp_dir = p / "step-3"
    dcp_dir.mkdir()
    (dcp_dir / "__0_0.distcp").write_bytes(os.urandom(3000))
    with pytest.raises(CheckpointError, match="not a committed step directory"):
        mirror(dcp_dir, m, pattern="step-{step}", layout="dcp")
    (dcp_dir / ".metadata").write_bytes(b"meta")
    rec = mirror(dcp_dir, m, pattern="step-{step}", layout="dcp")
    assert [f[0] for f in rec.files or ()] == [".metadata", "__0_0.distcp"]
    # the exporter: the mirror's copy cut short is truncation against its record
    os.truncate(m / "step-1" / "a" / "x.bin", 15000)
    sc = Scraper(
        [
            CheckpointTarget(RUN, "primary", p, "step-{step}", layout="dcp"),
            CheckpointTarget(RUN, "backup", m, "step-{step}", layout="dcp"),
        ],
        grace=0,
    )
    try:
        s, errors = sc.scrape()
        assert errors == []
        assert ck(s, "truncated_files", "backup") == 1
        assert ck(s, "last_step", "backup") == 3
    finally:
        sc.verifier.stop()


# -- several real ranks -------------------------------------------------------------------------


def ranks(zygote: Zygote, mode: str, loc: Path, world: int, *extra: str) -> list[Forked]:
    """``world`` ranks of tests/helpers/dist_child.py, each in a session of its own."""
    port = free_port()
    return [
        zygote.spawn(
            [
                str(DIST_CHILD),
                mode,
                str(loc),
                str(r),
                str(world),
                str(port),
                *extra,
            ],
            child_env({"OMP_NUM_THREADS": "1"}),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for r in range(world)
    ]


def finish(procs: list[Forked], timeout: float = 300) -> None:
    for p in procs:
        out, _ = p.communicate(timeout=timeout)
        assert p.returncode == 0, out


def test_save_dir_with_several_ranks(tmp_path: Path, framework_zygote: Zygote) -> None:
    """Three real processes over gloo: each writes its DCP shard and a file of its own into
    one save_dir; one record lists every rank's files."""
    world = 3
    pytest.importorskip("torch")
    finish(ranks(framework_zygote, "savedir", tmp_path, world, "1", "2"))
    for step in (1, 2):
        rec = read_record(tmp_path, f"step-{step}")
        assert rec is not None and rec.files is not None
        names = [f[0] for f in rec.files]
        assert {f"extra-rank{r}.bin" for r in range(world)} <= set(names)
        assert ".metadata" in names and sum(n.endswith(".distcp") for n in names) == world
        assert all(sha is not None for _, _, sha in rec.files)
        assert not [n for n in names if "trainguard" in n]
    assert not list(tmp_path.glob("*.part"))
    found = latest(tmp_path, pattern="step-{step}", verify_hash=True)
    assert found is not None and found.step == 2
    load_all(found.path, world, 2)
    sc = Scraper([CheckpointTarget(RUN, "primary", tmp_path, "step-{step}")], grace=0)
    try:
        s = sc.until_verified()
        assert ck(s, "last_step") == 2 and ck(s, "hash_mismatch_files") == 0
    finally:
        sc.verifier.stop()


# -- real writers killed at random points ------------------------------------------------------


def committed_steps(loc: Path, pattern: str, layout: str) -> list[tuple[int, Path]]:
    """Every step directory the shared verdict calls complete, with no grace period at all:
    only the framework's commit protocol stands between a killed save and "complete"."""
    listing = read_listing(loc, CheckpointPattern(pattern), layout)
    steps = judge_dirs(listing, now_ns=time.time_ns(), grace_ns=0)
    return [(sv.dir.step, loc / sv.dir.name) for sv in steps if sv.complete]


@pytest.mark.slow
def test_dcp_killed_at_random_points_never_leaves_a_complete_step_that_does_not_load(
    tmp_path: Path, framework_zygote: Zygote
) -> None:
    """torch.distributed.checkpoint.save on three real ranks (gloo), all SIGKILLed at a random
    moment, several times: every step the verdict calls complete (auto-detected layout, grace
    period 0) loads with dcp.load and holds what was saved; latest() loads; the exporter's
    last_step is one of them."""
    world = 3
    pytest.importorskip("torch")
    rng = random.Random(1234)
    seen_inflight = 0
    for round_ in range(4):
        loc = tmp_path / f"round{round_}"
        loc.mkdir()
        procs = ranks(framework_zygote, "dcp", loc, world)
        try:
            assert procs[0].stdout is not None
            first = procs[0].stdout.readline()  # one save done: the kill lands in a later one
            assert first.strip() == "1", first
            time.sleep(rng.uniform(0.0, 0.5))  # a random point, in a save or between two
        finally:
            for p in procs:
                os.killpg(p.pid, signal.SIGKILL)
            for p in procs:
                p.communicate()
        complete = committed_steps(loc, "step-{step}", "auto")
        assert complete, "the first save had finished"
        for step, path in complete:
            load_all(path, world, step)
        dirs = sorted(p.name for p in loc.iterdir() if p.is_dir())
        seen_inflight += len(dirs) - len(complete)
        found = latest(loc, pattern="step-{step}", grace=0)
        assert found is not None and found.step == max(s for s, _ in complete)
        load_all(found.path, world, found.step)
        sc = Scraper([CheckpointTarget(RUN, "primary", loc, "step-{step}")], grace=0)
        try:
            s, errors = sc.scrape()
            assert errors == []
            assert ck(s, "last_step") == found.step
            assert ck(s, "partial_files") == len(dirs) - len(complete)
        finally:
            sc.verifier.stop()
    print(f"in-flight step directories left by the kills: {seen_inflight}")


@pytest.mark.slow
def test_save_dir_killed_at_random_points(tmp_path: Path, framework_zygote: Zygote) -> None:
    """save_dir around dcp.save on two real ranks, all SIGKILLed at random moments: no
    directory under a final name is ever partial (each loads and, where its record landed,
    matches every recorded hash); what is left is a .part directory at most."""
    world = 2
    pytest.importorskip("torch")
    rng = random.Random(7)
    for round_ in range(3):
        loc = tmp_path / f"round{round_}"
        loc.mkdir()
        procs = ranks(framework_zygote, "savedir-loop", loc, world)
        try:
            assert procs[0].stdout is not None
            first = procs[0].stdout.readline()
            assert first.strip() == "1", first
            time.sleep(rng.uniform(0.0, 0.5))
        finally:
            for p in procs:
                os.killpg(p.pid, signal.SIGKILL)
            for p in procs:
                p.communicate()
        finals = sorted(
            p
            for p in loc.iterdir()
            if p.is_dir() and p.name.startswith("step-") and not p.name.endswith(".part")
        )
        complete = dict(committed_steps(loc, "step-{step}", "auto"))
        assert len(complete) == len(finals)  # every final name is a whole checkpoint
        for step, path in complete.items():
            load_all(path, world, step)
        found = latest(loc, pattern="step-{step}", grace=0, verify_hash=True)
        assert found is not None and found.step >= 1
        assert [p.name for p in loc.iterdir() if p.name.endswith(".part")] in (
            [],
            [f"step-{max(complete) + 1}.part"],
        )


HF_CHILD = HELPERS / "hf_child.py"


@pytest.mark.slow
def test_hf_trainer_killed_while_saving_never_leaves_a_complete_step_that_does_not_load(
    tmp_path: Path, framework_zygote: Zygote
) -> None:
    """A real Trainer saving at every step (tiny GPT-2 from a config, CPU), SIGKILLed at a
    random moment, three times: every checkpoint-N the verdict calls complete (grace period 0)
    loads part by part as a resume does, latest() is the newest of them, and
    Trainer.train(resume_from_checkpoint=latest) resumes from its step."""
    pytest.importorskip("transformers")
    rng = random.Random(99)
    env = child_env({"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"})
    inflight = 0
    for round_ in range(3):
        out = tmp_path / f"run{round_}"
        proc = framework_zygote.spawn(
            [HF_CHILD, "train", out],
            env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            first = out / "checkpoint-1" / "trainer_state.json"
            wait_for(first.exists, 120, what="a save")
            time.sleep(rng.uniform(0.0, 1.0))
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        complete = committed_steps(out, "checkpoint-{step}", "auto")
        assert complete
        rc, output = framework_zygote.run([HF_CHILD, "check", *(p for _, p in complete)], env, 600)
        assert rc == 0, output
        found = latest(out, pattern="checkpoint-{step}", grace=0)
        assert found is not None and found.step == max(s for s, _ in complete)
        inflight += sum(1 for p in out.glob("checkpoint-*")) - len(complete)
    print(f"in-flight checkpoint directories left by the kills: {inflight}")
    rc, output = framework_zygote.run([HF_CHILD, "resume", out, found.path], env, 600)
    assert rc == 0, output
    assert json.loads(output.strip().splitlines()[-1])["resumed_from"] == found.step
    # and prune keeps what it must: the newest complete one survives
    prune(out, keep=1, pattern="checkpoint-{step}", grace=0)
    again = latest(out, pattern="checkpoint-{step}", grace=0)
    assert again is not None and again.step >= found.step
