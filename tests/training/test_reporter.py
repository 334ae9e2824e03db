"""trainguard.Run in-process: cheap steps, how a run ends, disk errors that never reach the
training loop, death detection at restart, allocator stats and OOM capture."""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import math
import os
import pickle
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

import trainguard
from helpers import cuda_snapshot
from helpers.exporter_proc import child_env
from helpers.run_child import CHILD, stat_start_ticks, wait_heartbeat
from trainguard.run.allocator import allocator_stats
from trainguard.run.reporter import Run, writer
from trainguard.shared import kernlog, procinfo
from trainguard.shared.heartbeat.read import read_heartbeat
from trainguard.shared.heartbeat.record import Death, Heartbeat, heartbeat_filename, write_heartbeat

# key names exactly as torch.cuda.memory_stats() returns them (see its docstring)
REAL_STATS = {
    "allocated_bytes.all.current": 6 << 30,
    "allocated_bytes.all.peak": 9 << 30,
    "reserved_bytes.all.current": 12 << 30,
    "inactive_split_bytes.all.current": 3 << 30,
    "num_alloc_retries": 4,
    "num_ooms": 1,
    "allocated_bytes.large_pool.current": 5 << 30,
    "active.all.current": 100,
}


def read(run: Run) -> Heartbeat:
    return read_heartbeat(run.path)


def test_step_stores_and_the_thread_writes_at_most_every_interval(
    tmp_path: Path, monkeypatch: Any
) -> None:
    writes: list[float] = []
    real = writer.write_heartbeat

    def counting(path: Any, data: Any) -> None:
        writes.append(time.monotonic())
        real(path, data)

    monkeypatch.setattr(writer, "write_heartbeat", counting)
    run = Run("cheap", state_dir=tmp_path, interval=0.1)
    start = time.monotonic()
    i = 0
    # over 10 000 steps and at least 0.55 s (what a step costs is bench/bench_step.py's job)
    while time.monotonic() - start < 0.55 or i <= 10_000:
        run.step(i, loss=1.0)
        i += 1
    elapsed = time.monotonic() - start
    run.close()
    gaps = [b - a for a, b in itertools.pairwise(writes[:-1])]  # the final write may come sooner
    # one write per interval at most (plus the first and the final one), never one per step
    assert len(writes) <= elapsed / 0.1 + 4, (elapsed, writes)
    assert all(g >= 0.09 for g in gaps), gaps
    hb = read(run)
    assert hb.step == i - 1 and hb.state == "finished"


def test_keepalive_rewrites_without_steps(tmp_path: Path) -> None:
    run = Run("idle", state_dir=tmp_path, interval=0.02, keepalive=0.1)
    first = wait_heartbeat(run.path, lambda hb: True)
    later = wait_heartbeat(run.path, lambda hb: hb.time > first.time)
    assert later.step is None
    run.close()


@pytest.mark.parametrize(
    ("exc", "state", "error"),
    [
        (None, "finished", None),
        (ValueError("boom"), "failed", "ValueError"),
        (KeyboardInterrupt(), "failed", "KeyboardInterrupt"),
        (SystemExit(0), "finished", None),
        (SystemExit(None), "finished", None),
        (SystemExit(3), "failed", "SystemExit"),
    ],
)
def test_leaving_the_with_block(
    tmp_path: Path, exc: BaseException | None, state: str, error: str | None
) -> None:
    expect = pytest.raises(type(exc)) if exc is not None else contextlib.nullcontext()
    with expect, Run("ctx", state_dir=tmp_path, interval=0.01) as run:
        run.step(5)
        if exc is not None:
            raise exc
    hb = read(run)
    assert (hb.state, hb.error, hb.step) == (state, error, 5)


def test_close_is_idempotent_and_finished_false_is_failed(tmp_path: Path) -> None:
    run = Run("closer", state_dir=tmp_path, interval=0.01)
    run.step(1)
    run.close(finished=False)
    run.close()
    run.step(2)  # after close: ignored, never raises
    hb = read(run)
    assert (hb.state, hb.step) == ("failed", 1)


