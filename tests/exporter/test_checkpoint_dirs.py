"""Directory checkpoints as the frameworks write them, judged by the exporter (in process, with
a controlled clock): for each layout the newest complete step, the step in flight ignored, an
orphan flagged, a truncated or missing file of a mirror flagged.

The DeepSpeed and Megatron-LM directories here are built from their documented file names
(DeepSpeed and Megatron need CUDA builds); the Orbax ones as orbax-checkpoint 0.12.8 writes
them, and the Hugging Face Trainer and torch.distributed.checkpoint ones also built so: the
real libraries write them in tests/training/test_checkpoint_writers.py and
tests/training/test_orbax_real.py."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers.exporter_proc import Samples, value
from trainguard.checkpoint import latest, prune
from trainguard.exporter.collectors.checkpoints.collector import CheckpointsCollector
from trainguard.exporter.collectors.checkpoints.dirwatch import (
    REVALIDATE_SECONDS,
    SETTLE_SECONDS,
    CheckpointDirectory,
    RecordCache,
)
from trainguard.exporter.collectors.checkpoints.verifier import Verifier
from trainguard.exporter.config.model import CheckpointSettings, ConfigError, parse_config
from trainguard.exporter.runs.targets import CheckpointTarget, config_targets
from trainguard.exporter.scrape.context import Scrape
from trainguard.shared.pattern import CheckpointPattern

RUN = "r"
GRACE = 300
OLD = 3600  # seconds before "now" for settled steps


def touch_tree(path: Path, t_ns: int) -> None:
    """Set the mtime of a directory, everything under it, to ``t_ns``."""
    for root, dirs, files in os.walk(path):
        for name in files + dirs:
            os.utime(os.path.join(root, name), ns=(t_ns, t_ns))
    os.utime(path, ns=(t_ns, t_ns))


def write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


# -- the layouts, from each framework's documented file names ---------------------------------


def hf_step(loc: Path, step: int, *, marker: bool = True) -> Path:
    """transformers Trainer._save_checkpoint: model, optimizer, scheduler, RNG state, then
    trainer_state.json last."""
    d = loc / f"checkpoint-{step}"
    write(d / "config.json", b'{"model_type": "gpt2"}')
    write(d / "model.safetensors", os.urandom(3000))
    write(d / "optimizer.pt", os.urandom(6000))
    write(d / "scheduler.pt", os.urandom(100))
    write(d / "rng_state.pth", os.urandom(200))
    write(d / "training_args.bin", os.urandom(50))
    if marker:
        write(d / "trainer_state.json", json.dumps({"global_step": step}).encode())
    return d


def dcp_step(loc: Path, step: int, *, marker: bool = True) -> Path:
    """torch.distributed.checkpoint FileSystemWriter: one __<rank>_<n>.distcp per rank, then
    .metadata (renamed from .metadata.tmp) by the coordinator once every rank is done."""
    d = loc / f"step-{step}"
    write(d / "__0_0.distcp", os.urandom(4000))
    write(d / "__1_0.distcp", os.urandom(4000))
    if marker:
        write(d / ".metadata", os.urandom(300))
    return d


def deepspeed_step(loc: Path, step: int, *, marker: bool = True) -> Path:
    """DeepSpeed engine.save_checkpoint: global_step<N>/ with model states and one ZeRO
    optimizer shard per data-parallel rank, then the tag in `latest` beside it."""
    d = loc / f"global_step{step}"
    write(d / "mp_rank_00_model_states.pt", os.urandom(3000))
    write(d / "zero_pp_rank_0_mp_rank_00_optim_states.pt", os.urandom(2000))
    write(d / "zero_pp_rank_1_mp_rank_00_optim_states.pt", os.urandom(2000))
    write(loc / "zero_to_fp32.py", b"# copied by DeepSpeed\n")
    if marker:
        write(loc / "latest", f"global_step{step}".encode())
    return d


def megatron_step(loc: Path, step: int, *, marker: bool = True) -> Path:
    """Megatron-LM save_checkpoint: iter_<7 digits>/mp_rank_<tp>/model_optim_rng.pt, then the
    iteration in latest_checkpointed_iteration.txt beside it."""
    d = loc / f"iter_{step:07d}"
    write(d / "mp_rank_00" / "model_optim_rng.pt", os.urandom(3000))
    write(d / "mp_rank_01" / "model_optim_rng.pt", os.urandom(3000))
    if marker:
        write(loc / "latest_checkpointed_iteration.txt", str(step).encode())
    return d


def orbax_step(loc: Path, step: int, *, marker: bool = True, commit_file: bool = True) -> Path:
    """Orbax CheckpointManager (0.12.8): <step>.orbax-checkpoint-tmp/ (older releases add
    -<time>) with _CHECKPOINT_METADATA and an item directory (OCDBT), then commit_success.txt
    in each, renamed to <step>/ to commit. ``commit_file=False``: an Orbax that writes none."""
    tmp = loc / f"{step}.orbax-checkpoint-tmp"
    write(tmp / "_CHECKPOINT_METADATA", b'{"item_handlers": {}}')
    write(tmp / "default" / "_METADATA", b"{}")
    write(tmp / "default" / "manifest.ocdbt", os.urandom(114))
    write(tmp / "default" / "d" / "801ff0d448f6e459e5d0b097ed3bc10b", os.urandom(299))
    write(tmp / "default" / "ocdbt.process_0" / "manifest.ocdbt", os.urandom(238))
    write(tmp / "default" / "ocdbt.process_0" / "d" / "3d4e5f", os.urandom(2000))
    if not marker:
        return tmp
    if commit_file:
        write(tmp / "default" / "commit_success.txt", b"Checkpoint commit was successful")
        write(tmp / "commit_success.txt", b"Checkpoint commit was successful")
    final = loc / str(step)
    os.rename(tmp, final)
    return final


Builder = Callable[..., Path]
LAYOUTS: dict[str, tuple[str, Builder]] = {
    "huggingface": ("checkpoint-{step}", hf_step),
    "dcp": ("step-{step}", dcp_step),
    "deepspeed": ("global_step{step}", deepspeed_step),
    "megatron": ("iter_{step}", megatron_step),
    "orbax": ("{step}", orbax_step),
}


class Dirs:
    """A primary and a mirror of run "r" holding step directories of one layout, judged by an
    in-process collector whose clock the test moves."""

    def __init__(self, tmp_path: Path, layout: str, config_layout: str = "auto") -> None:
        self.pattern, self.build = LAYOUTS[layout]
        self.layout = layout
        self.p = tmp_path / "p"
        self.m = tmp_path / "m"
        self.p.mkdir(parents=True)
        self.m.mkdir(parents=True)
        self.now = time.time_ns()
        self.verifier = Verifier(1e9)
        self.collector = CheckpointsCollector(
            lambda _scrape: [
                CheckpointTarget(RUN, "primary", self.p, self.pattern, layout=config_layout),
                CheckpointTarget(RUN, "backup", self.m, self.pattern, layout=config_layout),
            ],
            CheckpointSettings(grace_period_seconds=GRACE),
            verifier=self.verifier,
            clock_ns=lambda: self.now,
        )

    def step(self, step: int, *, marker: bool = True, age: float = OLD) -> Path:
        d = self.build(self.p, step, marker=marker)
        touch_tree(d, self.now - int(age * 1e9))
        return d

    def scrape(self) -> tuple[Samples, list[str]]:
        scrape = Scrape()
        out: Samples = {}
        for family in self.collector.gather(scrape):
            for s in family.samples:
                out[(s.name, frozenset(s.labels.items()))] = s.value
        return out, scrape.errors

    def v(self, s: Samples, name: str, location: str = "primary", **labels: str) -> float | None:
        return value(s, f"trainguard_checkpoint_{name}", run=RUN, location=location, **labels)


@pytest.fixture(params=sorted(LAYOUTS))
def dirs(request: pytest.FixtureRequest, tmp_path: Path) -> Dirs:
    d = Dirs(tmp_path, request.param)
    yield d
    d.verifier.stop()


def files_under(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file())


def test_newest_complete_step_and_the_one_in_flight(dirs: Dirs) -> None:
    d100 = dirs.step(100)
    dirs.step(200)
    dirs.step(300, marker=False, age=5)  # being written: no marker yet
    s, errors = dirs.scrape()
    assert errors == []
    v = dirs.v
    assert v(s, "location_up") == 1
    assert v(s, "last_step") == 200
    assert v(s, "last_timestamp_seconds") == pytest.approx((dirs.now - OLD * 10**9) / 1e9)
    per_step = files_under(d100)
    assert v(s, "files") == 2 * len(per_step)
    assert v(s, "size_bytes", step="100") == sum(f.stat().st_size for f in per_step)
    assert v(s, "size_bytes", step="300") is None  # not committed: not a checkpoint yet
    assert v(s, "partial_files") == 1
    assert v(s, "oldest_partial_age_seconds") == pytest.approx(5, abs=1)
    for name in ("truncated_files", "unrecorded_files", "unknown_mtime_files"):
        assert v(s, name) == 0, name


def test_an_orphan_is_flagged(dirs: Dirs) -> None:
    dirs.step(100)
    dirs.step(200, marker=False, age=2 * 86400)  # the writer died long ago
    s, _ = dirs.scrape()
    assert dirs.v(s, "last_step") == 100
    assert dirs.v(s, "partial_files") == 1
    assert dirs.v(s, "oldest_partial_age_seconds") == pytest.approx(2 * 86400, abs=1)


def test_a_committed_step_touched_within_the_grace_period_is_not_complete(dirs: Dirs) -> None:
    dirs.step(100)
    d200 = dirs.step(200)
    newest = max(files_under(d200))
    t = dirs.now - 10 * 10**9
    os.utime(newest, ns=(t, t))  # a file still being written under a committed name
    s, _ = dirs.scrape()
    assert dirs.v(s, "last_step") == 100
    dirs.now += GRACE * 10**9
    s, _ = dirs.scrape()
    # Orbax writes nothing in a step after its commit_success.txt: a step changed since (Orbax
    # deleting it, killed half-way) is not what was committed, however long ago
    assert dirs.v(s, "last_step") == (100 if dirs.layout == "orbax" else 200)


def mirror_tree(dirs: Dirs, step_dir: Path) -> Path:
    """Copy a step directory (and the tracker file beside it) to the mirror, times kept."""
    dst = dirs.m / step_dir.name
    shutil.copytree(step_dir, dst, copy_function=shutil.copy2)
    for tracker in ("latest", "latest_checkpointed_iteration.txt"):
        if (dirs.p / tracker).exists():
            shutil.copy2(dirs.p / tracker, dirs.m / tracker)
    os.utime(dst, ns=(step_dir.stat().st_mtime_ns,) * 2)
    return dst


def test_a_truncated_mirror_file_is_flagged(dirs: Dirs) -> None:
    d100 = dirs.step(100)
    d200 = dirs.step(200)
    mirror_tree(dirs, d100)
    m200 = mirror_tree(dirs, d200)
    biggest = max(files_under(m200), key=lambda f: f.stat().st_size)
    st = biggest.stat()
    os.truncate(biggest, st.st_size * 73 // 100)  # the field report's cut, inside a directory
    os.utime(biggest, ns=(st.st_atime_ns, st.st_mtime_ns))
    s, errors = dirs.scrape()
    assert errors == []
    assert dirs.v(s, "last_step") == 200
    assert dirs.v(s, "truncated_files") == 0
    assert dirs.v(s, "last_step", "backup") == 100
    assert dirs.v(s, "truncated_files", "backup") == 1
    full = sum(f.stat().st_size for f in files_under(d200))
    assert dirs.v(s, "expected_size_bytes", "backup", step="200") == full
    assert dirs.v(s, "size_bytes", "backup", step="200") == full - (
        st.st_size - st.st_size * 73 // 100
    )


def test_a_file_missing_from_a_mirror_is_truncation(dirs: Dirs) -> None:
    d100 = dirs.step(100)
    m100 = mirror_tree(dirs, d100)
    victim = min(f for f in files_under(m100) if f.name not in ("trainer_state.json", ".metadata"))
    os.unlink(victim)
    touch_tree(m100, dirs.now - OLD * 10**9)
    s, _ = dirs.scrape()
    assert dirs.v(s, "last_step", "backup") is None
    assert dirs.v(s, "truncated_files", "backup") == 1
    assert dirs.v(s, "last_step") == 100


# -- layout-specific rules --------------------------------------------------------------------


@pytest.fixture
def hf(tmp_path: Path) -> Dirs:
    d = Dirs(tmp_path, "huggingface")
    yield d
    d.verifier.stop()


def test_hf_trainer_state_cut_short_is_no_marker(hf: Dirs) -> None:
    """trainer_state.json is written with a plain open/write: a save killed while writing it
    leaves a partial document, and the step is not committed."""
    hf.step(100)
    d200 = hf.step(200)
    (d200 / "trainer_state.json").write_bytes(b'{"global_step": 2')
    touch_tree(d200, hf.now - OLD * 10**9)
    s, _ = hf.scrape()
    assert hf.v(s, "last_step") == 100
    assert hf.v(s, "partial_files") == 1


def test_deepspeed_steps_after_latest_are_in_flight(tmp_path: Path) -> None:
    ds = Dirs(tmp_path, "deepspeed")
    ds.step(100)
    ds.step(200)
    (ds.p / "latest").write_text("global_step100")  # 200 written, its tag not yet
    s, _ = ds.scrape()
    assert ds.v(s, "last_step") == 100
    assert ds.v(s, "partial_files") == 1
    (ds.p / "latest").write_text("bogus")
    s, errors = ds.scrape()
    assert ds.v(s, "location_up") == 0
    assert any("names 'bogus'" in e for e in errors)
    ds.verifier.stop()


def test_megatron_release_names_no_step(tmp_path: Path) -> None:
    mg = Dirs(tmp_path, "megatron")
    mg.step(100)
    (mg.p / "latest_checkpointed_iteration.txt").write_text("release")
    s, _ = mg.scrape()
    assert mg.v(s, "last_step") is None and mg.v(s, "partial_files") == 1
    mg.verifier.stop()


def test_orbax_step_partly_deleted_under_its_final_name_is_not_complete(tmp_path: Path) -> None:
    """Orbax deletes an old step in place (max_to_keep): killed half-way, the step keeps its
    final name. Without its commit_success.txt, or with anything under it newer than that,
    it is in flight (tests/training/test_orbax_real.py does this with the real library)."""
    ob = Dirs(tmp_path, "orbax")
    ob.step(100)
    d200 = ob.step(200)
    ob.step(300)
    (d200 / "commit_success.txt").unlink()
    s, _ = ob.scrape()
    assert ob.v(s, "last_step") == 300 and ob.v(s, "partial_files") == 1
    assert [c.step for c in [latest(ob.p, pattern="{step}", grace=0)] if c] == [300]
    (ob.p / "300" / "default" / "d" / "801ff0d448f6e459e5d0b097ed3bc10b").unlink()  # now
    s, _ = ob.scrape()
    assert ob.v(s, "last_step") == 100 and ob.v(s, "partial_files") == 2
    ob.now += 10 * GRACE * 10**9  # settled: still not what Orbax committed
    s, _ = ob.scrape()
    assert ob.v(s, "last_step") == 100
    ob.verifier.stop()


def test_orbax_without_commit_files_commits_by_the_final_name(tmp_path: Path) -> None:
    """An Orbax that writes no commit_success.txt (no step of the location holds one): the
    rename alone commits, as before."""
    ob = Dirs(tmp_path, "orbax")
    for step in (100, 200):
        touch_tree(orbax_step(ob.p, step, commit_file=False), ob.now - OLD * 10**9)
    ob.step(300, marker=False, age=5)
    s, errors = ob.scrape()
    assert errors == []
    assert ob.v(s, "last_step") == 200 and ob.v(s, "partial_files") == 1
    ob.verifier.stop()


def test_ambiguous_layout_fails_visibly_and_the_config_settles_it(tmp_path: Path) -> None:
    """An FSDP-style save holding DCP files next to an Orbax-looking step: auto-detection does
    not guess; `layout:` in the config decides."""
    amb = Dirs(tmp_path / "a", "dcp")
    amb.step(100)
    d200 = amb.p / "step-200"
    write(d200 / "_CHECKPOINT_METADATA", b"{}")
    touch_tree(d200, amb.now - OLD * 10**9)
    s, errors = amb.scrape()
    assert amb.v(s, "location_up") == 0
    assert any("set the location's layout" in e for e in errors)
    amb.verifier.stop()
    fixed = Dirs(tmp_path / "b", "dcp", config_layout="dcp")
    fixed.step(100)
    write(fixed.p / "step-200" / "_CHECKPOINT_METADATA", b"{}")
    touch_tree(fixed.p / "step-200", fixed.now - OLD * 10**9)
    s, _ = fixed.scrape()
    assert fixed.v(s, "last_step") == 100 and fixed.v(s, "partial_files") == 1
    fixed.verifier.stop()


def test_layout_in_the_config_is_validated() -> None:
    doc = {"runs": [{"name": "r", "checkpoints": {"primary": "/c", "layout": "hf"}}]}
    with pytest.raises(ConfigError, match=r"runs\[0\]\.checkpoints\.layout: expected one of auto"):
        parse_config(doc, "cfg.yml")
    doc["runs"][0]["checkpoints"]["layout"] = "huggingface"  # type: ignore[index]
    doc["runs"][0]["checkpoints"]["pattern"] = "checkpoint-{step}"  # type: ignore[index]
    (target,) = config_targets(parse_config(doc, "cfg.yml"))
    assert (target.layout, target.pattern) == ("huggingface", "checkpoint-{step}")


def test_layout_files_ignores_step_directories(tmp_path: Path) -> None:
    d = Dirs(tmp_path, "huggingface", config_layout="files")
    d.step(100)
    s, _ = d.scrape()
    assert d.v(s, "last_step") is None and d.v(s, "files") == 0 and d.v(s, "partial_files") == 0
    d.verifier.stop()


def test_a_link_inside_a_step_directory_fails_the_location(hf: Dirs) -> None:
    d100 = hf.step(100)
    os.symlink("/etc/hostname", d100 / "extra.bin")
    s, errors = hf.scrape()
    assert hf.v(s, "location_up") == 0 and any("symbolic link" in e for e in errors)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_unchanged_step_directories_are_not_listed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each directory of a step tree is listed while it changes; while none changes, the step
    is the same object as at the last scrape (neither listed nor its files stat'ed), and its
    files are stat'ed again at least every REVALIDATE_SECONDS, so a file cut in place shows
    within that time."""
    clock = Clock()
    for step in (100, 200):
        megatron_step(tmp_path, step)
    d = CheckpointDirectory(tmp_path, CheckpointPattern("iter_{step}"), clock=clock)
    recs = RecordCache(tmp_path, clock=clock)
    d.read(recs)
    clock.now += SETTLE_SECONDS
    first = d.read(recs)  # confirms every directory's stat
    listings: list[object] = []
    stats: list[object] = []
    real_scandir, real_stat = os.scandir, os.stat

    def scandir(*a: object) -> object:
        listings.append(a)
        return real_scandir(*a)  # type: ignore[arg-type]

    def counting_stat(*a: object, **kw: object) -> os.stat_result:
        stats.append(a)
        return real_stat(*a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "scandir", scandir)
    monkeypatch.setattr(os, "stat", counting_stat)
    victim = tmp_path / "iter_0000100" / "mp_rank_01" / "model_optim_rng.pt"
    os.truncate(victim, 10)
    listing = d.read(recs)
    assert listings == []
    assert [dd for dd in listing.dirs] == list(first.dirs)
    assert all(a is b for a, b in zip(listing.dirs, first.dirs, strict=True))
    assert len(stats) <= 4  # the location's names and its parent, not the 4 files under them
    clock.now += REVALIDATE_SECONDS
    listing = d.read(recs)
    sizes = {e.name: e.stat.st_size for dd in listing.dirs for e in dd.files}
    assert sizes["iter_0000100/mp_rank_01/model_optim_rng.pt"] == 10
    # a new file in one subdirectory: that directory alone is listed again, at once
    clock.now += SETTLE_SECONDS
    d.read(recs)
    listings.clear()
    write(tmp_path / "iter_0000200" / "mp_rank_00" / "extra.pt", b"x")
    listing = d.read(recs)
    assert len(listings) == 1
    assert "iter_0000200/mp_rank_00/extra.pt" in {e.name for dd in listing.dirs for e in dd.files}


