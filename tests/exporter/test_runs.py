"""Runs through the real exporter over HTTP, with real training processes: death within one
scrape, clean exit, pid reuse, death history across restarts, bad heartbeat files, configured
runs, retention."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from helpers.exporter_proc import Exporter, Samples, select
from helpers.nvml_fake import FakeNvmlState
from helpers.run_child import (
    heartbeat_path,
    own_heartbeat,
    put,
    sigkill,
    start_child,
    stat_start_ticks,
    wait_heartbeat,
)
from trainguard.run.allocator import allocator_stats
from trainguard.shared import procinfo
from trainguard.shared.heartbeat.record import Death


def sample(samples: Samples, metric: str, **labels: str) -> float | None:
    return samples.get((metric, frozenset(labels.items())))


def test_sigkill_is_seen_at_the_next_scrape_and_clean_exit_is_not_a_death(tmp_path: Path) -> None:
    state = tmp_path / "state"
    killed = start_child("killed run", state, 7, "hang")
    clean = start_child("clean run", state, 3, "with")
    try:
        wait_heartbeat(heartbeat_path(state, "killed run"), lambda hb: hb.step == 7)
        assert clean.wait(60) == 0, clean.stdout.read() if clean.stdout else ""
        with Exporter(state_dir=state) as exp:
            before = exp.scrape()
            k = {"run": "killed run", "rank": "0"}
            assert sample(before, "trainguard_run_process_up", **k) == 1
            assert sample(before, "trainguard_run_finished", **k) == 0
            assert sample(before, "trainguard_run_step", **k) == 7
            sigkill(killed.pid)  # not reaped yet: a zombie is dead too
            after = exp.scrape()
            assert sample(after, "trainguard_run_process_up", **k) == 0
            assert sample(after, "trainguard_run_finished", **k) == 0
            assert sample(after, "trainguard_run_step", **k) == 7
            killed.wait(60)
            reaped = exp.scrape()
            assert sample(reaped, "trainguard_run_process_up", **k) == 0
            c = {"run": "clean run", "rank": "0"}
            assert sample(after, "trainguard_run_process_up", **c) == 0
            assert sample(after, "trainguard_run_finished", **c) == 1
            assert sample(after, "trainguard_run_step", **c) == 3
            assert sample(after, "trainguard_collector_success", collector="runs") == 1
            info = select(after, "trainguard_run_info", run="killed run")
            assert [dict(lbl)["pid"] for lbl in info] == [str(killed.pid)]
    finally:
        for p in (killed, clean):
            if p.poll() is None:
                p.kill()
            p.wait()


def test_pid_alive_with_another_create_time_is_not_the_run(tmp_path: Path) -> None:
    """A reused pid: this test's own (live) pid with a create time that is not its own."""
    state = tmp_path / "state"
    state.mkdir()
    put(state, own_heartbeat("reused", create_time=procinfo.own_create_time() - 3600))
    put(state, own_heartbeat("mine"))
    with Exporter(state_dir=state) as exp:
        s = exp.scrape()
    assert sample(s, "trainguard_run_process_up", run="reused", rank="0") == 0
    assert sample(s, "trainguard_run_process_up", run="mine", rank="0") == 1


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_pid_reused_within_the_same_second_is_not_the_run(tmp_path: Path) -> None:
    """A crash-restart loop (or a small pid_max) can hand the dead run's pid to a process
    started within the same second: its create time matches within the tolerance, its start
    in clock ticks does not. The process's command name holds spaces and parentheses, as a
    hostile or odd one may (/proc/PID/stat must be split after the last ')')."""
    odd = tmp_path / "tg) (x y) 1 2"
    shutil.copy("/bin/sleep", odd)
    trainer = subprocess.Popen([str(odd), "60"])
    try:
        ticks = stat_start_ticks(trainer.pid)
        state = tmp_path / "state"
        state.mkdir()
        create = psutil.Process(trainer.pid).create_time()
        pid = trainer.pid
        put(state, own_heartbeat("reused", pid=pid, create_time=create), start_ticks=ticks - 3)
        put(state, own_heartbeat("itself", pid=pid, create_time=create), start_ticks=ticks)
        put(state, own_heartbeat("old-writer", pid=pid, create_time=create))  # no start_ticks
        with Exporter(state_dir=state) as exp:
            s = exp.scrape()
            trainer.kill()
            trainer.wait()
            after = exp.scrape()
    finally:
        trainer.kill()
        trainer.wait()
    assert sample(s, "trainguard_run_process_up", run="reused", rank="0") == 0
    assert sample(s, "trainguard_run_process_up", run="itself", rank="0") == 1
    # a heartbeat of an older reporter, without start ticks: the create time tolerance
    assert sample(s, "trainguard_run_process_up", run="old-writer", rank="0") == 1
    assert sample(s, "trainguard_collector_success", collector="runs") == 1
    for run in ("reused", "itself", "old-writer"):
        assert sample(after, "trainguard_run_process_up", run=run, rank="0") == 0


