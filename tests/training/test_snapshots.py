"""Memory snapshots before the OOM: the rolling schedule, the on-demand request (``trainguard
snapshot``), the metadata, the counters, and the failures that must never reach training (no
CUDA, a torch without the API, a full disk), on this machine's real CPU build of torch.

Where a snapshot must actually be written, torch's missing C entry points are provided
(helpers/cuda_snapshot.py): torch's Python layer and all of trainguard run for real. Whether a
real GPU's snapshot loads in memory_viz is the GPU check's (issue 18), not this file's."""

from __future__ import annotations

import json
import logging
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers import cuda_snapshot
from helpers.exporter_proc import Exporter, child_env, select, value
from helpers.paths import REPO
from helpers.run_child import own_heartbeat, put, wait_heartbeat
from helpers.wait import wait_for
from trainguard.exporter.terminal.snapshot import SnapshotError, request_snapshot
from trainguard.run.reporter import Run
from trainguard.run.snapshots import capture as snap
from trainguard.run.snapshots import requests as snapshot_requests
from trainguard.shared.heartbeat.read import read_heartbeat
from trainguard.shared.heartbeat.record import (
    Heartbeat,
    SnapshotRecord,
    SnapshotState,
    heartbeat_filename,
)
from trainguard.shared.snapshots import (
    REPLY_SUFFIX,
    REQUEST_SUFFIX,
    Request,
    parse_snapshot_name,
    run_stem,
    write_json,
)


def read(run: Run) -> Heartbeat:
    return read_heartbeat(run.path)


def counts(hb: Heartbeat, which: str = "counts") -> dict[str, int]:
    assert hb.snapshots is not None
    return dict(getattr(hb.snapshots, which))


def files(state: Path, name: str, rank: int = 0) -> list[str]:
    """The snapshot files of a run, sorted."""
    stem = run_stem(name, rank)
    return sorted(p.name for p in state.iterdir() if parse_snapshot_name(p.name, stem))


def step_until(run: Run, ok: Any, start: int = 0, timeout: float = 60.0) -> int:
    """Step the run (as a training loop would) until its heartbeat satisfies ``ok``."""
    step = start

    def stepped() -> bool:
        nonlocal step
        run.step(step, loss=1.0, batch_size=32.0)
        step += 1
        try:
            return bool(ok(read(run)))
        except Exception:  # not written yet
            return False

    wait_for(stepped, timeout, 0.005, lambda: f"the condition; last heartbeat: {read(run)}")
    return step


# ------------------------------------------------------------------------------- no CUDA