def test_rank_from_torchrun_environment(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "8")
    run = Run("ddp", state_dir=tmp_path)
    assert (run.rank, run.world_size) == (5, 8)
    assert run.path.name.endswith(".rank5.heartbeat.json")
    run.close()
    monkeypatch.delenv("RANK")
    run = Run("ddp", state_dir=tmp_path)
    assert run.rank == 1
    run.close()
    monkeypatch.setenv("RANK", "not-a-rank")
    monkeypatch.delenv("LOCAL_RANK")
    run = Run("ddp", state_dir=tmp_path)
    assert run.rank == 0
    run.close()
    run = Run("ddp", state_dir=tmp_path, rank=2)
    assert run.rank == 2
    run.close()
    with pytest.raises(ValueError, match="rank"):
        Run("ddp", state_dir=tmp_path, rank=-1)


def test_bad_arguments_are_errors_at_construction(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="name"):
        Run("", state_dir=tmp_path)
    with pytest.raises(ValueError, match="name"):
        Run("a\nb", state_dir=tmp_path)
    with pytest.raises(ValueError, match="mirrors"):
        Run("x", state_dir=tmp_path, mirrors={"primary": "/x"})
    with pytest.raises(ValueError, match="interval"):
        Run("x", state_dir=tmp_path, interval=0)
    with pytest.raises(ValueError, match=r"checkpoint_pattern: expected a file name"):
        Run("x", state_dir=tmp_path, checkpoint_pattern="checkpoint")


def test_the_checkpoint_pattern_is_announced(tmp_path: Path) -> None:
    with Run("p", tmp_path / "out", state_dir=tmp_path, checkpoint_pattern="ck-{step}") as run:
        pass
    hb = read(run)
    assert (hb.checkpoint_dir, hb.checkpoint_pattern) == (str(tmp_path / "out"), "ck-{step}")


def test_bad_scalars_and_steps_are_dropped_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "trainguard")
    run = Run("scalars", state_dir=tmp_path, interval=0.01)
    for i in range(5):
        run.step(i, loss=0.5, text="x", flag=True, **{"bad name": 1.0})
        wait_heartbeat(run.path, lambda hb, i=i: hb.step == i)
    for _ in range(1000):  # tensors whose == is elementwise must not upset the writer
        run.step(6, vec=torch.ones(3))
    wait_heartbeat(run.path, lambda hb: hb.step == 6)
    run.step(torch.tensor(7))  # a 0-d integer tensor is an index: accepted
    wait_heartbeat(run.path, lambda hb: hb.step == 7)
    run.step("eight")  # type: ignore[arg-type]
    run.close()
    hb = read(run)
    assert hb.step == 7
    assert hb.scalars == {}
    messages = [r.getMessage() for r in caplog.records]
    for needle in (
        "'text' ignored",
        "'flag' ignored",
        "'bad name' ignored",
        "'vec' ignored",
        "step must be an integer",
    ):
        assert sum(needle in m for m in messages) == 1, (needle, messages)


def test_a_one_element_tensor_is_read_on_the_reporters_thread(tmp_path: Path) -> None:
    """``run.step(i, loss=loss_tensor)`` costs the training loop no GPU synchronisation: the
    tensor's value is read (``.item()``) on the reporter's thread, and counted like a float
    (a NaN loss tensor is a non-finite loss)."""
    readers: list[int] = []

    class Probe:
        """A one-element tensor as the reporter sees one, telling which thread read it."""

        def numel(self) -> int:
            return 1

        def item(self) -> float:
            readers.append(threading.get_ident())
            return 2.5

    run = Run("tensors", state_dir=tmp_path, interval=0.01)
    run.step(1, loss=torch.tensor(0.25), probe=Probe(), bad=torch.tensor(float("nan")))
    wait_heartbeat(run.path, lambda hb: hb.step == 1 and "loss" in hb.scalars)
    run.close()
    hb = read(run)
    assert hb.scalars["loss"] == 0.25 and hb.scalars["probe"] == 2.5
    assert math.isnan(hb.scalars["bad"])
    assert hb.nonfinite is not None and hb.nonfinite.counts["bad"] >= 1
    assert readers and threading.get_ident() not in readers


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS, errno.EACCES])
def test_full_or_read_only_disk_is_logged_once_and_never_raises(
    tmp_path: Path, monkeypatch: Any, caplog: pytest.LogCaptureFixture, code: int
) -> None:
    caplog.set_level(logging.WARNING, "trainguard")

    def failing(path: Any, data: Any) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(writer, "write_heartbeat", failing)
    run = Run("full", state_dir=tmp_path, interval=0.01)
    for i in range(20):
        run.step(i)
        time.sleep(0.005)
    run.close()
    logged = [r for r in caplog.records if "cannot write heartbeat" in r.getMessage()]
    assert len(logged) == 1, [r.getMessage() for r in caplog.records]
    assert os.strerror(code) in logged[0].getMessage()


