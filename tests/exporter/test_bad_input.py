"""Bad input through the real exporter: every file of the corpora in tests/data/heartbeats/ and
tests/data/manifests/ (plus the ones that cannot be committed: huge, links, FIFOs, odd file
names), each next to a good file. That one file's error is visible (error count, collector
success 0, one log line naming the file), the good run or location is still published, the
scrape answers and nothing logs a traceback. Also odd checkpoint file names and a state dir of
100 000 entries.

One exporter serves each corpus (starting one per case would cost a second each); between
cases the bad file is removed and a clean scrape checks that the exporter recovered, so every
case starts from the same state and logs its error anew."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from helpers.exporter_proc import Exporter, Samples, select, value
from helpers.paths import DATA
from helpers.run_child import own_heartbeat, put
from trainguard.checkpoint import save
from trainguard.exporter.scrape.collector import printable
from trainguard.shared.heartbeat.record import heartbeat_filename
from trainguard.shared.manifest import MANIFEST_DIR, Record, record_path

HEARTBEATS = DATA / "heartbeats"
MANIFESTS = DATA / "manifests"

# ---------------------------------------------------------------- heartbeat corpus

#: corpus file (without .heartbeat.json) -> what its log line must say
HEARTBEAT_REASONS = {
    "allocator-duplicate-device": "field 'allocator[1].device': device 0 listed twice",
    "binary": "not UTF-8 text",
    "checkpoint-dir-relative": "field 'checkpoint_dir': expected an absolute path",
    "control-in-host": "field 'host': contains control characters",
    "death-cause-unknown": "field 'death_history[0].cause': expected one of",
    "deep-nesting": "not usable JSON: RecursionError",
    "duplicate-keys": "a key appears twice in one object",
    "duplicate-keys-both-valid": "a key appears twice in one object",
    "foreign-format": "unsupported heartbeat format 2",
    "foreign-json": "not a trainguard heartbeat (no 'format' field)",
    "format-string": "unsupported heartbeat format a string",
    "latin1": "not UTF-8 text",
    "lone-surrogate": "field 'run': contains an unpaired surrogate",
    "malformed": "not valid JSON",
    "mirror-named-primary": "field 'mirrors': expected mirror names other than 'primary'",
    "mirror-relative": "field 'mirrors.backup': expected an absolute path",
    "missing-run": "field 'run': missing",
    "nul-bytes": "not valid JSON",
    "nul-in-run": "field 'run': contains control characters",
    "path-too-long": "field 'log_file': expected at most 4096 characters",
    "pid-float": "field 'pid': expected an integer, got a number",
    "pid-huge-int": "not usable JSON: ValueError",
    "pid-negative": "field 'pid': expected an integer in 1..4294967295, got -1",
    "pid-string": "field 'pid': expected an integer, got a string",
    "pid-zero": "field 'pid': expected an integer in 1..4294967295, got 0",
    "rank-bool": "field 'rank': expected an integer, got a boolean",
    "run-empty": "field 'run': expected 1-128 characters, got 0",
    "run-number": "field 'run': expected a string, got an integer",
    "run-object": "field 'run': expected a string, got an object",
    "run-too-long": "field 'run': expected 1-128 characters, got 129",
    "scalar-bad-name": "field 'scalars': expected names of letters, digits and '_'",
    "scalar-string": "field 'scalars.loss': expected a number, got a string",
    "scalars-too-many": "field 'scalars': expected at most 16 entries, got 17",
    "state-unknown": "field 'state': expected one of running, finished, failed",
    "step-float": "field 'step': expected an integer, got a number",
    "step-negative": "field 'step': expected an integer in 0..",
    "step-over-int64": "field 'step': expected an integer in 0..",
    "time-far-future": "field 'time': expected seconds since the epoch",
    "time-infinity": "field 'create_time': expected seconds since the epoch",
    # found by the fuzz run: an integer too large for a float used to raise OverflowError
    "time-huge-int": "field 'create_time': expected seconds since the epoch in 0..100000000000, "
    "got a 1329-bit number",
    "scalar-huge-int": "field 'scalars.loss': number out of range: a 1329-bit number",
    "time-nan": "field 'time': expected seconds since the epoch",
    "time-negative-infinity": "field 'started': expected seconds since the epoch",
    "top-level-list": "expected a JSON object, got a list",
    "top-level-string": "expected a JSON object, got a string",
    "trailing-garbage": "not valid JSON: Extra data",
    "truncated": "not valid JSON",
    "utf16": "not UTF-8 text",
    "utf8-bom": "not valid JSON: Unexpected UTF-8 BOM",
}


def _generated_heartbeats() -> dict[str, tuple[Callable[[Path, Path], Path], str]]:
    """Bad heartbeat files that cannot be committed: made in the state dir at test time.
    Each maker gets (state dir, good file) and returns the path it made."""

    def named(name: str, content: bytes | None = None) -> Callable[[Path, Path], Path]:
        def make(state: Path, good: Path) -> Path:
            path = state / name  # a lone surrogate stands for the undecodable byte
            path.write_bytes(good.read_bytes() if content is None else content)
            return path

        return make

    def huge(state: Path, good: Path) -> Path:
        doc = json.loads(good.read_text())
        doc["padding"] = "x" * (3 << 20)  # a real 3 MiB of JSON, not a sparse file
        path = state / "huge-00000000.rank0.heartbeat.json"
        path.write_text(json.dumps(doc))
        return path

    def link_to_good(state: Path, good: Path) -> Path:
        path = state / "link-00000000.rank0.heartbeat.json"
        path.symlink_to(good)
        return path

    def link_to_passwd(state: Path, good: Path) -> Path:
        path = state / "passwd-00000000.rank0.heartbeat.json"
        path.symlink_to("/etc/passwd")
        return path

    def dangling(state: Path, good: Path) -> Path:
        path = state / "dangling-00000000.rank0.heartbeat.json"
        path.symlink_to(state / "nowhere")
        return path

    def fifo(state: Path, good: Path) -> Path:
        path = state / "fifo-00000000.rank0.heartbeat.json"
        os.mkfifo(path)
        return path

    def directory(state: Path, good: Path) -> Path:
        path = state / "dir-00000000.rank0.heartbeat.json"
        path.mkdir()
        (path / "inside.heartbeat.json").write_bytes(good.read_bytes())
        return path

    return {
        "huge": (huge, "larger than the 1 MiB limit"),
        "symlink-to-good": (link_to_good, "is a symbolic link; refused"),
        "symlink-to-passwd": (link_to_passwd, "is a symbolic link; refused"),
        "dangling-symlink": (dangling, "is a symbolic link; refused"),
        "fifo": (fifo, "not a regular file"),
        "directory": (directory, "not a regular file"),
        # a valid heartbeat under a name its run would not get: odd characters in the name
        "name-with-newline": (named("evil\nname.heartbeat.json"), "file name does not match"),
        "name-with-escape": (named("red\x1b[31m.heartbeat.json"), "file name does not match"),
        "name-not-utf8": (named("caf\udce9.heartbeat.json"), "file name does not match"),
        "name-unicode-space": (named("ünï cødé ✓.heartbeat.json"), "file name does not match"),
        "name-only-suffix": (named(".heartbeat.json"), None),  # hidden: ignored
        "empty-file": (named("empty-00000000.rank0.heartbeat.json", b""), "empty file"),
    }  # type: ignore[dict-item]


GENERATED_HEARTBEATS = _generated_heartbeats()


def test_every_corpus_file_has_an_expectation() -> None:
    hb = {p.name.removesuffix(".heartbeat.json") for p in HEARTBEATS.iterdir()}
    assert hb == set(HEARTBEAT_REASONS)
    mf = {p.name.removesuffix(".json") for p in MANIFESTS.iterdir()}
    assert mf == set(MANIFEST_REASONS)


class Served:
    """One exporter for a whole corpus, with the log read incrementally."""

    def __init__(self, exp: Exporter, directory: Path) -> None:
        self.exp = exp
        self.dir = directory
        self.offset = 0

    def new_log(self) -> str:
        log = self.exp.log()
        new, self.offset = log[self.offset :], len(log)
        return new


@pytest.fixture(scope="module")
def heartbeat_exporter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("hbcorpus")
    state = root / "state"
    state.mkdir()
    put(state, own_heartbeat("good", scalars={"loss": 0.5}))
    with Exporter(state_dir=state, log_path=root / "exporter.log") as exp:
        served = Served(exp, state)
        s = exp.scrape()
        assert value(s, "trainguard_collector_success", collector="runs") == 1
        yield served
        log = exp.stop()
    assert "Traceback" not in log


def check_one_bad_heartbeat(
    served: Served, path: Path, reason: str | None, log_name: str | None = None
) -> None:
    # nothing (a FIFO, a huge file) may hold the scrape: a runs collector stuck on a file would
    # be left out of it (after --collector.timeout), and the asserts below would fail
    s = served.exp.scrape()
    log = served.new_log()
    assert value(s, "trainguard_run_process_up", run="good", rank="0") == 1
    assert value(s, "trainguard_run_scalar", run="good", rank="0", name="loss") == 0.5
    assert value(s, "trainguard_heartbeat_files") == 1
    assert value(s, "trainguard_exporter_build_info", version=_version()) == 1
    assert {dict(lbl)["run"] for lbl in select(s, "trainguard_run_info")} == {"good"}
    assert "Traceback" not in log
    if reason is None:  # ignored, not an error
        assert value(s, "trainguard_heartbeat_file_errors") == 0
        assert value(s, "trainguard_collector_success", collector="runs") == 1
        return
    assert value(s, "trainguard_heartbeat_file_errors") == 1
    # one bad file costs that file: its own series, not the collector's success
    assert value(s, "trainguard_collector_success", collector="runs") == 1
    assert value(s, "trainguard_collector_success", collector="checkpoints") == 1
    assert [dict(lbl)["file"] for lbl in select(s, "trainguard_heartbeat_file_invalid")] == [
        log_name or path.name
    ]
    lines = log.splitlines()
    name = log_name or path.name
    named = [ln for ln in lines if name in ln]
    assert len(named) == 1, (name, log)
    assert reason in named[0], named[0]
    assert "level=WARNING" in named[0]
    # one line per error: a newline in a file name cannot forge a second log line
    assert len([ln for ln in lines if "level=" in ln]) == len(lines), log


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def recover(served: Served) -> None:
    s = served.exp.scrape()
    assert value(s, "trainguard_collector_success", collector="runs") == 1
    assert value(s, "trainguard_heartbeat_file_errors") == 0
    served.new_log()


@pytest.mark.parametrize("case", sorted(HEARTBEAT_REASONS))
def test_heartbeat_corpus(heartbeat_exporter: Served, case: str) -> None:
    path = heartbeat_exporter.dir / f"{case}.heartbeat.json"
    shutil.copy(HEARTBEATS / path.name, path)
    try:
        check_one_bad_heartbeat(heartbeat_exporter, path, HEARTBEAT_REASONS[case])
    finally:
        path.unlink()
    recover(heartbeat_exporter)


@pytest.mark.parametrize("case", sorted(GENERATED_HEARTBEATS))
def test_generated_bad_heartbeats(heartbeat_exporter: Served, case: str) -> None:
    make, reason = GENERATED_HEARTBEATS[case]
    state = heartbeat_exporter.dir
    path = make(state, state / heartbeat_filename("good", 0))
    try:
        # the log shows control characters escaped and undecodable bytes as \udcXX
        check_one_bad_heartbeat(heartbeat_exporter, path, reason, printable(path.name))
    finally:
        remove(path)
    recover(heartbeat_exporter)


def _version() -> str:
    from trainguard import __version__

    return __version__


# ---------------------------------------------------------------- manifest corpus

#: corpus file (without .json), a record of step_1.pt -> what the log line must say
MANIFEST_REASONS = {
    "binary": "not a JSON record",
    "deep-nesting": "not a JSON record: maximum recursion depth",
    "duplicate-keys": "duplicate key 'size'",
    "empty": "not a JSON record",
    "extra-key": "unexpected keys (missing [], unknown ['extra'])",
    "latin1": "not a JSON record: 'utf-8' codec can't decode",
    "malformed": "not a JSON record",
    "missing-key": "unexpected keys (missing ['size'], unknown [])",
    "name-absolute": "is not a plain file name inside the checkpoint directory",
    "name-backslash": "is not a plain file name inside the checkpoint directory",
    "name-drive": "is not a plain file name inside the checkpoint directory",
    "name-empty": "is not a plain file name inside the checkpoint directory",
    "name-hidden": "is not a plain file name inside the checkpoint directory",
    "name-newline": "is not a plain file name inside the checkpoint directory",
    "name-nul": "is not a plain file name inside the checkpoint directory",
    "name-number": "is not a plain file name inside the checkpoint directory",
    "name-other-file": "record file is for 'step_1.pt' but names 'step_2.pt'",
    "name-parent": "is not a plain file name inside the checkpoint directory",
    "name-parent-dir": "is not a plain file name inside the checkpoint directory",
    "nul-bytes": "not a JSON record",
    "sha256-number": "sha256: expected 64 lowercase hex digits or null",
    "sha256-short": "sha256: expected 64 lowercase hex digits or null",
    "sha256-uppercase": "sha256: expected 64 lowercase hex digits or null",
    "size-bool": "size: expected an integer 0..2^63-1, got True",
    "size-float": "size: expected an integer 0..2^63-1, got 10.0",
    "size-huge-int": "not a JSON record: Exceeds the limit",
    "size-negative": "size: expected an integer 0..2^63-1, got -10",
    "size-over-int64": "size: expected an integer 0..2^63-1",
    "size-string": "size: expected an integer 0..2^63-1, got '10'",
    "source-empty": "source: expected a path of 1-4096 characters or null",
    "source-list": "source: expected a path of 1-4096 characters or null",
    "step-null": "step: expected an integer 0..2^63-1, got None",
    "top-level-list": "not a JSON object",
    "truncated": "not a JSON record",
    "utf8-bom": "not a JSON record: Unexpected UTF-8 BOM",
    "version-2": "unsupported version 2",
    "version-string": "unsupported version '1'",
    "written-infinity": "not a JSON record: Infinity is not a number",
    "written-nan": "not a JSON record: NaN is not a number",
    "written-negative": "written: expected a non-negative Unix time",
    "written-huge-int": "written: expected a non-negative Unix time",
    "written-string": "written: expected a non-negative Unix time",
}


def _generated_manifests() -> dict[str, tuple[Callable[[Path], Path], str]]:
    """Bad manifest entries made at test time in the bad location's directory."""

    def huge(d: Path) -> Path:
        path = record_path(d, "step_1.pt")
        path.write_bytes(b" " * (1 << 20) + b"{}")
        return path

    def link(target: str) -> Callable[[Path], Path]:
        def make(d: Path) -> Path:
            path = record_path(d, "step_1.pt")
            path.symlink_to(target)
            return path

        return make

    def fifo(d: Path) -> Path:
        path = record_path(d, "step_1.pt")
        os.mkfifo(path)
        return path

    def not_plain(d: Path) -> Path:
        path = d / MANIFEST_DIR / "C:step_1.pt.json"
        path.write_bytes(Record("step_1.pt", 1, 10, None, 1.0).encode())
        return path

    def manifest_dir_link(d: Path) -> Path:
        shutil.rmtree(d / MANIFEST_DIR)
        (d / MANIFEST_DIR).symlink_to("/etc")
        return d / MANIFEST_DIR

    def checkpoint_link(d: Path) -> Path:
        path = d / "step_2.pt"
        path.symlink_to("/etc/passwd")
        return path

    return {
        "huge": (huge, "larger than 16384 bytes"),
        "record-symlink-to-passwd": (link("/etc/passwd"), "is a symbolic link; refused"),
        "record-dangling-symlink": (link("/nonexistent/x.json"), "is a symbolic link; refused"),
        "record-fifo": (fifo, "not a regular file; refused"),
        "record-not-plain-name": (not_plain, "not a record of a plain file name"),
        "manifest-dir-symlink": (manifest_dir_link, "is not a directory (a link or a file)"),
        "checkpoint-symlink-to-passwd": (checkpoint_link, "links are not followed"),
    }


