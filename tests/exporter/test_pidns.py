"""Training in a pid namespace of its own (a Kubernetes pod without hostPID, ``docker run``):
its heartbeat records pid 1 of a namespace the exporter (hostPID) sees from outside. Real
children under ``unshare --pid --fork --mount-proc``, really killed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from helpers.exporter_proc import Exporter, child_env, poll, value
from helpers.run_child import (
    heartbeat_path,
    namespace_child,
    sigkill,
    start_child_in_pid_namespace,
    stat_start_ticks,
    unshare_problem,
    wait_heartbeat,
)
from trainguard.exporter.config.model import parse_config
from trainguard.exporter.runs.table import RunTable
from trainguard.run.reporter import Run
from trainguard.shared import procinfo
from trainguard.shared.heartbeat.read import read_heartbeat

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux namespaces")


@pytest.fixture(scope="module")
def unshare() -> None:
    problem = unshare_problem()
    if problem is not None:
        pytest.skip(problem)


def stop(*procs: subprocess.Popen[str] | None) -> None:
    for p in procs:
        if p is not None and p.poll() is None:
            p.kill()  # unshare --kill-child: its child, pid 1 of the namespace, goes with it
            p.wait(60)


def test_death_in_a_pid_namespace_of_its_own_pages_and_is_counted(
    tmp_path: Path, unshare: None
) -> None:
    state = tmp_path / "state"
    path = heartbeat_path(state, "boxed")
    first = start_child_in_pid_namespace("boxed", state, 7, "hang")
    second = None
    run = {"run": "boxed", "rank": "0"}
    try:
        host_pid = namespace_child(first)
        hb = wait_heartbeat(path, lambda hb: hb.step == 7)
        assert hb.pid == 1 and hb.pid_ns != procinfo.pid_namespace()
        with Exporter(state_dir=state) as exp:
            s = exp.scrape()
            assert value(s, "trainguard_run_process_up", **run) == 1
            assert value(s, "trainguard_collector_success", collector="runs") == 1
            # the driver lists host pids: the GPU collector must get the host pid, not 1
            table = RunTable(parse_config(None, "t"), state)
            assert table.pid_runs() == {host_pid: ("boxed", "0")}
            sigkill(host_pid)
            after = exp.scrape()
            assert value(after, "trainguard_run_process_up", **run) == 0
            assert value(after, "trainguard_run_finished", **run) == 0
            assert value(after, "trainguard_collector_success", collector="runs") == 1
            assert table.pid_runs() == {}
            first.wait(60)
            # restarted in a new namespace (the pod's next container): the death is recorded
            # (a new pod: another hostname, the same node)
            second = start_child_in_pid_namespace("boxed", state, 3, "hang", hostname="pod-b")
            # (its namespace may get the freed one's inode number: the start tells them apart)
            hb2 = wait_heartbeat(path, lambda new: new.started > hb.started and new.step == 3)
            assert hb2.deaths == 1
            assert hb2.death_history[-1].step == 7
            s3 = poll(exp, lambda s: value(s, "trainguard_run_deaths_total", run="boxed") == 1)
            assert value(s3, "trainguard_run_deaths_total", run="boxed") == 1
            assert value(s3, "trainguard_run_process_up", **run) == 1
            assert value(s3, "trainguard_run_last_death_step", run="boxed") == 7
    finally:
        stop(first, second)


def test_a_predecessor_alive_in_another_namespace_is_no_death(
    tmp_path: Path, unshare: None
) -> None:
    """Seen from where /proc shows it (here the host), the predecessor in its container is
    alive: a second process reporting the same run and rank is a duplicate, not a restart."""
    boxed = start_child_in_pid_namespace("twice", tmp_path, 2, "hang", hostname="pod-a")
    try:
        namespace_child(boxed)
        hb = wait_heartbeat(heartbeat_path(tmp_path, "twice"), lambda hb: hb.step == 2)
        assert hb.host == "pod-a"  # a pod's hostname: the boot id tells it is this machine
        with Run("twice", state_dir=tmp_path, interval=0.01) as run:
            run.step(5)
        assert read_heartbeat(run.path).deaths == 0
    finally:
        stop(boxed)


UNPRIVILEGED = r"""
import json, sys
from trainguard.shared import procinfo
pid_ns, pid, ticks = (int(a) if a != "-" else None for a in sys.argv[1:4])
create = float(sys.argv[4])
key = procinfo.NsProcess(pid_ns, pid, create, ticks)
found = procinfo.find_in_namespaces([key])[key]
print(json.dumps([found.kind, found.host_pid]))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start a child as another user")
def test_an_unprivileged_exporter_matches_by_nspid_and_start_ticks(
    tmp_path: Path, unshare: None
) -> None:
    """An exporter that is not root cannot stat /proc/PID/ns/pid of another user's process
    (ptrace read access): it matches the in-namespace pid and the exact start ticks from
    /proc/PID/status and /proc/PID/stat instead, and says "unknown" where only the create
    time would be left to compare."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("no setpriv(1) to drop privileges")
    boxed = start_child_in_pid_namespace("private", tmp_path, 1, "hang")
    try:
        host_pid = namespace_child(boxed)
        hb = wait_heartbeat(heartbeat_path(tmp_path, "private"), lambda hb: hb.step == 1)
        assert hb.pid_ns is not None and hb.start_ticks == stat_start_ticks(host_pid)

        def lookup(ticks: int | None) -> list[object]:
            out = subprocess.run(
                [
                    setpriv,
                    "--reuid=65534",
                    "--regid=65534",
                    "--clear-groups",
                    sys.executable,
                    "-c",
                    UNPRIVILEGED,
                    str(hb.pid_ns),
                    str(hb.pid),
                    "-" if ticks is None else str(ticks),
                    repr(hb.create_time),
                ],
                env=child_env(),
                capture_output=True,
                text=True,
                timeout=120,
                check=True,
            )
            return list(json.loads(out.stdout))

        assert lookup(hb.start_ticks) == ["found", host_pid]
        assert lookup(hb.start_ticks + 1)[0] == "absent"
        # an older reporter's heartbeat, without start ticks: the create time matches, but
        # whether that process is in the recorded namespace cannot be told: unknown, not dead
        assert lookup(None)[0] == "unverifiable"
    finally:
        stop(boxed)


def test_one_scan_finds_the_process_later_scrapes_only_recheck_it(
    tmp_path: Path, unshare: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding a process of another namespace reads the stat of every process on the host:
    done once, after which each scrape re-checks the host pid found (its start ticks and its
    pid in its namespace) and a process gone stays dead without another scan."""
    scans: list[int] = []
    real = procinfo.find_in_namespaces

    def counted(wanted: Any) -> Any:
        scans.append(len(wanted))
        return real(wanted)

    monkeypatch.setattr(procinfo, "find_in_namespaces", counted)
    boxed = start_child_in_pid_namespace("cached", tmp_path, 1, "hang")
    try:
        host_pid = namespace_child(boxed)
        wait_heartbeat(heartbeat_path(tmp_path, "cached"), lambda hb: hb.step == 1)
        table = RunTable(parse_config(None, "t"), tmp_path)
        for _ in range(3):
            (row,) = table.view().rows
            assert (row.up, row.pid, row.pids) == (True, 1, (host_pid,))
        assert scans == [1]
        sigkill(host_pid)
        for _ in range(2):
            (row,) = table.view().rows
            assert (row.up, row.pids) == (False, ())
        assert scans == [1]
        assert table.view().errors == ()
    finally:
        stop(boxed)