@pytest.mark.parametrize(
    ("mode", "finished", "error"),
    [("exit", 1, None), ("with-raise", 0, "ValueError"), ("uncaught", 0, "ZeroDivisionError")],
)
def test_how_a_process_ends_is_recorded(
    tmp_path: Path, mode: str, finished: int, error: str | None
) -> None:
    state = tmp_path / "state"
    proc = start_child(f"run-{mode}", state, 2, mode)
    out = proc.communicate(timeout=60)[0]
    hb = wait_heartbeat(heartbeat_path(state, f"run-{mode}"), lambda hb: hb.state != "running")
    assert (hb.state == "finished") == bool(finished), out
    assert hb.error == error
    assert hb.step == 2


def test_forked_child_exiting_does_not_finish_the_run(tmp_path: Path) -> None:
    state = tmp_path / "state"
    proc = start_child("forking", state, 2, "fork")
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "forked child done"
        time.sleep(0.1)
        hb = wait_heartbeat(heartbeat_path(state, "forking"), lambda hb: hb.step == 2)
        assert hb.state == "running"
        assert hb.pid == proc.pid
    finally:
        proc.kill()
        proc.wait()


def test_death_history_across_restarts(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = start_child("resumed", state, 41, "hang")
    second = None
    try:
        path = heartbeat_path(state, "resumed")
        old = wait_heartbeat(path, lambda hb: hb.step == 41)
        sigkill(first.pid)
        first.wait(60)
        dead = wait_heartbeat(path, lambda hb: True)  # the last heartbeat it wrote
        second = start_child("resumed", state, 3, "hang")
        hb = wait_heartbeat(path, lambda hb: hb.pid == second.pid and hb.step == 3)
        assert hb.deaths == 1
        assert hb.death_history[-1].step == 41
        assert hb.death_history[-1].cause == "unknown"
        assert hb.death_history[-1].time == dead.time
        assert hb.started >= old.started
        with Exporter(state_dir=state) as exp:
            s = exp.scrape()
        scraped = time.time()
        assert sample(s, "trainguard_run_deaths_total", run="resumed") == 1
        death_age = sample(s, "trainguard_run_last_death_age_seconds", run="resumed")
        assert death_age is not None and 0 <= death_age <= scraped - dead.time
        assert sample(s, "trainguard_run_last_death_step", run="resumed") == 41
        assert sample(s, "trainguard_run_last_death_timestamp_seconds", run="resumed") == dead.time
        assert sample(s, "trainguard_run_last_death_info", run="resumed", cause="unknown") == 1
        assert sample(s, "trainguard_run_process_up", run="resumed", rank="0") == 1
    finally:
        for p in (first, second):
            if p is not None:
                p.kill()
                p.wait()


def test_a_death_names_its_job_so_a_new_job_of_the_run_is_not_a_restart(tmp_path: Path) -> None:
    # job nc4-a dies; the run relaunched as job nc4-b records nc4-a's death (not its own);
    # nc4-b dying and restarting in place (same job id) then records a death of nc4-b
    state = tmp_path / "state"
    path = heartbeat_path(state, "ddp")
    procs: list[subprocess.Popen[str]] = []
    try:
        for job in ("nc4-a", "nc4-b", "nc4-b"):
            if procs:
                sigkill(procs[-1].pid)
                procs[-1].wait(60)
            procs.append(start_child("ddp", state, 3, "hang", {"TRAINGUARD_JOB": job}))
            pid = procs[-1].pid
            hb = wait_heartbeat(path, lambda hb, pid=pid: hb.pid == pid and hb.step == 3)
            assert hb.job is not None and hb.job.id == job
        assert [d.job for d in hb.death_history] == ["nc4-a", "nc4-b"]
        with Exporter(state_dir=state) as exp:
            s = exp.scrape()
        assert sample(s, "trainguard_run_deaths_total", run="ddp") == 2
        deaths = select(s, "trainguard_run_last_death_job_info", run="ddp")
        assert deaths == {frozenset({"run": "ddp", "job_id": "nc4-b"}.items()): 1.0}, deaths
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_death_of_no_job_and_one_an_older_reporter_recorded(tmp_path: Path) -> None:
    # a lone process (no job) died: job "" ; a death from an older reporter: no job known
    state = tmp_path / "state"
    state.mkdir()
    old = Death(step=3, time=time.time() - 60, detected=time.time() - 50, cause="unknown")
    put(state, own_heartbeat("older", deaths=1, death_history=(old,)))
    first = start_child("lone", state, 3, "hang")
    second = None
    try:
        path = heartbeat_path(state, "lone")
        wait_heartbeat(path, lambda hb: hb.step == 3)
        sigkill(first.pid)
        first.wait(60)
        second = start_child("lone", state, 3, "hang")
        hb = wait_heartbeat(path, lambda hb: hb.pid == second.pid and hb.step == 3)
        assert hb.job is None and hb.death_history[-1].job == ""
        with Exporter(state_dir=state) as exp:
            s = exp.scrape()
        assert select(s, "trainguard_run_last_death_job_info", run="lone") == {
            frozenset({"run": "lone", "job_id": ""}.items()): 1.0
        }
        assert select(s, "trainguard_run_last_death_job_info", run="older") == {}
        assert sample(s, "trainguard_run_deaths_total", run="older") == 1
    finally:
        for p in (first, second):
            if p is not None:
                p.kill()
                p.wait()


def test_death_before_a_reboot_is_told_by_the_boot_id(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    before = time.time() - 600
    put(
        state,
        own_heartbeat(
            "rebooted",
            pid=1,
            create_time=before - 100,
            boot_id="00000000-0000-0000-0000-000000000000",
            boot_time=before - 1000,
            time=before,
            step=322,
            deaths=2,
            death_history=(
                Death(step=100, time=before - 500, detected=before - 400, cause="unknown"),
            ),
        ),
    )
    with Exporter(state_dir=state) as exp:
        # the old heartbeat alone: its boot is over, so its process is gone (pid 1 is alive)
        s = exp.scrape()
        assert sample(s, "trainguard_run_process_up", run="rebooted", rank="0") == 0
        assert sample(s, "trainguard_run_deaths_total", run="rebooted") == 2
        proc = start_child("rebooted", state, 1, "hang")
        try:
            wait_heartbeat(heartbeat_path(state, "rebooted"), lambda hb: hb.pid == proc.pid)
            s = exp.scrape()
        finally:
            proc.kill()
            proc.wait()
    assert sample(s, "trainguard_run_deaths_total", run="rebooted") == 3
    assert sample(s, "trainguard_run_last_death_step", run="rebooted") == 322
    assert sample(s, "trainguard_run_last_death_timestamp_seconds", run="rebooted") == before
    assert sample(s, "trainguard_run_last_death_info", run="rebooted", cause="reboot") == 1
    assert select(s, "trainguard_run_last_death_info", run="rebooted").keys() == {
        frozenset({("run", "rebooted"), ("cause", "reboot")})
    }


def test_a_death_by_gpu_error_is_published_with_its_xid(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    now = time.time()
    history = (
        Death(step=100, time=now - 900, detected=now - 800, cause="oom_killer"),
        Death(step=200, time=now - 90, detected=now - 60, cause="gpu_xid", xid=79),
    )
    put(state, own_heartbeat("xid", deaths=2, death_history=history))
    put(state, own_heartbeat("plain", deaths=1, death_history=history[:1]))
    with Exporter(state_dir=state) as exp:
        s = exp.scrape()
    assert select(s, "trainguard_run_last_death_info", run="xid").keys() == {
        frozenset({("run", "xid"), ("cause", "gpu_xid")})
    }
    assert sample(s, "trainguard_run_last_death_xid", run="xid") == 79
    assert sample(s, "trainguard_run_last_death_step", run="xid") == 200
    assert sample(s, "trainguard_run_last_death_info", run="plain", cause="oom_killer") == 1
    assert sample(s, "trainguard_run_last_death_xid", run="plain") is None


def test_bad_heartbeat_files_fail_only_themselves(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    good = put(state, own_heartbeat("good"))
    text = good.read_text()
    bad = {
        "malformed": "{not json",
        "truncated": text[: len(text) // 2],
        "binary": b"\x00\xff\xfe garbage \x89PNG",
        "empty": "",
        "foreign": json.dumps({"format": 2, "run": "x"}),
        "no-format": json.dumps({"run": "x", "rank": 0}),
        "bad-field": text.replace('"rank":0', '"rank":-1'),
    }
    for name, content in bad.items():
        p = state / f"{name}-00000000.rank0.heartbeat.json"
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content)
    with open(state / "huge-00000000.rank0.heartbeat.json", "wb") as fh:
        fh.truncate(2 << 20)
    (state / "link-00000000.rank0.heartbeat.json").symlink_to(good)
    shutil.copy(good, state / "copy-00000000.rank0.heartbeat.json")  # poses as another file
    os.mkfifo(state / "fifo-00000000.rank0.heartbeat.json")
    (state / "dir-00000000.rank0.heartbeat.json").mkdir()
    (state / "unrelated.txt").write_text("not a heartbeat: ignored")
    n_bad = len(bad) + 5
    with Exporter(state_dir=state) as exp:
        # a fifo that hung the runs collector would leave it out of both scrapes (after
        # --collector.timeout): the samples asserted below would be missing
        s = exp.scrape()
        s2 = exp.scrape()
        log = exp.stop()
    assert sample(s, "trainguard_run_process_up", run="good", rank="0") == 1
    assert sample(s, "trainguard_heartbeat_files") == 1
    assert sample(s, "trainguard_heartbeat_file_errors") == n_bad
    assert sample(s2, "trainguard_heartbeat_file_errors") == n_bad
    # bad files cost themselves (their own series), not the collector's success
    assert sample(s, "trainguard_collector_success", collector="runs") == 1
    assert len(select(s, "trainguard_heartbeat_file_invalid")) == n_bad
    for name, reason in [
        ("malformed", "not valid JSON"),
        ("truncated", "not valid JSON"),
        ("binary", "not UTF-8"),
        ("empty", "empty file"),
        ("foreign", "unsupported heartbeat format 2"),
        ("no-format", "not a trainguard heartbeat"),
        ("bad-field", "field 'rank'"),
        ("huge", "larger than the 1 MiB limit"),
        ("link", "symbolic link"),
        ("copy", "file name does not match"),
        ("fifo", "not a regular file"),
        ("dir", "not a regular file"),
    ]:
        lines = [ln for ln in log.splitlines() if f"{name}-00000000.rank0" in ln]
        assert len(lines) == 1, (name, log)  # logged once, not at every scrape
        assert reason in lines[0], (name, lines[0])
    assert "Traceback" not in log


def test_state_dir_missing_is_no_collector_error_and_not_a_directory_is(tmp_path: Path) -> None:
    # missing: trainguard_state_dir_present 0 (test_state_dir_loud.py), the collector works
    with Exporter(state_dir=tmp_path / "nothing-yet") as exp:
        s = exp.scrape()
    assert sample(s, "trainguard_collector_success", collector="runs") == 1
    assert sample(s, "trainguard_state_dir_present", path=str(tmp_path / "nothing-yet")) == 0
    assert sample(s, "trainguard_heartbeat_files") == 0
    afile = tmp_path / "file"
    afile.write_text("")
    with Exporter(state_dir=afile) as exp:
        s = exp.scrape()
        log = exp.stop()
    assert sample(s, "trainguard_collector_success", collector="runs") == 0
    assert "cannot list" in log


def test_configured_runs_pid_file_process_match_and_log_file(tmp_path: Path) -> None:
    state = tmp_path / "state"
    name = f"tgmatch{secrets.token_hex(3)}"  # no other process's, whatever runs meanwhile
    sleeper_exe = tmp_path / name
    shutil.copy("/bin/sleep", sleeper_exe)
    by_file = subprocess.Popen(["sleep", "60"])
    by_name = subprocess.Popen([str(sleeper_exe), "60"])
    try:
        live_pid = tmp_path / "live.pid"
        live_pid.write_text(f"{by_file.pid}\n")
        stale_pid = tmp_path / "stale.pid"  # written before the process with that pid started
        stale_pid.write_text(f"{by_name.pid}\n")
        os.utime(stale_pid, (time.time() - 3600, time.time() - 3600))
        garbage_pid = tmp_path / "garbage.pid"
        garbage_pid.write_text("not a pid")
        log_ok = tmp_path / "ok.log"
        log_ok.write_text("step 1\n")
        log_zero = tmp_path / "zero.log"
        log_zero.write_text("step 1\n")
        os.utime(log_zero, (0, 0))  # what an NFS server once answered
        config = tmp_path / "tg.yml"
        config.write_text(
            f"""
runs:
  - name: by-file
    pid_file: {live_pid}
    log_file: {log_ok}
  - name: stale-file
    pid_file: {stale_pid}
  - name: no-file
    pid_file: {tmp_path / "missing.pid"}
  - name: garbage-file
    pid_file: {garbage_pid}
  - name: by-name
    process_match: "^{name}$"
    log_file: {log_zero}
  - name: nothing-runs
    process_match: "^no-such-process-here$"
    log_file: {tmp_path / "missing.log"}
  - name: reporting
    log_file: {log_ok}
"""
        )
        state.mkdir()
        put(state, own_heartbeat("reporting", log_file=str(tmp_path / "other.log")))
        with Exporter(args=[f"--config.file={config}"], state_dir=state) as exp:
            s = exp.scrape()
            by_name.kill()
            by_name.wait()
            s2 = exp.scrape()
            log = exp.stop()
    finally:
        for p in (by_file, by_name):
            p.kill()
            p.wait()

    def up(run: str, samples: Samples = s) -> float | None:
        return sample(samples, "trainguard_run_process_up", run=run, rank="0")

    assert up("by-file") == 1
    assert up("stale-file") == 0  # pid reused after the pid file was written
    assert up("no-file") is None  # never started: not a death
    assert up("garbage-file") is None
    assert up("by-name") == 1
    assert up("by-name", s2) == 0  # seen alive, then gone
    assert up("nothing-runs") is None
    assert up("reporting") == 1
    assert (
        sample(
            s,
            "trainguard_run_info",
            run="by-name",
            rank="0",
            host=os.uname().nodename,
            pid=str(by_name.pid),
        )
        == 1
    )
    # a run with a pid file tells a clean exit by the file's removal; a match cannot
    assert sample(s, "trainguard_run_finished", run="by-file", rank="0") == 0
    assert sample(s, "trainguard_run_finished", run="by-name", rank="0") is None
    assert sample(s, "trainguard_run_finished", run="reporting", rank="0") == 0
    # one row per run: the heartbeat's, not a second one from the config
    assert len(select(s, "trainguard_run_info", run="reporting")) == 1
    mtime = sample(s, "trainguard_run_log_modified_timestamp_seconds", run="by-file")
    assert mtime == pytest.approx(log_ok.stat().st_mtime)
    # the config's log file wins over the heartbeat's
    assert sample(s, "trainguard_run_log_modified_timestamp_seconds", run="reporting") == mtime
    assert sample(s, "trainguard_run_log_modified_timestamp_seconds", run="by-name") is None
    assert sample(s, "trainguard_collector_success", collector="runs") == 0
    assert "modification time is 0" in log
    assert "missing.log: cannot stat" in log
    assert "garbage.pid: expected a process id" in log


def test_configured_runs_page_only_for_a_process_seen_alive_that_vanished(tmp_path: Path) -> None:
    """Runs declared in the config file without a heartbeat: not running yet is not a death
    (no process_up at all), a pid file removed at exit is a clean finish, and only a process
    seen alive that is gone while its pid file stays (or that no longer matches) pages."""
    name_exe = tmp_path / "tgnamesleep"
    shutil.copy("/bin/sleep", name_exe)
    daemon_pid, crash_pid = tmp_path / "daemon.pid", tmp_path / "crash.pid"
    config = tmp_path / "tg.yml"
    config.write_text(
        f"""
runs:
  - name: daemon
    pid_file: {daemon_pid}
  - name: crasher
    pid_file: {crash_pid}
  - name: by-name
    process_match: "^tgnamesleep$"
  - name: by-cmdline
    cmdline_match: "^sleep 3600[.]271828$"
"""
    )
    procs: list[subprocess.Popen[bytes]] = []
    runs = ("daemon", "crasher", "by-name", "by-cmdline")

    def up(s: Samples, run: str) -> float | None:
        return sample(s, "trainguard_run_process_up", run=run, rank="0")

    def finished(s: Samples, run: str) -> float | None:
        return sample(s, "trainguard_run_finished", run=run, rank="0")

    try:
        with Exporter(args=[f"--config.file={config}"], state_dir=tmp_path / "state") as exp:
            before = exp.scrape()
            for run in runs:  # declared, not started: known, but nothing to page about
                assert up(before, run) is None, run
                assert finished(before, run) is None, run
                assert len(select(before, "trainguard_run_info", run=run)) == 1
            assert sample(before, "trainguard_collector_success", collector="runs") == 1
            daemon = subprocess.Popen(["sleep", "3600"])
            crasher = subprocess.Popen(["sleep", "3600"])
            by_name = subprocess.Popen([str(name_exe), "3600"])
            by_cmdline = subprocess.Popen(["sleep", "3600.271828"])
            procs += [daemon, crasher, by_name, by_cmdline]
            daemon_pid.write_text(f"{daemon.pid}\n")
            crash_pid.write_text(f"{crasher.pid}\n")
            alive = exp.scrape()
            for run in runs:
                assert up(alive, run) == 1, run
            assert finished(alive, "daemon") == finished(alive, "crasher") == 0
            assert finished(alive, "by-name") is None  # a process match cannot tell
            assert select(alive, "trainguard_run_info", run="by-cmdline").keys() == {
                frozenset(
                    {("run", "by-cmdline"), ("rank", "0"), ("host", os.uname().nodename)}
                    | {("pid", str(by_cmdline.pid))}
                )
            }
            # a daemon's clean shutdown removes its pid file; a crash leaves it behind
            daemon_pid.unlink()
            daemon.kill()
            crasher.kill()
            by_name.kill()
            by_cmdline.kill()
            for p in procs:
                p.wait()
            after = exp.scrape()
            assert (up(after, "daemon"), finished(after, "daemon")) == (0, 1)
            assert (up(after, "crasher"), finished(after, "crasher")) == (0, 0)
            assert up(after, "by-name") == 0 and up(after, "by-cmdline") == 0
            assert sample(after, "trainguard_collector_success", collector="runs") == 1
            # the crashed run's pid file removed by whoever decided not to restart it
            crash_pid.unlink()
            acknowledged = exp.scrape()
            assert up(acknowledged, "crasher") is None
            assert finished(acknowledged, "crasher") is None
            assert (up(acknowledged, "daemon"), finished(acknowledged, "daemon")) == (0, 1)
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_ages_are_measured_on_the_exporters_clock(tmp_path: Path) -> None:
    """Step, heartbeat, start and last-death ages: the exporter's now minus the timestamps the
    trainer wrote on the same host, so the alerts need no time() from Prometheus (whose clock
    may be an hour off this host's). A timestamp ahead of the exporter's clock is age 0."""
    state = tmp_path / "state"
    state.mkdir()
    written = time.time()
    put(
        state,
        own_heartbeat(
            "ages",
            started=written - 3600,
            time=written - 5,
            step=41,
            step_time=written - 600,
            deaths=1,
            death_history=(
                Death(step=40, time=written - 900, detected=written - 3600, cause="unknown"),
            ),
        ),
    )
    put(state, own_heartbeat("no-step", step=None, step_time=None, time=written + 30))
    put(state, own_heartbeat("unknown-times", time=0.0, step_time=0.0, started=0.0))
    with Exporter(state_dir=state) as exp:
        s = exp.scrape()
    slack = time.time() - written  # how long writing and scraping took: ages grow by at most this
    run = {"run": "ages", "rank": "0"}
    for metric, expected in [
        ("trainguard_run_step_age_seconds", 600),
        ("trainguard_run_heartbeat_age_seconds", 5),
        ("trainguard_run_start_age_seconds", 3600),
    ]:
        got = sample(s, metric, **run)
        assert got is not None and expected <= got <= expected + slack, (metric, got)
    got = sample(s, "trainguard_run_last_death_age_seconds", run="ages")
    assert got is not None and 900 <= got <= 900 + slack
    # no step yet: no step age (not 0, not huge); a heartbeat from the future: age 0
    assert select(s, "trainguard_run_step_age_seconds", run="no-step") == {}
    assert sample(s, "trainguard_run_heartbeat_age_seconds", run="no-step", rank="0") == 0
    assert select(s, "trainguard_run_last_death_age_seconds", run="no-step") == {}
    # a time of 0 is unknown (the heartbeat format allows it): no age rather than a huge one
    for metric in ("step", "heartbeat", "start"):
        assert select(s, f"trainguard_run_{metric}_age_seconds", run="unknown-times") == {}


def test_dead_and_finished_runs_are_dropped_after_retention(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    old = time.time() - 7200
    put(state, own_heartbeat("old-dead", pid=1, create_time=1.0, time=old))
    put(state, own_heartbeat("old-finished", pid=1, create_time=1.0, time=old, state="finished"))
    put(state, own_heartbeat("recent-dead", pid=1, create_time=1.0, time=time.time() - 60))
    put(state, own_heartbeat("old-but-alive", time=old))
    config = tmp_path / "tg.yml"
    config.write_text("run_retention: 1h\n")
    with Exporter(args=[f"--config.file={config}"], state_dir=state) as exp:
        s = exp.scrape()
    runs = {dict(lbl)["run"] for lbl in select(s, "trainguard_run_info")}
    assert runs == {"recent-dead", "old-but-alive"}
    assert len(list(state.iterdir())) == 4  # the exporter never deletes


def test_odd_run_names_round_trip_through_the_exposition(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    names = ['llama/ft "v2"', "a\\b ünï ✓", "../../etc/passwd", "x" * 128]
    for name in names:
        put(state, own_heartbeat(name, scalars={"loss": 0.5, "tokens_per_s": 1200.0}))
    with Exporter(state_dir=state) as exp:
        s = exp.scrape()
    assert {dict(lbl)["run"] for lbl in select(s, "trainguard_run_process_up")} == set(names)
    assert all(p.parent == state for p in state.iterdir())
    assert sample(s, "trainguard_run_scalar", run=names[0], rank="0", name="tokens_per_s") == 1200


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fake NVML is Linux-only")
def test_allocator_reserved_next_to_driver_view_memory(tmp_path: Path) -> None:
    """The ghost-memory comparison: what the driver attributes to the run's live process vs
    what its caching allocator reserved (the heartbeat carries stats recorded with the real
    torch.cuda.memory_stats() key names). Once the process is gone, its pid no longer counts
    for the run even though the driver still lists it."""
    gib = 1 << 30
    stats = {
        "allocated_bytes.all.current": 6 * gib,
        "allocated_bytes.all.peak": 9 * gib,
        "reserved_bytes.all.current": 12 * gib,
        "inactive_split_bytes.all.current": 3 * gib,
        "num_alloc_retries": 4,
        "num_ooms": 1,
    }
    trainer = subprocess.Popen(["sleep", "60"])
    try:
        state = tmp_path / "state"
        state.mkdir()
        put(
            state,
            own_heartbeat(
                "ghost",
                pid=trainer.pid,
                create_time=psutil.Process(trainer.pid).create_time(),
                allocator=(allocator_stats(0, stats, total=80 * gib),),
            ),
        )
        nvml = FakeNvmlState()
        nvml.add_gpu(total=80 * gib, used=30 * gib)
        nvml.add_process(0, trainer.pid, 20 * gib)
        nvml_path = nvml.write(tmp_path / "nvml.state")
        with Exporter(state_dir=state, env=nvml.env(nvml_path)) as exp:
            s = exp.scrape()
            trainer.kill()
            trainer.wait()
            after = exp.scrape()
    finally:
        trainer.kill()
        trainer.wait()
    run = {"run": "ghost", "rank": "0"}
    assert sample(s, "trainguard_collector_success", collector="gpu") == 1
    assert sample(s, "trainguard_run_gpu_memory_used_bytes", **run, gpu="0") == 20 * gib
    dev = {**run, "device": "0"}
    assert sample(s, "trainguard_run_allocator_reserved_bytes", **dev) == 12 * gib
    assert sample(s, "trainguard_run_allocator_allocated_bytes", **dev) == 6 * gib
    assert sample(s, "trainguard_run_allocator_max_allocated_bytes", **dev) == 9 * gib
    assert sample(s, "trainguard_run_allocator_inactive_split_bytes", **dev) == 3 * gib
    assert sample(s, "trainguard_run_allocator_alloc_retries_total", **dev) == 4
    assert sample(s, "trainguard_run_allocator_ooms_total", **dev) == 1
    assert sample(s, "trainguard_run_allocator_device_total_bytes", **dev) == 80 * gib
    procs = select(s, "trainguard_gpu_process_memory_used_bytes", pid=str(trainer.pid))
    assert [dict(lbl)["run"] for lbl in procs] == ["ghost"]
    # dead: the driver still lists the pid (ghost memory), but it is no longer the run's
    assert sample(after, "trainguard_run_process_up", **run) == 0
    assert select(after, "trainguard_run_gpu_memory_used_bytes", run="ghost") == {}
    procs = select(after, "trainguard_gpu_process_memory_used_bytes", pid=str(trainer.pid))
    assert [dict(lbl)["run"] for lbl in procs] == [""]
