"""Faults with real processes and the real exporter: the state dir removed and recreated under
a running job, a checkpoint volume unmounted and mounted again, a state dir on a full
filesystem, and an exporter restarted while runs continue. (NVML lost mid-scrape is in
test_gpu.py; an exporter restart not paging is a promtool case in alerts/tests/runs_test.yml.)

Mounts are real tmpfs mounts; they need root with CAP_SYS_ADMIN and are skipped, saying so,
where ``mount`` is refused."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from helpers.exporter_proc import Exporter, Samples, poll, select, value
from helpers.run_child import heartbeat_path, own_heartbeat, put, start_child, wait_heartbeat
from helpers.tmpfs import tmpfs, unmount
from helpers.wait import wait_for
from trainguard import Run
from trainguard.checkpoint import save
from trainguard.shared.heartbeat.read import read_heartbeat


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


# ---------------------------------------------------------------- the state dir


def test_state_dir_removed_and_recreated_under_a_running_job(tmp_path: Path) -> None:
    """The runs disappear with the directory (an error, not a silent empty table) and come
    back when it is back: the reporter of a live run makes it again at its next write."""
    state = tmp_path / "state"
    child = start_child("survivor", state, 0, "steady")
    try:
        before = wait_heartbeat(heartbeat_path(state, "survivor"), lambda hb: (hb.step or 0) >= 3)
        put(state, own_heartbeat("static"))
        run = {"run": "survivor", "rank": "0"}
        with Exporter(state_dir=state, log_path=tmp_path / "exporter.log") as exp:
            s = exp.scrape()
            assert value(s, "trainguard_run_process_up", **run) == 1
            assert value(s, "trainguard_heartbeat_files") == 2
            child.send_signal(signal.SIGSTOP)  # hold its writer while the directory is gone
            try:
                shutil.rmtree(state)
                gone = exp.scrape()
                gone2 = exp.scrape()
            finally:
                child.send_signal(signal.SIGCONT)
            assert select(gone, "trainguard_run_info") == {}
            assert value(gone, "trainguard_heartbeat_files") == 0
            assert value(gone, "trainguard_collector_success", collector="runs") == 0
            assert value(gone2, "trainguard_collector_success", collector="runs") == 0
            assert value(gone, "trainguard_collector_success", collector="gpu") is not None
            back = poll(exp, lambda s: value(s, "trainguard_run_process_up", **run) == 1)
            assert value(back, "trainguard_run_process_up", **run) == 1
            assert value(back, "trainguard_run_step", **run) >= before.step  # type: ignore[operator]
            info = select(back, "trainguard_run_info", run="survivor")
            assert [dict(lbl)["pid"] for lbl in info] == [str(child.pid)]
            assert value(back, "trainguard_run_deaths_total", run="survivor") == 0
            # the static heartbeat had no writer: it is gone until someone writes it again
            assert select(back, "trainguard_run_info", run="static") == {}
            put(state, own_heartbeat("static"))
            back = exp.scrape()
            assert value(back, "trainguard_run_process_up", run="static", rank="0") == 1
            assert value(back, "trainguard_collector_success", collector="runs") == 1
            log = exp.stop()
    finally:
        stop(child)
    lines = [ln for ln in log.splitlines() if "no longer exists" in ln]
    assert len(lines) == 1, log  # logged once, not at every scrape
    assert str(state) in lines[0]
    assert "collector runs recovered" in log
    assert "Traceback" not in log


def test_exporter_restart_while_runs_continue(tmp_path: Path) -> None:
    """The first scrape after a restart has every run back with the same values: alive, the
    same pid and start, the held step unchanged and the moving one not behind."""
    state = tmp_path / "state"
    held = start_child("held", state, 7, "hang")
    moving = start_child("moving", state, 0, "steady")
    try:
        wait_heartbeat(heartbeat_path(state, "held"), lambda hb: hb.step == 7)
        wait_heartbeat(heartbeat_path(state, "moving"), lambda hb: (hb.step or 0) >= 3)
        with Exporter(state_dir=state) as exp:
            s1 = exp.scrape()
        with Exporter(state_dir=state) as exp:
            s2 = exp.scrape()  # the first scrape of the new process
    finally:
        stop(held)
        stop(moving)
    for run in ("held", "moving"):
        r = {"run": run, "rank": "0"}
        assert value(s2, "trainguard_run_process_up", **r) == 1
        assert value(s2, "trainguard_run_finished", **r) == 0
        assert select(s2, "trainguard_run_info", run=run) == select(
            s1, "trainguard_run_info", run=run
        )
        assert value(s2, "trainguard_run_start_timestamp_seconds", **r) == value(
            s1, "trainguard_run_start_timestamp_seconds", **r
        )
        assert value(s2, "trainguard_run_deaths_total", run=run) == 0
    held_step = value(s2, "trainguard_run_step", run="held", rank="0")
    assert held_step == value(s1, "trainguard_run_step", run="held", rank="0") == 7
    moved = value(s2, "trainguard_run_step", run="moving", rank="0")
    assert moved >= value(s1, "trainguard_run_step", run="moving", rank="0")  # type: ignore[operator]
    assert value(s2, "trainguard_collector_success", collector="runs") == 1


# ---------------------------------------------------------------- a full disk


def _fill(directory: Path) -> Path:
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


def test_heartbeats_on_a_really_full_filesystem(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A 64 KiB tmpfs as the state dir, filled up while the run steps: step() never raises,
    the failure is logged once, the file on disk stays the last complete heartbeat (never half
    of one, no temp files left), the exporter still reads it, and heartbeats resume once
    space is freed."""
    caplog.set_level(logging.WARNING, "trainguard")
    with tmpfs(tmp_path / "state", "64k") as state:
        run = Run("full-disk", state_dir=state, interval=0.01)
        try:
            run.step(1, loss=0.5)
            wait_heartbeat(run.path, lambda hb: hb.step == 1)
            filler = _fill(state)
            for i in range(2, 60):
                run.step(i, loss=0.5)  # must never raise
                time.sleep(0.005)
            # until the writer has tried (and failed) to write on the full disk
            wait_for(
                lambda: any("cannot write heartbeat" in r.getMessage() for r in caplog.records),
                60,
                0.01,
                "the writer to try the full disk",
            )
            on_disk = read_heartbeat(run.path)  # still whole, still valid
            assert on_disk.step is not None and on_disk.step < 59
            assert [p.name for p in state.iterdir() if p.name.endswith(".tmp")] == []
            with Exporter(state_dir=state) as exp:
                s = exp.scrape()
            assert value(s, "trainguard_run_step", run="full-disk", rank="0") == on_disk.step
            assert value(s, "trainguard_run_process_up", run="full-disk", rank="0") == 1
            filler.unlink()
            run.step(60, loss=0.25)
            wait_heartbeat(run.path, lambda hb: hb.step == 60)
        finally:
            run.close()
        assert read_heartbeat(run.path).state == "finished"
    logged = [r.getMessage() for r in caplog.records if "cannot write heartbeat" in r.getMessage()]
    assert len(logged) == 1, logged
    assert os.strerror(errno.ENOSPC) in logged[0]