def test_without_cuda_every_due_snapshot_is_counted_logged_once_and_training_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The real CPU build of torch, nothing provided: torch.cuda.memory._snapshot raises."""
    assert not torch.cuda.is_available()
    caplog.set_level(logging.WARNING, "trainguard")
    run = Run("cpu", state_dir=tmp_path, interval=0.01, oom_snapshots=True, snapshot_steps=2)
    last = step_until(run, lambda hb: counts(hb, "failures")["periodic"] >= 3)
    with pytest.raises(SnapshotError, match="no snapshot: CUDA is not available"):
        request_snapshot(tmp_path, "cpu", 0, timeout=60)
    run.step(last + 1)
    run.close()
    hb = read(run)
    assert hb.state == "finished" and hb.step == last + 1
    assert hb.snapshots is not None and hb.snapshots.history is False
    assert counts(hb) == {"oom": 0, "periodic": 0, "requested": 0}
    assert counts(hb, "failures")["requested"] == 1
    assert files(tmp_path, "cpu") == []
    not_taken = [r.getMessage() for r in caplog.records if "not taken" in r.getMessage()]
    assert len(not_taken) == 1, not_taken  # one kind of failure, logged once
    assert "CUDA is not available" in not_taken[0]


def test_a_torch_without_the_snapshot_api_is_counted_and_logged_once(
    tmp_path: Path, monkeypatch: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """CUDA said available, but torch's C extension lacks the snapshot and history entry
    points (an old or unusual build): the real torch.cuda.memory functions raise
    AttributeError, which is counted, logged once, and never reaches training."""
    caplog.set_level(logging.WARNING, "trainguard")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert not hasattr(torch._C, "_cuda_memorySnapshot")
    run = Run("old", state_dir=tmp_path, interval=0.01, oom_snapshots=True, snapshot_steps=1)
    step_until(run, lambda hb: counts(hb, "failures")["periodic"] >= 3)
    with pytest.raises(torch.cuda.OutOfMemoryError), run.capture_oom():
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")
    run.close()
    hb = read(run)
    assert hb.state == "finished" and hb.snapshots is not None
    assert hb.snapshots.history is False and counts(hb)["oom"] == 0
    assert counts(hb, "failures")["oom"] == 1
    assert files(tmp_path, "old") == []
    messages = [r.getMessage() for r in caplog.records]
    assert len([m for m in messages if "not taken" in m]) == 1, messages
    assert [m for m in messages if "_cuda_record_memory_history" in m]  # the history, once
    assert [m for m in messages if "_cuda_memorySnapshot" in m]


def test_without_oom_snapshots_nothing_is_scheduled_or_answered(tmp_path: Path) -> None:
    run = Run("plain", state_dir=tmp_path, interval=0.01)
    run.step(1)
    run.close()
    assert read(run).snapshots is None
    with pytest.raises(SnapshotError, match="has finished"):
        request_snapshot(tmp_path, "plain", 0, timeout=5)


# --------------------------------------------------------------- with the snapshot API


def test_rolling_snapshots_keep_the_newest_files_with_their_metadata(
    tmp_path: Path, monkeypatch: Any
) -> None:
    calls = cuda_snapshot.install(monkeypatch, torch)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    config = {"lr": 3e-4, "batch_size": 64, "model": "toy", "path": Path("/data")}
    run = Run(
        "roll",
        state_dir=tmp_path,
        interval=0.01,
        oom_snapshots=True,
        snapshot_steps=3,
        snapshot_keep=2,
        config=config,
    )
    assert calls == ["record"]
    step_until(run, lambda hb: counts(hb)["periodic"] >= 4)
    run.close()
    hb = read(run)
    n = counts(hb)["periodic"]
    stem = run_stem("roll", 0)
    assert files(tmp_path, "roll") == sorted(
        f"{stem}.periodic-{i}.{ext}" for i in (n - 1, n) for ext in ("json", "pickle")
    )
    assert hb.snapshots is not None and hb.snapshots.history is True
    assert [r.file for r in hb.snapshots.recent] == [
        f"{stem}.periodic-{n - 1}.pickle",
        f"{stem}.periodic-{n}.pickle",
    ]  # the rotated ones left the list
    with open(tmp_path / f"{stem}.periodic-{n}.pickle", "rb") as f:
        assert pickle.load(f) == cuda_snapshot.SNAPSHOT
    meta = json.loads((tmp_path / f"{stem}.periodic-{n}.json").read_text())
    assert meta["format"] == 1 and (meta["run"], meta["rank"]) == ("roll", 0)
    assert (meta["reason"], meta["number"]) == ("periodic", n)
    assert meta["snapshot"] == f"{stem}.periodic-{n}.pickle"
    assert meta["bytes"] == (tmp_path / meta["snapshot"]).stat().st_size
    assert meta["step"] % 3 == 0 or meta["step"] > 3  # due at a multiple of 3, seen then
    assert meta["scalars"] == {"loss": 1.0, "batch_size": 32.0}
    assert meta["batch_size"] == 32.0  # the scalar wins over the config's
    assert meta["config"] == {"lr": 3e-4, "batch_size": 64, "model": "toy", "path": "/data"}
    assert meta["torch_version"] == torch.__version__
    assert meta["cuda_version"] == torch.version.cuda  # None on this CPU build
    assert meta["pytorch_cuda_alloc_conf"] == "expandable_segments:True"
    assert meta["history_recorded"] is True and meta["request"] is None
    assert meta["devices"] == []  # CUDA never initialised here: no devices to describe


def test_snapshots_every_n_seconds(tmp_path: Path, monkeypatch: Any) -> None:
    cuda_snapshot.install(monkeypatch, torch)
    run = Run("timed", state_dir=tmp_path, interval=0.01, oom_snapshots=True, snapshot_seconds=1)
    run.step(7)
    hb = wait_heartbeat(run.path, lambda hb: counts(hb)["periodic"] >= 2)
    run.close()
    assert hb.snapshots is not None and hb.snapshots.recent[-1].step == 7
    assert len(files(tmp_path, "timed")) == 4  # keep=2 by default: 2 pickles, 2 .json


def test_a_requested_snapshot_is_taken_on_the_reporters_thread_and_replied(
    tmp_path: Path, monkeypatch: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "trainguard")
    cuda_snapshot.install(monkeypatch, torch)
    run = Run("ask", state_dir=tmp_path, interval=0.01, oom_snapshots=True)
    run.step(12, loss=0.5)
    wait_heartbeat(run.path, lambda hb: hb.step == 12)
    taken = request_snapshot(tmp_path, "ask", 0, timeout=60)
    stem = run_stem("ask", 0)
    assert taken.snapshot == tmp_path / f"{stem}.requested-1.pickle" and taken.step == 12
    meta = json.loads(taken.metadata.read_text())
    assert meta["reason"] == "requested" and meta["request"]["by"].endswith(f"pid {os.getpid()}")
    assert not (tmp_path / (stem + REQUEST_SUFFIX)).exists()  # consumed
    # a second request at once is refused (at most one every 30s), and says so
    with pytest.raises(SnapshotError, match="at most one every 30s"):
        request_snapshot(tmp_path, "ask", 0, timeout=60)
    hb = wait_heartbeat(run.path, lambda hb: counts(hb)["requested"] == 1)
    run.close()
    assert counts(hb, "failures") == {"oom": 0, "periodic": 0, "requested": 0}
    assert [r.getMessage() for r in caplog.records if "requested (" in r.getMessage()]


def test_bad_request_files_are_ignored_without_harm(
    tmp_path: Path, monkeypatch: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "trainguard")
    cuda_snapshot.install(monkeypatch, torch)
    run = Run("bad", state_dir=tmp_path, interval=0.01, oom_snapshots=True)
    stem = run_stem("bad", 0)
    request = tmp_path / (stem + REQUEST_SUFFIX)
    secret = tmp_path / "secret"
    secret.write_text("do not read")
    for plant in ("garbage", "symlink", "fifo"):
        if plant == "garbage":
            request.write_bytes(b"\xff not json")
        elif plant == "symlink":
            request.symlink_to(secret)
        else:
            os.mkfifo(request)
        wait_for(lambda: not os.path.lexists(request), 60, 0.01, f"the {plant} request removed")
    run.step(1)
    run.close()
    assert counts(read(run)) == {"oom": 0, "periodic": 0, "requested": 0}
    assert not (tmp_path / (stem + REPLY_SUFFIX)).exists()
    assert secret.read_text() == "do not read"
    assert [r for r in caplog.records if "snapshot request ignored" in r.getMessage()]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to plant another user's file")
def test_a_request_of_another_user_is_refused(tmp_path: Path, monkeypatch: Any) -> None:
    cuda_snapshot.install(monkeypatch, torch)
    run = Run("theirs", state_dir=tmp_path, interval=0.01, oom_snapshots=True)
    stem = run_stem("theirs", 0)
    req = Request.new("mallory", time.time())
    tmp = tmp_path / "planted.json"
    write_json(tmp, req.to_dict())
    os.chown(tmp, 12345, 12345)
    os.replace(tmp, tmp_path / (stem + REQUEST_SUFFIX))
    reply_path = tmp_path / (stem + REPLY_SUFFIX)
    wait_for(reply_path.exists, 60, 0.01, f"a reply at {reply_path}")
    reply = json.loads(reply_path.read_text())
    run.close()
    assert reply["id"] == req.id and reply["ok"] is False and "uid 12345" in reply["error"]
    assert counts(read(run))["requested"] == 0


def test_an_oom_keeps_the_snapshot_from_before_it(tmp_path: Path, monkeypatch: Any) -> None:
    cuda_snapshot.install(monkeypatch, torch)
    run = Run("before", state_dir=tmp_path, interval=0.01, oom_snapshots=True, snapshot_steps=1)
    step_until(run, lambda hb: counts(hb)["periodic"] >= 2)
    with pytest.raises(torch.cuda.OutOfMemoryError), run.capture_oom():
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    run.close()
    stem = run_stem("before", 0)
    names = files(tmp_path, "before")
    assert f"{stem}.oom-1.pickle" in names and f"{stem}.oom-1.json" in names
    assert f"{stem}.oom-1.before.pickle" in names and f"{stem}.oom-1.before.json" in names
    before = json.loads((tmp_path / f"{stem}.oom-1.before.json").read_text())
    assert before["reason"] == "periodic"  # the periodic snapshot, renamed out of rotation
    oom = json.loads((tmp_path / f"{stem}.oom-1.json").read_text())
    assert oom["reason"] == "oom" and oom["step"] >= before["step"]
    assert read(run).memory_snapshots == 1


# ------------------------------------------------------------------------ bad arguments


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"snapshot_steps": 10}, "need oom_snapshots=True"),
        ({"oom_snapshots": True, "snapshot_steps": 0}, "snapshot_steps: expected an integer"),
        ({"oom_snapshots": True, "snapshot_steps": 2.5}, "snapshot_steps: expected an integer"),
        ({"oom_snapshots": True, "snapshot_seconds": 0.1}, "snapshot_seconds: expected"),
        ({"oom_snapshots": True, "snapshot_keep": 0}, "snapshot_keep: expected 1..100"),
        ({"config": [1, 2]}, "config: expected a mapping"),
        ({"config": {"x": "y" * 70_000}}, "config: larger than 65536 bytes"),
        ({"config": {"x": float("nan"), ("a", 1): 2}}, "config: not JSON-serialisable"),
    ],
)
def test_bad_snapshot_arguments_are_clear_errors(
    tmp_path: Path, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Run("args", state_dir=tmp_path, **kwargs)


# ------------------------------------------------------------------- real processes

CHILD = r"""
import os, signal, sys, time
import torch
import trainguard

