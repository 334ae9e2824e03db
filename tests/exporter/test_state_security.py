"""The state dir is written by others: the exporter does not follow links out of it, bounds
what it reads, keeps command lines, environment and file contents out of the exposition, and
does not watch a checkpoint directory or log file a heartbeat announces unless the heartbeat's
owner owns it (those in the config file are always watched)."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from pathlib import Path

import psutil
import pytest

from helpers.exporter_proc import Exporter, select, value
from helpers.run_child import own_heartbeat, put
from helpers.wait import wait_for
from trainguard.checkpoint import save
from trainguard.shared.heartbeat.record import heartbeat_filename, write_heartbeat

SECRET = "hunter2-AKIA5ECRETT0KEN"


def test_links_out_of_the_state_dir_are_not_followed(tmp_path: Path) -> None:
    state, outside = tmp_path / "state", tmp_path / "outside"
    state.mkdir()
    outside.mkdir()
    put(state, own_heartbeat("inside"))
    put(outside, own_heartbeat("outside"))  # a valid heartbeat, but not in the state dir
    (state / "passwd-00000000.rank0.heartbeat.json").symlink_to("/etc/passwd")
    (state / heartbeat_filename("outside", 0)).symlink_to(
        outside / heartbeat_filename("outside", 0)
    )
    (state / "sub").symlink_to(outside)  # a linked subdirectory: never descended into
    (state / "etc.heartbeat.json").symlink_to("/etc")
    with Exporter(state_dir=state) as exp:
        text = exp.get()
        s = exp.scrape()
        log = exp.stop()
    assert {dict(lbl)["run"] for lbl in select(s, "trainguard_run_info")} == {"inside"}
    assert value(s, "trainguard_heartbeat_file_errors") == 3
    assert log.count("is a symbolic link; refused") == 3
    for where in (text, log):
        assert "root:" not in where and "/bin/" not in where


def test_a_1_gib_sparse_heartbeat_is_refused_without_reading_it(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    put(state, own_heartbeat("good"))
    huge = state / "huge-00000000.rank0.heartbeat.json"
    with open(huge, "wb") as f:
        f.truncate(1 << 30)
    with Exporter(state_dir=state) as exp:
        io = psutil.Process(exp.proc.pid)
        before = io.io_counters().read_chars
        s = exp.scrape()
        read = io.io_counters().read_chars - before
        log = exp.stop()
    assert read < 64 << 20, read  # bytes the exporter read in that scrape: not the 1 GiB
    assert value(s, "trainguard_run_process_up", run="good", rank="0") == 1
    assert f"{huge}: 1073741824 bytes, larger than the 1 MiB limit; refused" in log


def test_secrets_in_heartbeats_never_reach_the_exposition(tmp_path: Path) -> None:
    """Fields that are not labels (paths, error, version, boot id), invalid fields and invalid
    scalar names: none of it is published, and refused files are not quoted in the log."""
    state = tmp_path / "state"
    state.mkdir()
    put(
        state,
        own_heartbeat(
            "valid",
            error=SECRET,
            version=SECRET,
            boot_id=None,
            checkpoint_dir=f"/nonexistent/{SECRET}",
            log_file=f"/nonexistent/{SECRET}.log",
            scalars={"loss": 1.0},
        ),
    )
    bad = own_heartbeat("invalid").to_dict()
    for i, (field, secret) in enumerate(
        [
            ("state", SECRET),
            ("host", "x" * 300 + SECRET),
            ("scalars", {f"{SECRET} =": 1.0}),
            ("mirrors", {SECRET + "/": "/x"}),
            ("death_history", [{"step": 1, "time": 1, "detected": 1, "cause": SECRET}]),
        ]
    ):
        write_heartbeat(state / f"bad{i}-00000000.rank0.heartbeat.json", {**bad, field: secret})
    with Exporter(state_dir=state) as exp:
        text = exp.get()
        log = exp.stop()
    assert 'run="valid"' in text and 'run="invalid"' not in text
    assert SECRET not in text
    refused = [ln for ln in log.splitlines() if "bad" in ln and "heartbeat.json" in ln]
    assert len(refused) == 5 and not any(SECRET in ln for ln in refused), refused


def test_process_match_command_lines_and_environment_stay_out(tmp_path: Path) -> None:
    name = f"tgsecret{secrets.token_hex(3)}"  # no other process's, whatever runs meanwhile
    exe = tmp_path / name
    shutil.copy("/bin/sh", exe)  # stays the parent of its sleep: its name is matched
    proc = subprocess.Popen(
        [str(exe), "-c", "sleep 60; :", "tgsecretsleep", f"--token={SECRET}"],
        env={"API_TOKEN": SECRET, "PATH": os.environ.get("PATH", "")},
        stderr=subprocess.DEVNULL,
    )
    try:
        cfg = tmp_path / "tg.yml"
        cfg.write_text(
            f"runs:\n  - name: matched\n    process_match: '^{name}$'\n"
            "  - name: by-cmdline\n    cmdline_match: 'tgsecretsleep --token='\n"
            f"process_counts:\n  - name: sleepers\n    match: '^{name}'\n"
        )
        # until the shell runs under its copied name
        wait_for(lambda: psutil.Process(proc.pid).name() == name, 60, 0.01, f"comm {name}")
        with Exporter(args=[f"--config.file={cfg}"], state_dir=tmp_path / "state") as exp:
            text = exp.get()
            s = exp.scrape()
            log = exp.stop()
    finally:
        proc.kill()
        proc.wait()
    if value(s, "trainguard_run_process_up", run="matched", rank="0") != 1:
        pytest.fail(f"process not matched (exited early?):\n{text}")
    # the command line is matched (secret and all), never published
    assert value(s, "trainguard_run_process_up", run="by-cmdline", rank="0") == 1
    assert value(s, "trainguard_process_count", name="sleepers") == 1
    assert SECRET not in text and SECRET not in log


# ---------------------------------------------------------------- announced directories

needs_root = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to chown files"
)
OTHER = 12345


@needs_root
def test_announced_checkpoint_dirs_must_belong_to_the_heartbeat_owner(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    own_dir, foreign_dir, root_run_dir = (tmp_path / n for n in ("own", "foreign", "rootrun"))
    for d in (own_dir, foreign_dir, root_run_dir):
        d.mkdir()
        save(b"x" * 10, d / "step_1.pt")
    os.chown(own_dir, OTHER, OTHER)  # foreign_dir and root_run_dir stay root's

    def announce(run: str, owner: int, **dirs: object) -> None:
        path = put(state, own_heartbeat(run, **dirs))
        os.chown(path, owner, owner)

    announce("user-own", OTHER, checkpoint_dir=str(own_dir))
    announce("user-foreign", OTHER, checkpoint_dir=str(own_dir), mirrors={"m": str(foreign_dir)})
    announce("by-root", 0, checkpoint_dir=str(foreign_dir))
    # declared in the config file: always watched, whoever owns it
    cfg = tmp_path / "tg.yml"
    cfg.write_text(f"runs:\n  - name: declared\n    checkpoints: {{primary: {foreign_dir}}}\n")
    with Exporter(args=[f"--config.file={cfg}"], state_dir=state) as exp:
        s = exp.scrape()
        log = exp.stop()

    def up(run: str, location: str = "primary") -> float | None:
        return value(s, "trainguard_checkpoint_location_up", run=run, location=location)

    assert up("user-own") == 1
    assert up("user-foreign") == 1 and up("user-foreign", "m") == 0
    assert value(s, "trainguard_checkpoint_files", run="user-foreign", location="m") is None
    assert up("by-root") == 1
    assert up("declared") == 1
    assert value(s, "trainguard_collector_success", collector="checkpoints") == 0
    lines = [ln for ln in log.splitlines() if "not watched" in ln]
    assert len(lines) == 1, log
    assert f"run 'user-foreign', location 'm' at {foreign_dir}" in lines[0]
    assert f"heartbeat owned by uid {OTHER}, but the directory is owned by uid 0" in lines[0]


@needs_root
def test_announced_log_files_must_belong_to_the_heartbeat_owner(tmp_path: Path) -> None:
    """Else anyone who can write the state dir reads the mtime of any file the exporter can
    stat (here one in a directory only root may enter) off a metric."""
    state = tmp_path / "state"
    state.mkdir()
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    secret = private / "secret.log"
    secret.write_text("root's\n")
    own_log = tmp_path / "own.log"
    own_log.write_text("user's\n")
    os.chown(own_log, OTHER, OTHER)
    link = tmp_path / "link.log"  # the user's own link to root's file: the target is judged
    link.symlink_to(secret)
    os.lchown(link, OTHER, OTHER)

    def announce(run: str, owner: int, log_file: Path) -> None:
        path = put(state, own_heartbeat(run, log_file=str(log_file)))
        os.chown(path, owner, owner)

    announce("user-own", OTHER, own_log)
    announce("user-secret", OTHER, secret)
    announce("user-link", OTHER, link)
    announce("by-root", 0, secret)
    with Exporter(state_dir=state) as exp:
        s = exp.scrape()
        log = exp.stop()

    def modified(run: str) -> float | None:
        return value(s, "trainguard_run_log_modified_timestamp_seconds", run=run)

    assert modified("user-own") == pytest.approx(own_log.stat().st_mtime)
    assert modified("user-secret") is None and modified("user-link") is None
    assert modified("by-root") == pytest.approx(secret.stat().st_mtime)
    assert value(s, "trainguard_collector_success", collector="runs") == 0
    lines = [ln for ln in log.splitlines() if "not watched" in ln]
    assert len(lines) == 2, log
    for run, path in (("user-link", link), ("user-secret", secret)):
        (line,) = [ln for ln in lines if f"run {run!r}: log file {path}: not watched" in ln]
        assert f"heartbeat owned by uid {OTHER}, but the file is owned by uid 0" in line