GENERATED_MANIFESTS = _generated_manifests()


@pytest.fixture(scope="module")
def manifest_exporter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("mfcorpus")
    good, bad = root / "good", root / "bad"
    for d in (good, bad):
        d.mkdir()
        save(b"0123456789", d / "step_1.pt")
    cfg = root / "tg.yml"
    cfg.write_text(
        "runs:\n"
        f"  - name: good\n    checkpoints: {{primary: {good}}}\n"
        f"  - name: bad\n    checkpoints: {{primary: {bad}}}\n"
    )
    with Exporter(
        args=[f"--config.file={cfg}"], state_dir=root / "state", log_path=root / "exporter.log"
    ) as exp:
        served = Served(exp, bad)
        s = exp.scrape()
        assert value(s, "trainguard_checkpoint_last_step", run="bad", location="primary") == 1
        assert value(s, "trainguard_collector_success", collector="checkpoints") == 1
        os.unlink(record_path(bad, "step_1.pt"))
        yield served
        log = exp.stop()
    assert "Traceback" not in log


def check_one_bad_record(served: Served, path: Path, reason: str) -> None:
    s = served.exp.scrape()
    log = served.new_log()

    def ck(name: str, run: str) -> float | None:
        return value(s, f"trainguard_checkpoint_{name}", run=run, location="primary")

    assert ck("location_up", "good") == 1 and ck("last_step", "good") == 1
    assert ck("location_up", "bad") == 0
    assert ck("last_step", "bad") is None and ck("files", "bad") is None
    assert value(s, "trainguard_collector_success", collector="checkpoints") == 0
    assert value(s, "trainguard_collector_success", collector="runs") == 1
    lines = [ln for ln in log.splitlines() if "location 'primary' at " in ln]
    assert len(lines) == 1, log
    assert f"checkpoints of run 'bad', location 'primary' at {served.dir}: " in lines[0]
    assert reason in lines[0], lines[0]
    assert "Traceback" not in log
    assert "root:" not in log  # nothing of /etc/passwd was read into the log