def test_state_dir_that_cannot_be_created_never_raises(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "trainguard")
    blocker = tmp_path / "file"
    blocker.write_text("")
    with Run("nowhere", state_dir=blocker / "state", interval=0.01) as run:
        run.step(1)
    assert any("cannot" in r.getMessage() for r in caplog.records)


def test_close_waits_a_bounded_time_for_a_hung_disk(
    tmp_path: Path, monkeypatch: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "trainguard")
    release = threading.Event()
    stuck = threading.Event()
    returned = threading.Event()
    real_fsync = os.fsync

    def hung(fd: int) -> None:
        stuck.set()
        release.wait(120)
        returned.set()
        real_fsync(fd)

    run = Run("hung", state_dir=tmp_path, interval=0.01, close_timeout=0.3)
    wait_heartbeat(run.path, lambda hb: True)
    monkeypatch.setattr(os, "fsync", hung)
    try:
        run.step(1)
        assert stuck.wait(60)  # the writer is now stuck in fsync
        run.close()
        # close() came back while the disk still had not answered: it waited close_timeout,
        # not for the disk
        assert not returned.is_set()
        assert any("not written within 0.3s" in r.getMessage() for r in caplog.records)
    finally:
        release.set()


def test_step_never_waits_for_a_hung_disk(tmp_path: Path, monkeypatch: Any) -> None:
    release = threading.Event()
    real_fsync = os.fsync
    stuck = threading.Event()

    returned = threading.Event()

    def hung(fd: int) -> None:
        stuck.set()
        release.wait(120)
        returned.set()
        real_fsync(fd)

    run = Run("hung-steps", state_dir=tmp_path, interval=0.01, close_timeout=0.2)
    wait_heartbeat(run.path, lambda hb: True)
    monkeypatch.setattr(os, "fsync", hung)
    try:
        run.step(0)
        assert stuck.wait(60)
        for i in range(1, 20_000):
            run.step(i, loss=1.0)
        # every step came back while the disk still had not answered: none waited for it
        # (what a step costs while the disk hangs is measured by bench/bench_step.py)
        assert not returned.is_set()
        run.close()
    finally:
        release.set()