# ---------------------------------------------------------------- a checkpoint volume


def test_checkpoint_volume_unmounted_and_mounted_again(tmp_path: Path) -> None:
    """The checkpoint directory lives on a volume (a real tmpfs) that goes away: the location
    reports location_up 0 with the reason, once in the log, while another location still
    answers; mounted again, it is read again at the next scrape. A location that is the mount
    point itself is "not mounted" (location_up 0), not the empty directory left underneath."""
    vol = tmp_path / "vol"
    other = tmp_path / "other"
    other.mkdir()
    save(b"o" * 10, other / "step_4.pt")
    ckpt = vol / "ckpt"
    cfg = tmp_path / "tg.yml"
    cfg.write_text(
        "runs:\n"
        f"  - name: r\n    checkpoints: {{primary: {ckpt}, mirrors: {{mountpoint: {vol}}}}}\n"
        f"  - name: other\n    checkpoints: {{primary: {other}}}\n"
    )

    def ck(s: Samples, name: str, run: str = "r", location: str = "primary") -> float | None:
        return value(s, f"trainguard_checkpoint_{name}", run=run, location=location)

    with tmpfs(vol, "1m"):
        ckpt.mkdir()
        save(b"x" * 10, ckpt / "step_1.pt")
        save(b"x" * 10, ckpt / "step_2.pt")
        save(b"y" * 10, vol / "step_2.pt")
        with Exporter(
            args=[f"--config.file={cfg}"],
            state_dir=tmp_path / "state",
            log_path=tmp_path / "exporter.log",
        ) as exp:
            s = exp.scrape()
            assert ck(s, "location_up") == 1 and ck(s, "last_step") == 2
            assert ck(s, "last_step", location="mountpoint") == 2
            unmount(vol)
            gone = exp.scrape()
            gone2 = exp.scrape()
            assert ck(gone, "location_up") == 0 and ck(gone2, "location_up") == 0
            assert ck(gone, "last_step") is None and ck(gone, "files") is None
            assert ck(gone, "location_up", run="other") == 1
            assert ck(gone, "last_step", run="other") == 4
            assert value(gone, "trainguard_collector_success", collector="checkpoints") == 0
            # the bare mount point is an empty directory: "cannot see", not "nothing there"
            assert ck(gone, "location_up", location="mountpoint") == 0
            assert ck(gone, "files", location="mountpoint") is None
            assert ck(gone, "last_step", location="mountpoint") is None
            with tmpfs(vol, "1m"):
                ckpt.mkdir()
                save(b"x" * 10, ckpt / "step_3.pt")
                back = exp.scrape()
                assert ck(back, "location_up") == 1 and ck(back, "last_step") == 3
                assert ck(back, "location_up", location="mountpoint") == 1
                assert ck(back, "files", location="mountpoint") == 0
                assert value(back, "trainguard_collector_success", collector="checkpoints") == 1
                log = exp.stop()
    lines = [ln for ln in log.splitlines() if f"location 'primary' at {ckpt}" in ln]
    assert len(lines) == 1, log
    assert "No such file or directory" in lines[0]
    (line,) = [ln for ln in log.splitlines() if f"location 'mountpoint' at {vol}" in ln]
    assert "not mounted" in line
    assert "collector checkpoints recovered" in log
    assert "Traceback" not in log