def recover_checkpoints(served: Served) -> None:
    s = served.exp.scrape()
    assert value(s, "trainguard_collector_success", collector="checkpoints") == 1
    assert value(s, "trainguard_checkpoint_location_up", run="bad", location="primary") == 1
    # without a record the file is unrecorded: never complete
    assert value(s, "trainguard_checkpoint_unrecorded_files", run="bad", location="primary") == 1
    served.new_log()


@pytest.mark.parametrize("case", sorted(MANIFEST_REASONS))
def test_manifest_corpus(manifest_exporter: Served, case: str) -> None:
    path = record_path(manifest_exporter.dir, "step_1.pt")
    shutil.copy(MANIFESTS / f"{case}.json", path)
    try:
        check_one_bad_record(manifest_exporter, path, MANIFEST_REASONS[case])
    finally:
        path.unlink()
    recover_checkpoints(manifest_exporter)


@pytest.mark.parametrize("case", sorted(GENERATED_MANIFESTS))
def test_generated_bad_manifest_entries(manifest_exporter: Served, case: str) -> None:
    make, reason = GENERATED_MANIFESTS[case]
    path = make(manifest_exporter.dir)
    try:
        check_one_bad_record(manifest_exporter, path, reason)
    finally:
        remove(path)
        (manifest_exporter.dir / MANIFEST_DIR).mkdir(exist_ok=True)
    recover_checkpoints(manifest_exporter)