def test_stale_temp_files_of_dead_writers_are_removed(tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    name = heartbeat_filename("tmpclean", 0)
    stale = tmp_path / f".{name}.{dead.pid}.abcd1234.tmp"
    stale.write_text("{")
    live = tmp_path / f".{name}.{os.getpid()}.abcd1234.tmp"
    live.write_text("{")
    run = Run("tmpclean", state_dir=tmp_path, interval=0.01)
    wait_heartbeat(run.path, lambda hb: True)
    run.close()
    assert not stale.exists()
    assert live.exists()


# -- death detection at restart ------------------------------------------------------------


def dead_pid() -> tuple[int, float]:
    """The pid and create time of a process that has exited."""
    proc = subprocess.Popen(["sleep", "10"])
    create = create_time_of(proc.pid)
    proc.kill()
    proc.wait()
    return proc.pid, create


def create_time_of(pid: int) -> float:
    return float(psutil.Process(pid).create_time())


def previous(tmp_path: Path, *, extra: dict[str, Any] | None = None, **over: Any) -> Heartbeat:
    pid, create = dead_pid()
    now = time.time()
    fields: dict[str, Any] = dict(
        run="again",
        rank=0,
        pid=pid,
        create_time=create,
        host=os.uname().nodename,
        started=now - 100,
        time=now - 5,
        step=41,
        boot_id=procinfo.boot_id(),
        boot_time=procinfo.boot_time(),
        pid_ns=procinfo.pid_namespace(),
        deaths=0,
    )
    fields.update(over)
    hb = Heartbeat(**fields)
    write_heartbeat(tmp_path / hb.filename, {**hb.to_dict(), **(extra or {})})
    return hb


def kernel_says(monkeypatch: Any, *lines: tuple[float | None, str]) -> None:
    """What the death-cause reader finds in the kernel log: (time, message) lines, those
    logged since the time it asks for (a line without a time always)."""

    def read(since: float) -> list[kernlog.KernelLine]:
        return [kernlog.KernelLine(t, m) for t, m in lines if t is None or t >= since]

    monkeypatch.setattr(kernlog, "read_kernel_log", read)


def restart(tmp_path: Path) -> Heartbeat:
    with Run("again", state_dir=tmp_path, interval=0.01) as run:
        run.step(42)
    return read(run)


def test_restart_after_a_silent_death_records_it(tmp_path: Path, monkeypatch: Any) -> None:
    kernel_says(monkeypatch)
    old = previous(tmp_path)
    hb = restart(tmp_path)
    assert hb.deaths == 1
    assert hb.death_history == (
        Death(
            step=41, time=old.time, detected=hb.death_history[0].detected, cause="unknown", job=""
        ),
    )
    assert hb.started <= hb.death_history[0].detected <= hb.time
    # a clean finish is not a death, and the count is carried forward
    hb2 = restart(tmp_path)
    assert hb2.deaths == 1 and len(hb2.death_history) == 1


def test_death_causes(tmp_path: Path, monkeypatch: Any) -> None:
    pid, create = dead_pid()
    kernel_says(monkeypatch, (time.time(), f"Out of memory: Killed process {pid} (python)"))
    previous(tmp_path, pid=pid, create_time=create)
    assert restart(tmp_path).death_history[-1].cause == "oom_killer"
    previous(tmp_path, boot_id="another-boot", deaths=1)
    assert restart(tmp_path).death_history[-1].cause == "reboot"
    previous(tmp_path, state="failed", error="RuntimeError", deaths=5)
    hb = restart(tmp_path)
    assert hb.death_history[-1].cause == "exception"
    assert hb.deaths == 6


def test_history_is_bounded_and_a_live_predecessor_is_no_death(tmp_path: Path) -> None:
    history = tuple(
        Death(step=i, time=1e9 + i, detected=1e9 + i, cause="unknown") for i in range(20)
    )
    previous(tmp_path, deaths=20, death_history=history)
    hb = restart(tmp_path)
    assert hb.deaths == 21 and len(hb.death_history) == 20
    assert hb.death_history[0].step == 1 and hb.death_history[-1].step == 41
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        previous(
            tmp_path,
            pid=sleeper.pid,
            create_time=create_time_of(sleeper.pid),
            deaths=21,
            death_history=(),
        )
        assert restart(tmp_path).deaths == 21
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_the_heartbeat_records_the_exact_start_and_a_pid_reused_within_the_second_is_a_death(
    tmp_path: Path, monkeypatch: Any
) -> None:
    kernel_says(monkeypatch)
    with Run("ticks", state_dir=tmp_path, interval=0.01) as run:
        run.step(1)
    assert read(run).start_ticks == stat_start_ticks(os.getpid())
    # the predecessor's pid now belongs to a live process started within the same second
    # (same create time to the tolerance), but at another clock tick: that is a death
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        live = {"pid": sleeper.pid, "create_time": create_time_of(sleeper.pid)}
        previous(tmp_path, **live, extra={"start_ticks": stat_start_ticks(sleeper.pid) + 1})
        assert restart(tmp_path).deaths == 1
        previous(tmp_path, **live, deaths=1, extra={"start_ticks": stat_start_ticks(sleeper.pid)})
        assert restart(tmp_path).deaths == 1  # that one is alive: no death
    finally:
        sleeper.kill()
        sleeper.wait()


XID_79 = (
    "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
)


def test_a_gpu_error_in_the_kernel_log_is_the_cause(tmp_path: Path, monkeypatch: Any) -> None:
    """The dead predecessor (a real process, killed) last stepped 30 s and last wrote its
    heartbeat 5 s before the restart; the driver logged a fatal Xid in between."""
    now = time.time()
    pid, _ = dead_pid()
    life = {"pid": pid, "create_time": now - 200, "started": now - 190, "step_time": now - 30}

    def cause(*lines: tuple[float | None, str], **over: Any) -> tuple[str, int | None]:
        kernel_says(monkeypatch, *lines)
        previous(tmp_path, **{**life, **over})
        death = restart(tmp_path).death_history[-1]
        return death.cause, death.xid

    assert cause((now - 20, XID_79)) == ("gpu_xid", 79)
    # the earliest fatal Xid after the last sign of progress is the one that ended it
    assert cause((now - 20, XID_79), (now - 10, XID_79.replace(": 79,", ": 48,"))) == (
        "gpu_xid",
        79,
    )
    # Xid 45 is logged whenever a process on the GPU is killed: not a cause
    xid45 = f"NVRM: Xid (PCI:0000:3b:00): 45, pid={pid}, name=python, Ch 00000010"
    assert cause((now - 3, xid45)) == ("unknown", None)
    # well before its last step, or before the process started: not this death
    assert cause((now - 100, XID_79)) == ("unknown", None)
    assert cause((now - 3600, XID_79)) == ("unknown", None)
    # an error the driver pinned on another process is that process's
    other = f"NVRM: Xid (PCI:0000:86:00): 13, pid={pid + 1}, name=python, Graphics Exception"
    assert cause((now - 20, other)) == ("unknown", None)
    # one it pinned on this process counts at any time in its life
    own = f"NVRM: Xid (PCI:0000:86:00): 31, pid={pid}, name=python, Ch 00000010, MMU Fault"
    assert cause((now - 150, own)) == ("gpu_xid", 31)
    # more specific than a GPU error in the window: the OOM killer naming the pid, a reboot
    oom = f"Out of memory: Killed process {pid} (python) total-vm:1kB"
    assert cause((now - 20, XID_79), (now - 4, oom)) == ("oom_killer", None)
    assert cause((now - 20, XID_79), boot_id="another-boot") == ("reboot", None)
    # a process that recorded an exception says so; the GPU error is told beside it
    assert cause((now - 20, XID_79), state="failed", error="RuntimeError") == ("exception", 79)
    # a kernel log that cannot be read: unknown
    monkeypatch.setattr(kernlog, "read_kernel_log", lambda since: None)
    previous(tmp_path, **life)
    assert restart(tmp_path).death_history[-1].cause == "unknown"


# -- allocator stats and OOM snapshots ------------------------------------------------------


def test_allocator_key_names_are_torch_s() -> None:
    doc = torch.cuda.memory_stats.__doc__ or ""
    for key in (
        "allocated_bytes",
        "reserved_bytes",
        "inactive_split_bytes",
        "num_alloc_retries",
        "num_ooms",
    ):
        assert f'"{key}' in doc, key
    a = allocator_stats(1, REAL_STATS)
    assert (a.device, a.allocated_bytes, a.reserved_bytes, a.max_allocated_bytes) == (
        1,
        6 << 30,
        12 << 30,
        9 << 30,
    )
    assert (a.inactive_split_bytes, a.alloc_retries, a.ooms) == (3 << 30, 4, 1)


def test_allocator_stats_reach_the_heartbeat_when_cuda_is_in_use(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """CUDA is simulated: torch.cuda reports one initialised device with these stats."""
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(
        torch.cuda,
        "memory_stats",
        lambda d: REAL_STATS if d == 0 else {"reserved_bytes.all.current": 0},
    )
    with Run("alloc", state_dir=tmp_path, interval=0.01) as run:
        run.step(1)
    (a,) = read(run).allocator
    assert (a.device, a.reserved_bytes, a.ooms) == (0, 12 << 30, 1)


class FakeProps:
    """What torch.cuda.get_device_properties(i) returns, as far as the reporter looks."""

    def __init__(self, uuid: object, total_memory: object = None) -> None:
        self.uuid = uuid
        self.total_memory = total_memory


class CudaUuid:
    """Like torch's ``_CUuuid``: str() gives the bare hex with dashes."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __str__(self) -> str:
        return self.text


def test_allocator_devices_carry_their_gpu_uuid(tmp_path: Path, monkeypatch: Any) -> None:
    """Each allocator device records its GPU's UUID (what survives CUDA_VISIBLE_DEVICES
    renumbering), in NVML's spelling, read once per device and process. CUDA is simulated."""
    asked: list[int] = []

    def props(device: int) -> FakeProps:
        asked.append(device)
        return FakeProps(CudaUuid(f"{device:08X}-4b3c-fa1e-8f07-2a9b3c4d5e6f"), (device + 1) << 30)

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda d: REAL_STATS)
    monkeypatch.setattr(torch.cuda, "get_device_properties", props)
    run = Run("uuids", state_dir=tmp_path, interval=0.01, keepalive=0.02)
    first = wait_heartbeat(run.path, lambda hb: len(hb.allocator) == 2)
    wait_heartbeat(run.path, lambda hb: hb.time > first.time)
    run.close()
    assert [(a.device, a.uuid, a.total_bytes) for a in read(run).allocator] == [
        (0, "GPU-00000000-4b3c-fa1e-8f07-2a9b3c4d5e6f", 1 << 30),
        (1, "GPU-00000001-4b3c-fa1e-8f07-2a9b3c4d5e6f", 2 << 30),
    ]
    assert sorted(asked) == [0, 1]  # once per device, not at every heartbeat