# -- the library: latest() and prune() ----------------------------------------------------------


def lib_setup(dirs: Dirs) -> dict[int, Path]:
    """Steps 100-300 committed and settled, 400 in flight, each also on the mirror (400 too:
    a copy in progress)."""
    made = {step: dirs.step(step) for step in (100, 200, 300)}
    made[400] = dirs.step(400, marker=False, age=5)
    for step in (100, 200, 300):
        mirror_tree(dirs, made[step])
    return made


def test_latest_is_the_newest_complete_directory(dirs: Dirs) -> None:
    made = lib_setup(dirs)
    found = latest(dirs.p, pattern=dirs.pattern)
    assert found is not None
    assert (found.step, found.path, found.directory) == (300, made[300], True)
    assert found.size == sum(f.stat().st_size for f in files_under(made[300]))
    backup = latest(dirs.m, pattern=dirs.pattern, primary=dirs.p)
    assert backup is not None and backup.step == 300
    # a mirror file cut short: that step is not a checkpoint to resume from
    victim = max(files_under(dirs.m / made[300].name), key=lambda f: f.stat().st_size)
    os.truncate(victim, 1)
    backup = latest(dirs.m, pattern=dirs.pattern, primary=dirs.p)
    assert backup is not None and backup.step == 200
    # touched within the grace period: not yet
    for f in files_under(made[300]):
        os.utime(f)
    found = latest(dirs.p, pattern=dirs.pattern)
    assert found is not None and found.step == 200