# ---------------------------------------------------------------- odd checkpoint names


def test_odd_checkpoint_file_names(tmp_path: Path) -> None:
    """Names that look almost like checkpoints: only exact pattern matches with a plain name
    count; the rest are ignored without an error. No name reaches a label (``step`` is the
    parsed integer)."""
    d = tmp_path / "ckpt"
    d.mkdir()
    save(b"x" * 10, d / "step_5.pt")
    counted = {
        b"step_6.pt (copy)": 6,  # any extension
        b"step_7.pt.\xff": 7,  # an extension that is not UTF-8
        b"step_000000000000000008": 8,  # 18 digits with zeros
    }
    ignored = [
        b"step 5.pt",
        b"step_5 final.pt",
        "step_٣.pt".encode(),  # an Arabic-Indic digit is not a step
        "ünïcødé_step_9.pt".encode(),
        b"step_abc.pt",
        b"step_-1.pt",
        b"step_+1.pt",
        b"step_1e3.pt",
        b"step_99999999999999999999.pt",  # 20 digits: beyond the pattern, not a huge step
        b"step_1\n.pt",
        b"step_1.pt\n",
        b"step_1.pt\r",
        b"step_\t1.pt",
        b".step_100.pt",
        b"step_.pt",
        b"STEP_100.pt",
    ]
    for name in [*counted, *ignored]:
        with open(os.fsencode(d) + b"/" + name, "wb") as f:
            f.write(b"y" * 3)
    (d / "step_100.pt").mkdir()  # a directory of a checkpoint's name is not one
    cfg = tmp_path / "tg.yml"
    cfg.write_text(f"runs:\n  - name: odd\n    checkpoints: {{primary: {d}}}\n")
    with Exporter(args=[f"--config.file={cfg}"], state_dir=tmp_path / "state") as exp:
        text = exp.get()
        s = exp.scrape()
        log = exp.stop()

    def ck(name: str) -> float | None:
        return value(s, f"trainguard_checkpoint_{name}", run="odd", location="primary")

    assert ck("location_up") == 1 and ck("last_step") == 5
    assert ck("files") == 1 + len(counted)
    assert ck("unrecorded_files") == len(counted)
    steps = {dict(lbl)["step"] for lbl in select(s, "trainguard_checkpoint_size_bytes")}
    assert steps == {"5", "6", "7", "8"}
    assert value(s, "trainguard_collector_success", collector="checkpoints") == 1
    assert "Traceback" not in log
    for bad in ("copy", "abc", "99999999999999999999", "ünï", "\\udcff"):
        assert bad not in text