def test_allocator_stats_without_a_uuid_are_still_reported(
    tmp_path: Path, monkeypatch: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A torch too old for .uuid, a ROCm build's other spelling, or a failing call: the
    allocator stats stay, the uuid is left out (logged once)."""
    caplog.set_level(logging.WARNING, "trainguard")

    def broken(device: int) -> FakeProps:
        if device == 0:
            raise RuntimeError("no properties")
        return FakeProps("not-a-uuid")

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda d: REAL_STATS)
    monkeypatch.setattr(torch.cuda, "get_device_properties", broken)
    with Run("no-uuid", state_dir=tmp_path, interval=0.01) as run:
        run.step(1)
    assert [(a.device, a.reserved_bytes, a.uuid, a.total_bytes) for a in read(run).allocator] == [
        (0, 12 << 30, None, None),
        (1, 12 << 30, None, None),
    ]
    warned = [r for r in caplog.records if "GPU UUID" in r.getMessage()]
    assert len(warned) == 1, warned
    unsized = [r for r in caplog.records if "size of a CUDA device" in r.getMessage()]
    assert len(unsized) == 1, unsized


def test_the_uuid_is_never_read_before_cuda_is_initialised(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """get_device_properties would initialise CUDA: the reporter asks only once the script
    has (the real CPU build of torch: never)."""
    asked: list[int] = []
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: asked.append(d))
    with Run("no-cuda", state_dir=tmp_path, interval=0.01) as run:
        run.step(1)
    assert read(run).allocator == () and asked == []


def test_without_cuda_there_are_no_allocator_stats_and_oom_capture_is_a_no_op(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The real no-CUDA path: this torch is a CPU build."""
    assert not torch.cuda.is_available()
    caplog.set_level(logging.WARNING, "trainguard")
    run = Run("cpu", state_dir=tmp_path, interval=0.01, oom_snapshots=True)
    for exc in (RuntimeError("not an oom"), torch.cuda.OutOfMemoryError("CUDA out of memory")):
        with pytest.raises(type(exc)), run.capture_oom():
            raise exc
    with run.capture_oom():
        run.step(3)
    run.close()
    hb = read(run)
    assert hb.allocator == () and hb.memory_snapshots == 0
    unavailable = [r for r in caplog.records if "OOM capture unavailable" in r.getMessage()]
    assert len(unavailable) == 1 and "CUDA is not available" in unavailable[0].getMessage()
    assert sorted(p.name for p in tmp_path.iterdir()) == [run.path.name]


def test_oom_snapshot_is_dumped_counted_and_reraised(tmp_path: Path, monkeypatch: Any) -> None:
    """CUDA's snapshot entry points are provided to this CPU build of torch
    (helpers/cuda_snapshot.py); the exception is torch's real OutOfMemoryError."""
    calls = cuda_snapshot.install(monkeypatch, torch)
    run = Run("oomy", state_dir=tmp_path, interval=0.01, oom_snapshots=True)
    assert calls == ["record"]
    for _ in range(2):
        with pytest.raises(torch.cuda.OutOfMemoryError), run.capture_oom():
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    with pytest.raises(ValueError), run.capture_oom():
        raise ValueError("not an oom: no snapshot")
    run.close()
    stem = run.path.name.removesuffix(".heartbeat.json")
    assert sorted(p.name for p in tmp_path.glob("*.pickle")) == [
        f"{stem}.oom-1.pickle",
        f"{stem}.oom-2.pickle",
    ]
    assert run.last_oom_snapshot == tmp_path / f"{stem}.oom-2.pickle"
    with open(tmp_path / f"{stem}.oom-2.pickle", "rb") as f:
        assert pickle.load(f) == cuda_snapshot.SNAPSHOT
    assert read(run).memory_snapshots == 2
    # a restart carries the count on, so new snapshots never overwrite old ones
    run2 = Run("oomy", state_dir=tmp_path, interval=0.01, oom_snapshots=True)
    with pytest.raises(torch.cuda.OutOfMemoryError), run2.capture_oom():
        raise torch.cuda.OutOfMemoryError("again")
    run2.close()
    assert read(run2).memory_snapshots == 3
    assert (tmp_path / f"{stem}.oom-3.pickle").exists()


def test_the_reporter_never_imports_torch(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, "plain", str(tmp_path), "3", "no-torch"],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert read_heartbeat(tmp_path / heartbeat_filename("plain", 0)).state == "finished"


def test_run_is_exported_lazily() -> None:
    assert trainguard.Run is Run
