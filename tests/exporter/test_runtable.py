"""The run table in-process: what it hands the GPU collector (pids of live runs only) and the
checkpoint collector (locations, config first), the re-read cache, and how several ranks'
death records become one last death."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil

from helpers.run_child import own_heartbeat, put
from helpers.wait import wait_for
from trainguard.exporter.config.model import parse_config
from trainguard.exporter.runs.rows import last_death
from trainguard.exporter.runs.table import RunTable
from trainguard.exporter.runs.targets import CheckpointTarget
from trainguard.shared.heartbeat.record import Death


def test_pid_runs_lists_only_live_processes(tmp_path: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        put(tmp_path, own_heartbeat("live", rank=1))
        put(tmp_path, own_heartbeat("reused", create_time=1.0))
        put(
            tmp_path,
            own_heartbeat(
                "other",
                rank=2,
                pid=sleeper.pid,
                create_time=psutil.Process(sleeper.pid).create_time(),
            ),
        )
        table = RunTable(parse_config(None, "t"), tmp_path)
        assert table.pid_runs() == {os.getpid(): ("live", "1"), sleeper.pid: ("other", "2")}
        sleeper.kill()
        sleeper.wait()
        assert table.pid_runs() == {os.getpid(): ("live", "1")}
    finally:
        sleeper.kill()
        sleeper.wait()


def test_checkpoint_targets_config_first_then_heartbeats(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    put(state, own_heartbeat("both", checkpoint_dir="/hb/ckpt", mirrors={"nas": "/hb/nas"}))
    put(state, own_heartbeat("both", rank=1, checkpoint_dir="/hb/rank1"))
    put(
        state,
        own_heartbeat("hb-only", checkpoint_dir="/hb/only", checkpoint_pattern="checkpoint-{step}"),
    )
    config = parse_config(
        {
            "runs": [
                {"name": "both", "checkpoints": {"primary": "/cfg/ckpt", "pattern": "ck_{step}"}},
                {"name": "cfg-only", "checkpoints": {"mirrors": {"usb": "/cfg/usb"}}},
            ]
        },
        "t",
    )
    targets = RunTable(config, state).checkpoint_targets()
    me = os.geteuid()  # owns the heartbeat files: an announced location must be this uid's
    assert targets == [
        CheckpointTarget("both", "primary", Path("/cfg/ckpt"), "ck_{step}"),
        CheckpointTarget("cfg-only", "usb", Path("/cfg/usb")),
        CheckpointTarget("both", "nas", Path("/hb/nas"), owner=me),
        CheckpointTarget("hb-only", "primary", Path("/hb/only"), "checkpoint-{step}", owner=me),
    ]


def test_unchanged_files_are_not_read_again(tmp_path: Path, monkeypatch: Any) -> None:
    from trainguard.exporter.runs import table as runtable

    reads: list[str] = []
    real = runtable.read_heartbeat

    def counting(path: Any, **kw: Any) -> Any:
        reads.append(os.path.basename(path))
        return real(path, **kw)

    monkeypatch.setattr(runtable, "read_heartbeat", counting)
    put(tmp_path, own_heartbeat("a"))
    b = put(tmp_path, own_heartbeat("b"))
    (tmp_path / "bad-00000000.rank0.heartbeat.json").write_text("{")
    table = RunTable(parse_config(None, "t"), tmp_path)
    first = table.view()
    assert len(reads) == 3 and first.files_ok == 2 and first.file_errors == 1
    second = table.view()
    assert len(reads) == 3 and second.errors == first.errors  # cached, errors included
    put(tmp_path, own_heartbeat("b", step=6))  # replaced: new inode
    assert len(reads) == 3
    assert [r.heartbeat.step for r in table.view().rows if r.heartbeat and r.run == "b"] == [6]
    assert reads[-1] == b.name and len(reads) == 4


def test_ranks_left_behind_by_a_smaller_restart_are_dropped(tmp_path: Path) -> None:
    now = time.time()
    for rank in range(4):  # the first start had 4 ranks; all died
        put(
            tmp_path,
            own_heartbeat(
                "shrunk",
                rank=rank,
                pid=1,
                create_time=1.0,
                world_size=4,
                started=now - 1000,
                time=now - 100,
            ),
        )
    for rank in range(2):  # restarted with 2
        put(tmp_path, own_heartbeat("shrunk", rank=rank, world_size=2, started=now - 50))
    rows = RunTable(parse_config(None, "t"), tmp_path).view().rows
    assert [(r.rank, r.up) for r in rows] == [("0", True), ("1", True)]


def test_one_crash_of_many_ranks_is_one_death_named_by_the_specific_cause() -> None:
    t = 1_700_000_000.0
    records = [
        Death(step=10, time=t - 5000, detected=t - 4000, cause="oom_killer"),  # an older event
        Death(step=322, time=t + 30, detected=t + 100, cause="unknown"),
        Death(step=322, time=t, detected=t + 101, cause="oom_killer"),
        Death(step=322, time=t + 31, detected=t + 102, cause="unknown"),
    ]
    assert last_death(records) == records[2]
    assert last_death([]) is None
    assert last_death(records[:2]) == records[1]


def test_one_scrape_reads_the_state_dir_once(tmp_path: Path, monkeypatch: Any) -> None:
    """The runs, GPU and checkpoint collectors all use the run table: one scrape lists the
    state directory once (and so checks each pid once), and all three see that snapshot."""
    from prometheus_client import generate_latest

    from trainguard.exporter.cli import build_collectors, build_registry
    from trainguard.exporter.config.model import Config

    state = tmp_path / "state"
    state.mkdir()
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    put(state, own_heartbeat("r", checkpoint_dir=str(ckpt)))
    registry = build_registry(build_collectors(Config(), state))
    listings: list[str] = []
    real = os.scandir

    def scandir(path: Any = ".") -> Any:
        if str(path) == str(state):
            listings.append(str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    for scrapes in (1, 2):
        text = generate_latest(registry).decode()
        assert len(listings) == scrapes
    assert 'trainguard_checkpoint_location_up{location="primary",run="r"} 1.0' in text
    assert 'trainguard_run_process_up{rank="0",run="r"} 1.0' in text


def test_over_the_file_cap_the_newest_heartbeats_are_read(tmp_path: Path) -> None:
    """A state dir holding more heartbeat files than the cap (a long sweep's leftovers, or
    junk): the live runs, whose reporters rewrite their files every few seconds, are the ones
    read, whatever the directory order."""
    from trainguard.exporter.config.model import Config

    state = tmp_path / "state"
    state.mkdir()
    old = time.time() - 3600
    for i in range(50):
        path = put(state, own_heartbeat(f"old-{i}"))
        os.utime(path, (old, old))
    put(state, own_heartbeat("live-a"))
    put(state, own_heartbeat("live-b"))
    view = RunTable(Config(), state, max_files=2).view()
    assert {row.run for row in view.rows} == {"live-a", "live-b"}
    assert any("only the 2 most recently written are read" in e for e in view.errors)


def _config_row(table: RunTable, run: str) -> Any:
    (row,) = [r for r in table.view().rows if r.run == run]
    return row


def _wait_row(table: RunTable, run: str, ok: Any, timeout: float = 60.0) -> Any:
    rows: list[Any] = []

    def row() -> Any:
        rows[:] = [_config_row(table, run)]
        return rows if ok(rows[0]) else None

    wait_for(row, timeout, what=lambda: f"run {run}'s row to satisfy the condition: {rows}")
    return rows[0]


def test_configured_runs_dead_longer_than_the_retention_are_no_longer_published(
    tmp_path: Path,
) -> None:
    pid_file = tmp_path / "train.pid"
    config = parse_config(
        {
            "run_retention": "1s",
            "runs": [
                {"name": "by-file", "pid_file": str(pid_file)},
                {"name": "by-cmdline", "cmdline_match": "^sleep 30[.]5$"},
            ],
        },
        "t",
    )
    table = RunTable(config, tmp_path / "state")
    first = subprocess.Popen(["sleep", "30.5"])
    second = None
    try:
        pid_file.write_text(f"{first.pid}\n")
        for run in ("by-file", "by-cmdline"):
            row = _wait_row(table, run, lambda r: r.up is True)
            assert (row.up, row.pid, row.pids) == (True, first.pid, (first.pid,))
        first.kill()
        first.wait()
        rows = {r.run: r for r in table.view().rows}
        for run in ("by-file", "by-cmdline"):
            assert (rows[run].up, rows[run].pid, rows[run].pids) == (False, first.pid, ())
        for run in ("by-file", "by-cmdline"):
            assert _wait_row(table, run, lambda r: r.up is None).up is None
        assert _config_row(table, "by-file").finished is None
        # a new process of the run is watched afresh
        second = subprocess.Popen(["sleep", "30.5"])
        pid_file.write_text(f"{second.pid}\n")
        for run in ("by-file", "by-cmdline"):
            assert _wait_row(table, run, lambda r: r.up is True).pid == second.pid
    finally:
        for p in (first, second):
            if p is not None:
                p.kill()
                p.wait()


def test_announced_pattern_and_layout_reach_the_checkpoint_targets(tmp_path: Path) -> None:
    """What an integration announces for the Hugging Face Trainer's output_dir: its step
    directories' pattern (and a layout), for the primary and the mirrors alike."""
    put(
        tmp_path,
        own_heartbeat(
            "hf",
            checkpoint_dir="/out",
            mirrors={"nas": "/nas/out"},
            checkpoint_pattern="checkpoint-{step}",
            checkpoint_layout="huggingface",
        ),
    )
    me = os.geteuid()
    targets = RunTable(parse_config(None, "t"), tmp_path).checkpoint_targets()
    assert targets == [
        CheckpointTarget(
            "hf", "primary", Path("/out"), "checkpoint-{step}", me, layout="huggingface"
        ),
        CheckpointTarget(
            "hf", "nas", Path("/nas/out"), "checkpoint-{step}", me, layout="huggingface"
        ),
    ]