def test_prune_keeps_the_newest_and_never_touches_a_directory_in_flight(dirs: Dirs) -> None:
    made = lib_setup(dirs)
    deleted = prune(dirs.p, keep=1, pattern=dirs.pattern, mirrors=[dirs.m])
    names = sorted(str(p.relative_to(p.parent.parent)) for p in deleted)
    assert names == sorted(f"{loc}/{made[s].name}" for loc in ("m", "p") for s in (100, 200))
    assert made[300].is_dir() and made[400].is_dir() and (dirs.m / made[300].name).is_dir()
    assert not [p for p in dirs.p.iterdir() if "deleting" in p.name]
    found = latest(dirs.p, pattern=dirs.pattern)
    assert found is not None and found.step == 300


def test_prune_guards_for_directories(hf: Dirs) -> None:
    d = {step: hf.step(step) for step in (100, 200, 300, 400, 500)}
    # unknown mtime under step 100, a file of 200 touched within the grace period, 300 locked
    # by a reader (a mirror copying it)
    os.utime(d[100] / "optimizer.pt", ns=(0, 0))
    os.utime(d[200] / "scheduler.pt")
    fd = os.open(d[300], os.O_RDONLY | os.O_DIRECTORY)
    try:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_SH)
        deleted = prune(hf.p, keep=1, pattern=hf.pattern)
    finally:
        os.close(fd)
    assert deleted == [d[400]]
    assert all(d[s].is_dir() for s in (100, 200, 300, 500))
    # fewer complete steps than asked to keep: nothing at all
    assert prune(hf.p, keep=10, pattern=hf.pattern) == []