name, state, mode, pad = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
if mode != "no-cuda":
    exec(sys.argv[5])  # helpers/cuda_snapshot.py: the entry points a CUDA build has
if mode == "fsize":  # file size limit: a large snapshot fails to write (EFBIG), not the run
    import resource
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, 256 * 1024))
run = trainguard.Run(name, state_dir=state, interval=0.02, oom_snapshots=True,
                     snapshot_steps=5, config={"batch_size": 8})
step = 0
while not os.path.exists(os.path.join(state, "stop")):
    run.step(step, loss=1.0)
    step += 1
    time.sleep(0.005)
run.step(step, loss=0.0)
run.close()
print("trained to", step, flush=True)
"""


def start_child(
    name: str, state: Path, mode: str, pad: int = 0, prefix: list[str] | None = None
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            *(prefix or []),
            sys.executable,
            "-c",
            CHILD,
            name,
            str(state),
            mode,
            str(pad),
            cuda_snapshot.child_source(pad),
        ],
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(proc: subprocess.Popen[str], state: Path) -> str:
    (state / "stop").write_text("")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    return out


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainguard.exporter.terminal", "snapshot", *args],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_trainguard_snapshot_asks_a_live_training_process(tmp_path: Path) -> None:
    """Two real processes: a training child and the ``trainguard snapshot`` command."""
    state = tmp_path / "state"
    state.mkdir()
    proc = start_child("live run", state, "api")
    try:
        path = state / heartbeat_filename("live run", 0)
        wait_heartbeat(path, lambda hb: hb.snapshots is not None and hb.step is not None)
        out = cli("live run", "--state.dir", str(state), "--json")
        assert out.returncode == 0, out.stdout + out.stderr
        doc = json.loads(out.stdout)
        meta = json.loads(Path(doc["metadata"]).read_text())
        assert meta["reason"] == "requested" and meta["batch_size"] == 8
        assert meta["step"] == doc["step"] and Path(doc["snapshot"]).is_file()
        with open(doc["snapshot"], "rb") as f:
            assert pickle.load(f)["segments"] == cuda_snapshot.SNAPSHOT["segments"]
        text = cli("live run", "--state.dir", str(state))  # within 30s: refused
        assert text.returncode == 1 and "at most one every 30s" in text.stderr
        wrong = cli("live run", "--state.dir", str(state), "--rank", "3")
        assert wrong.returncode == 1 and "no heartbeat of run 'live run' rank 3" in wrong.stderr
        bad = cli("live\nrun", "--state.dir", str(state))
        assert bad.returncode == 2 and "control characters" in bad.stderr
    finally:
        out_text = finish(proc, state)
    hb = read_heartbeat(path)
    assert hb.state == "finished" and "trained to" in out_text
    assert counts(hb)["requested"] == 1 and counts(hb)["periodic"] >= 1
    gone = cli("live run", "--state.dir", str(state))
    assert gone.returncode == 1 and "has finished" in gone.stderr


def test_a_process_without_cuda_answers_and_keeps_training(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    proc = start_child("cpu-only", state, "no-cuda")
    try:
        path = state / heartbeat_filename("cpu-only", 0)
        wait_heartbeat(path, lambda hb: counts(hb, "failures")["periodic"] >= 2)
        out = cli("cpu-only", "--state.dir", str(state))
        assert out.returncode == 1 and "CUDA is not available" in out.stderr, out.stderr
        before = read_heartbeat(path).step or 0
        wait_heartbeat(path, lambda hb: (hb.step or 0) > before + 10)  # still training
    finally:
        log = finish(proc, state)
    hb = read_heartbeat(path)
    assert hb.state == "finished"
    assert counts(hb, "failures")["requested"] == 1 and counts(hb)["requested"] == 0
    assert log.count("not taken") == 1, log  # one kind of failure: logged once
    assert files(state, "cpu-only") == []


def test_a_snapshot_too_large_for_the_disk_fails_without_harm(tmp_path: Path) -> None:
    """RLIMIT_FSIZE makes the real write fail (EFBIG) past 256 KiB: the temp file is removed,
    the failure counted and logged once, the heartbeat (2 KiB) still written."""
    state = tmp_path / "state"
    state.mkdir()
    proc = start_child("huge", state, "fsize", pad=1 << 20)
    try:
        path = state / heartbeat_filename("huge", 0)
        wait_heartbeat(path, lambda hb: counts(hb, "failures")["periodic"] >= 3)
    finally:
        log = finish(proc, state)
    hb = read_heartbeat(path)
    assert hb.state == "finished" and counts(hb)["periodic"] == 0
    assert log.count("not taken") == 1 and "File too large" in log, log
    assert [p.name for p in state.iterdir() if p.name.endswith(".tmp")] == []
    assert files(state, "huge") == []


def test_a_nearly_full_disk_is_left_alone(tmp_path: Path) -> None:
    """The state directory on a real 8 MiB tmpfs (a mount namespace of the child's own): less
    free space than a snapshot needs, so none is written and training goes on."""
    if os.geteuid() != 0 or subprocess.run(["unshare", "--mount", "true"]).returncode != 0:
        pytest.skip("needs root and unshare(1) to mount a small tmpfs for the child")
    state = tmp_path / "state"
    state.mkdir()
    mount = ["unshare", "--mount", "sh", "-c", 'mount -t tmpfs -o size=8m tmpfs "$0" && exec "$@"']
    proc = start_child("full", state, "api", prefix=[*mount, str(state)])
    try:
        path = state / heartbeat_filename("full", 0)
        # the heartbeat is inside the child's mount: read it through its /proc root (unshare
        # and sh exec the child: it is proc.pid)
        root = Path(f"/proc/{proc.pid}/root")
        inner = root / str(path).lstrip("/")
        wait_heartbeat(inner, lambda hb: counts(hb, "failures")["periodic"] >= 2)
        (root / str(state / "stop").lstrip("/")).write_text("")
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out
    assert out.count("not taken") == 1 and "MiB free" in out, out


def test_a_death_keeps_the_dead_processs_newest_snapshot(tmp_path: Path, monkeypatch: Any) -> None:
    """The run is killed (SIGKILL) with rolling snapshots on disk; the restarted run keeps the
    newest as died-1.before, so its own rotation never deletes it."""
    state = tmp_path / "state"
    state.mkdir()
    proc = start_child("killed", state, "api")
    path = state / heartbeat_filename("killed", 0)
    try:
        wait_heartbeat(path, lambda hb: counts(hb)["periodic"] >= 2)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    prev = read_heartbeat(path)
    cuda_snapshot.install(monkeypatch, torch)
    run = Run("killed", state_dir=state, interval=0.01, oom_snapshots=True, snapshot_steps=1)
    step_until(run, lambda hb: hb.deaths == 1 and counts(hb)["periodic"] >= prev_count(prev) + 3)
    run.close()
    stem = run_stem("killed", 0)
    names = files(state, "killed")
    assert f"{stem}.died-1.before.pickle" in names and f"{stem}.died-1.before.json" in names
    kept = json.loads((state / f"{stem}.died-1.before.json").read_text())
    assert kept["pid"] == prev.pid and kept["reason"] == "periodic"
    periodic = [n for n in names if ".periodic-" in n and n.endswith(".pickle")]
    assert len(periodic) == 2  # rotation went on, numbering continued
    assert min(int(n.split("periodic-")[1].split(".")[0]) for n in periodic) > prev_count(prev)


def prev_count(hb: Heartbeat) -> int:
    return counts(hb)["periodic"]


# ------------------------------------------------------------------------------ exporter


def test_the_exporter_publishes_snapshot_counters_and_the_newest_files(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    stem = run_stem("pub", 0)
    recent = (
        SnapshotRecord(f"{stem}.periodic-4.pickle", "periodic", 400, 1_700_000_000.0, 10),
        SnapshotRecord(f"{stem}.oom-1.pickle", "oom", None, 1_700_000_100.0, 20),
    )
    hb = own_heartbeat(
        "pub",
        memory_snapshots=1,
        snapshots=SnapshotState(
            counts={"oom": 1, "periodic": 4, "requested": 0},
            failures={"periodic": 2},
            history=True,
            requests=True,
            recent=recent,
        ),
    )
    put(state, hb)
    put(state, own_heartbeat("old"))  # an older reporter: none of the new series
    with Exporter(state_dir=state) as exp:
        s = exp.scrape()
    rr = {"run": "pub", "rank": "0"}
    for reason, n in (("oom", 1), ("periodic", 4), ("requested", 0)):
        assert value(s, "trainguard_run_memory_snapshot_dumps_total", **rr, reason=reason) == n
    failures = {"oom": 0, "periodic": 2, "requested": 0}
    for reason, n in failures.items():
        assert value(s, "trainguard_run_memory_snapshot_failures_total", **rr, reason=reason) == n
    assert value(s, "trainguard_run_memory_history_recording", **rr) == 1
    assert value(s, "trainguard_run_memory_snapshots_total", **rr) == 1
    shown = select(s, "trainguard_run_memory_snapshot_timestamp_seconds", run="pub")
    by_file = {
        (dict(lbl)["reason"], dict(lbl)["file"], dict(lbl)["step"]): v for lbl, v in shown.items()
    }
    assert by_file == {
        ("periodic", f"{stem}.periodic-4.pickle", "400"): 1_700_000_000.0,
        ("oom", f"{stem}.oom-1.pickle", ""): 1_700_000_100.0,
    }
    assert select(s, "trainguard_run_memory_snapshot_dumps_total", run="old") == {}


def test_dump_constants_are_documented() -> None:
    """The bounds docs/snapshots.md promises are the code's (compared with its line breaks
    read as spaces: Markdown wraps lines anywhere)."""
    doc = REPO / "docs" / "snapshots.md"
    text = " ".join(doc.read_text(encoding="utf-8").split())
    assert f"{snap.MAX_OOM_SNAPSHOTS} OOM snapshots" in text
    assert f"the last {snap.HISTORY_ENTRIES:,} allocation events" in text
    assert f"at most one every {int(snapshot_requests.REQUEST_MIN_GAP)} seconds" in text
    assert f"less free than {snap.MIN_FREE_BYTES >> 30} GiB" in text


def test_the_gpu_check_stops_before_cuda_on_this_machine(tmp_path: Path) -> None:
    """bench/gpu_snapshot_check.py is for a CUDA machine (issue 18); here it says so and exits
    77 without writing a report."""
    script = REPO / "bench" / "gpu_snapshot_check.py"
    out = subprocess.run(
        [sys.executable, str(script), "--out", str(tmp_path)],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 77 and "no CUDA" in out.stderr, out.stdout + out.stderr
    assert list(tmp_path.iterdir()) == []