# ---------------------------------------------------------------- a huge state dir


def _touch_many(directory: Path, names: Iterator[str]) -> None:
    flags = os.O_CREAT | os.O_WRONLY
    for name in names:
        os.close(os.open(directory / name, flags, 0o644))


@pytest.mark.slow
def test_a_state_dir_of_100k_entries(tmp_path: Path, many_files_path: Path) -> None:
    """100 000 unrelated entries next to two real heartbeats: scrapes stay small. Then 10 001
    files that look like heartbeats: the read is capped, the cap is an error, the log says so
    in a bounded number of lines, and the scrape still answers. (How long these scrapes take
    is measured by bench/bench_big_dirs.py; that unchanged files are not read again, by
    test_runtable.py.)"""
    state = many_files_path / "state"
    state.mkdir()
    _touch_many(state, (f"junk_{i}.log" for i in range(100_000)))
    put(state, own_heartbeat("big-dir-a"))
    put(state, own_heartbeat("big-dir-b"))
    with Exporter(state_dir=state, log_path=tmp_path / "exporter.log") as exp:
        proc = psutil.Process(exp.proc.pid)
        exp.scrape()  # warm
        rss = proc.memory_info().rss
        for _ in range(5):
            s = exp.scrape()
        assert value(s, "trainguard_heartbeat_files") == 2
        assert value(s, "trainguard_collector_success", collector="runs") == 1
        assert proc.memory_info().rss - rss < 16 << 20
        _touch_many(state, (f"x{i}-00000000.rank0.heartbeat.json" for i in range(10_001)))
        time.sleep(0.02)  # the live runs write again (a reporter does every few seconds)
        put(state, own_heartbeat("big-dir-a"))
        put(state, own_heartbeat("big-dir-b"))
        exp.scrape()
        s = exp.scrape()
        assert value(s, "trainguard_collector_success", collector="runs") == 0  # too many
        assert value(s, "trainguard_heartbeat_file_errors") is not None
        # the newest files are the ones read: the live runs are still watched
        assert {"big-dir-a", "big-dir-b"} <= samples_runs(s)
        assert proc.memory_info().rss - rss < 64 << 20
        log = exp.stop()
    assert "more than 10000 heartbeat files; only the 10000 most recently written" in log
    assert "more new errors not logged" in log
    assert len(log.splitlines()) < 50, len(log.splitlines())  # not 10 000 lines
    assert "Traceback" not in log


def samples_runs(s: Samples) -> set[str]:
    return {dict(lbl)["run"] for lbl in select(s, "trainguard_run_info")}