def test_real_exporter_judges_an_announced_trainer_output_dir(tmp_path: Path) -> None:
    """What the Hugging Face integration announces (output_dir with checkpoint-{step}), through
    the real exporter process: the newest complete step, the one in flight as a .part, and a
    trainguard.Run announcing a bad layout fails that location alone."""
    from helpers.exporter_proc import Exporter, poll
    from helpers.run_child import own_heartbeat, put

    state, out = tmp_path / "state", tmp_path / "out"
    state.mkdir()
    out.mkdir()
    old = time.time_ns() - OLD * 10**9
    for step in (10, 20):
        touch_tree(hf_step(out, step), old)
    hf_step(out, 30, marker=False)  # being written
    put(state, own_heartbeat("hf", checkpoint_dir=str(out), checkpoint_pattern="checkpoint-{step}"))
    put(state, own_heartbeat("bad", checkpoint_dir=str(out), checkpoint_layout="nonsense"))
    with Exporter(state_dir=state) as exp:

        def ck(s: Samples, run: str, name: str) -> float | None:
            return value(s, f"trainguard_checkpoint_{name}", run=run, location="primary")

        s = poll(exp, lambda s: ck(s, "hf", "last_step") is not None)
        assert ck(s, "hf", "last_step") == 20
        assert ck(s, "hf", "partial_files") == 1
        assert ck(s, "hf", "files") == 14
        assert ck(s, "bad", "location_up") == 0
    with pytest.raises(ValueError, match="checkpoint_layout: expected one of auto"):
        import trainguard

        trainguard.Run("x", checkpoint_dir=str(out), checkpoint_layout="nonsense", state_dir=state)
