"""The ``trainguard`` terminal command, driven as a user would: real processes, a
pseudo-terminal for the coloured layout, a pipe for plain text, ``--json`` parsed."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pexpect
import psutil
import pytest

from helpers.exporter_proc import Exporter, child_env, poll, value
from helpers.run_child import heartbeat_path, start_child, wait_heartbeat
from helpers.wait import wait_for
from trainguard import checkpoint
from trainguard.shared.heartbeat.record import Heartbeat

CMD = [sys.executable, "-m", "trainguard.exporter.terminal"]
DEADLINE = 60.0


def plain_env() -> dict[str, str]:
    env = child_env()
    for var in ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        env.pop(var, None)
    return env


def tg(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CMD, *args], env=plain_env(), capture_output=True, text=True, timeout=120
    )


def until(check: Callable[[], Any], what: str, timeout: float = DEADLINE) -> Any:
    return wait_for(check, timeout, 0.1, what)


def status_json(state: Path, *extra: str, rc: int | None = 0) -> dict[str, Any]:
    """``status --json``; ``rc``: its exit status (0 every run fine, 1 not), None: either."""
    r = tg("status", f"--state.dir={state}", "--json", *extra)
    assert r.returncode in ((0, 1) if rc is None else (rc,)), r.stderr
    doc: dict[str, Any] = json.loads(r.stdout)
    return doc


def states(doc: dict[str, Any]) -> dict[str, str]:
    return {r["run"]: r["state"] for r in doc["runs"]}


def test_status_live_dead_finished_stalled(tmp_path: Path) -> None:
    state = tmp_path / "state"
    procs = {
        "live": start_child("live", state, 0, "steady"),
        "load": start_child("load", state, 0, "starting"),  # alive, no step: never stalled
        "dead": start_child("dead", state, 20, "hang"),
        "done": start_child("done", state, 20, "with"),
        "stuck": start_child("stuck", state, 5, "hang"),
    }
    try:
        wait_heartbeat(heartbeat_path(state, "dead"), lambda hb: hb.step == 20)
        wait_heartbeat(heartbeat_path(state, "stuck"), lambda hb: hb.step == 5)
        wait_heartbeat(heartbeat_path(state, "done"), lambda hb: hb.state == "finished")
        procs["dead"].kill()
        procs["dead"].wait(DEADLINE)
        want = {
            "live": "alive",
            "load": "starting",
            "dead": "dead",
            "done": "finished",
            "stuck": "stalled",
        }

        def seen() -> dict[str, Any] | None:
            # --stall 3s: the live run steps every 20 ms, the stuck one stopped at step 5
            doc = status_json(state, "--stall=3s", "--sample=1s", rc=None)
            return doc if states(doc) == want else None

        doc = until(seen, "status tells the five runs apart")
        rows = {r["run"]: r for r in doc["runs"]}
        assert rows["stuck"]["step"] == 5 and rows["dead"]["step"] == 20
        assert rows["live"]["steps_per_second"] > 0
        assert rows["done"]["steps_per_second"] is None
        assert doc["nvml"] in (True, False)

        # piped: plain text, no escape codes, one line per run
        r = tg("status", f"--state.dir={state}", "--stall=3s", "--sample=0")
        assert r.returncode == 1, r.stderr  # a run dead, one stalled: for scripts, not fine
        assert "\x1b" not in r.stdout
        lines = r.stdout.splitlines()
        for run, st in want.items():
            assert any(line.split()[:3] == [run, "0", st] for line in lines), r.stdout
        if not doc["nvml"]:
            assert "no NVML" in r.stdout

        # on a terminal: rich's table, in colour
        child = on_terminal("status", f"--state.dir={state}", "--stall=3s", "--sample=0")
        out = child.read()
        child.wait()
        assert child.exitstatus == 1, out
        assert "\x1b[" in out  # ANSI colour codes
        assert "stalled" in out and "finished" in out and "dead" in out and "starting" in out

        # an 80-column terminal: the table wraps between words, never inside one
        child = on_terminal(
            "status", f"--state.dir={state}", "--stall=3s", "--sample=0", columns=80
        )
        out = re.sub(r"\x1b\[[0-9;]*m", "", child.read())
        child.wait()
        words = out.split()
        for word in ("checkpoints", "allocator", "finished", "starting", "stalled"):
            assert word in words, (word, out)
        assert all(len(line) <= 80 for line in out.splitlines()), out
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()


def on_terminal(*args: str, columns: int = 200) -> pexpect.spawn:
    """The command on a pseudo-terminal (200 columns), as a user at a colour terminal runs it."""
    return pexpect.spawn(
        CMD[0],
        [*CMD[1:], *args],
        env={**plain_env(), "TERM": "xterm-256color", "COLUMNS": str(columns)},
        encoding="utf-8",
        timeout=DEADLINE,
        dimensions=(40, columns),
        preexec_fn=interruptible,
    )


def interruptible() -> None:
    """In the child: SIGINT as a terminal user has it. Started in the background (``nohup
    ./run-tests &``, some CI runners) the suite inherits SIGINT ignored, and Python then leaves
    it ignored: Ctrl-C would do nothing and the test would hang instead of testing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def stepped(hb: Heartbeat) -> bool:
    return hb.step is not None and hb.step > 0  # None: written before the first step


def test_status_watch_redraws_in_place_until_ctrl_c(tmp_path: Path) -> None:
    """``--watch`` on a terminal: the table is redrawn in place (the cursor goes back up over
    the previous frame) with the live run's newer step, until Ctrl-C, which ends it as a
    shell expects (status 130, no traceback, the cursor shown again)."""
    state = tmp_path / "state"
    proc = start_child("live", state, 0, "steady")
    try:
        wait_heartbeat(heartbeat_path(state, "live"), stepped)
        child = on_terminal("status", f"--state.dir={state}", "--watch", "--interval=1s")
        steps: set[int] = set()
        while len(steps) < 2:  # frames until one shows a newer step than the first
            child.expect(r"live +0 +(?:\x1b\[[0-9;]*m)*alive(?:\x1b\[[0-9;]*m)* +(\d+) ")
            steps.add(int(child.match.group(1)))
        child.sendintr()
        rest = child.read()
        child.wait()
        assert child.exitstatus == 130, rest
        assert "Traceback" not in rest and "KeyboardInterrupt" not in rest, rest
        assert "\x1b[1A" in child.before + rest  # cursor up: redrawn over the last frame
        assert rest.rstrip().endswith("\x1b[?25h")  # cursor visible again
    finally:
        proc.kill()
        proc.wait()


def plain_step(line: str) -> int | None:
    """The live run's step in a line of the plain table, if the line is its row."""
    assert "\x1b" not in line
    words = line.split()
    return int(words[3]) if words[:3] == ["live", "0", "alive"] else None


def json_step(line: str) -> int | None:
    """The live run's step in a ``--watch --json`` line: every line one whole snapshot."""
    rows = [r for r in json.loads(line)["runs"] if r["run"] == "live"]
    assert [r["state"] for r in rows] == ["alive"], line
    return int(rows[0]["step"])


@pytest.mark.parametrize(("extra", "step_in"), [((), plain_step), (("--json",), json_step)])
def test_status_watch_into_a_pipe_appends_each_refresh(
    tmp_path: Path, extra: tuple[str, ...], step_in: Callable[[str], int | None]
) -> None:
    """Piped (``--watch | tee status.log``): each refresh is appended, a plain block or with
    ``--json`` one JSON line, so the log holds the live run's steps one after the other;
    SIGINT ends it with status 130."""
    state = tmp_path / "state"
    proc = start_child("live", state, 0, "steady")
    watcher = None
    try:
        wait_heartbeat(heartbeat_path(state, "live"), stepped)
        watcher = subprocess.Popen(
            [*CMD, "status", f"--state.dir={state}", "--watch", "--interval=1s", *extra],
            env=plain_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=interruptible,
        )
        assert watcher.stdout is not None
        steps: list[int] = []
        stdout = watcher.stdout

        def newer_step() -> bool:  # until one shows a newer step than the first
            if select.select([stdout], [], [], 0.1)[0]:
                line = stdout.readline()
                assert line, f"--watch ended with {watcher.wait()}: {watcher.communicate()[1]}"
                step = step_in(line)
                if step is not None:
                    steps.append(step)
            return len(set(steps)) >= 2

        wait_for(newer_step, DEADLINE, 0, lambda: f"--watch to show a newer step: {steps}")
        assert steps == sorted(steps)
        watcher.send_signal(signal.SIGINT)
        _, err = watcher.communicate(timeout=DEADLINE)
        assert watcher.returncode == 130 and err == "", err
    finally:
        proc.kill()
        proc.wait()
        if watcher is not None and watcher.poll() is None:
            watcher.kill()
            watcher.wait()


def test_status_bad_input(tmp_path: Path) -> None:
    r = tg("status", f"--state.dir={tmp_path / 'nope'}")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "does not exist" in r.stderr
    if os.geteuid() != 0:  # root reads anything
        locked = tmp_path / "locked"
        locked.mkdir(mode=0)
        r = tg("status", f"--state.dir={locked}")
        assert r.returncode == 2 and "cannot" in r.stderr
    cfg = tmp_path / "bad.yml"
    cfg.write_text("runs: 3\n")
    r = tg("status", f"--state.dir={tmp_path}", f"--config.file={cfg}")
    assert r.returncode == 2 and str(cfg) in r.stderr
    # durations follow the config file's grammar: units from largest to smallest
    r = tg("status", f"--state.dir={tmp_path}", "--stall=30m1h")
    assert r.returncode == 2 and "--stall: expected a duration such as" in r.stderr, r.stderr


OLD = time.time() - 3600  # written an hour ago: settled, past the grace period


def _aged(path: Path, when: float = OLD) -> None:
    os.utime(path, (when, when))


def test_verify_truncated_mirror_in_flight_and_unknown_mtime(tmp_path: Path) -> None:
    """The field report: primary 2470 bytes, the mirror's copy of the same step cut at 1820."""
    primary, mirror = tmp_path / "ckpt", tmp_path / "mirror"
    primary.mkdir()
    mirror.mkdir()
    for step in (100, 200):
        p = primary / f"step_{step}.pt"
        checkpoint.save(os.urandom(2470), p)
        checkpoint.mirror(p, mirror)
        _aged(p)
        _aged(mirror / p.name)
    cut = mirror / "step_200.pt"
    with open(cut, "r+b") as fh:
        fh.truncate(1820)
    _aged(cut)

    r = tg("verify", str(mirror), f"--primary={primary}", "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    verdicts = {i["name"]: (i["verdict"], i["size"], i["expected_size"]) for i in doc["items"]}
    assert verdicts["step_200.pt"] == ("truncated", 1820, 2470)
    assert verdicts["step_100.pt"][0] == "complete"
    assert doc["resume_from"] == "step_100.pt" and doc["resume_step"] == 100
    assert doc["ok"] is False

    r = tg("verify", str(mirror), f"--primary={primary}")
    assert r.returncode == 1 and "\x1b" not in r.stdout
    assert "truncated" in r.stdout and "1820/2470" in r.stdout
    assert "resume from: step_100.pt" in r.stdout

    # the primary itself is fine, also by content
    r = tg("verify", str(primary), "--hash", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert all(i["hash_ok"] is True for i in doc["items"]), doc
    assert doc["resume_from"] == "step_200.pt"

    # a .part being written next to them, and a file whose mtime NFS reports as 0
    (primary / "step_300.pt.part").write_bytes(b"x" * 1000)
    p4 = primary / "step_400.pt"
    checkpoint.save(os.urandom(2470), p4)
    os.utime(p4, (0, 0))
    r = tg("verify", str(primary), "--json")
    doc = json.loads(r.stdout)
    verdicts = {i["name"]: i["verdict"] for i in doc["items"]}
    assert verdicts["step_300.pt.part"] == "in flight"
    assert verdicts["step_400.pt"] == "unknown mtime"
    assert doc["resume_from"] == "step_200.pt"
    assert r.returncode == 1  # the newest checkpoint (400) is not known complete

    # one checkpoint file
    r = tg("verify", str(primary / "step_200.pt"), "--hash")
    assert r.returncode == 0 and "SHA-256 verified" in r.stdout
    r = tg("verify", str(cut), f"--primary={primary}")
    assert r.returncode == 1 and "truncated" in r.stdout

    # a .part its writer left long ago
    _aged(primary / "step_300.pt.part")
    r = tg("verify", str(primary), "--json")
    verdicts = {i["name"]: i["verdict"] for i in json.loads(r.stdout)["items"]}
    assert verdicts["step_300.pt.part"] == "orphaned .part"

    # coloured on a terminal
    child = pexpect.spawn(
        CMD[0],
        [*CMD[1:], "verify", str(mirror), f"--primary={primary}"],
        env={**plain_env(), "TERM": "xterm-256color"},
        encoding="utf-8",
        timeout=DEADLINE,
        dimensions=(40, 160),
    )
    out = child.read()
    child.wait()
    assert child.exitstatus == 1 and "\x1b[" in out and "truncated" in out


def _aged_tree(path: Path) -> None:
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            _aged(Path(root) / name)
    _aged(path)


def test_verify_step_directories(tmp_path: Path) -> None:
    """DCP-style step directories: one item per directory, a mirror's directory with a file
    cut short is truncated, an uncommitted one is in flight, and resume_from is a directory."""
    primary, mirror = tmp_path / "ckpt", tmp_path / "mirror"
    for step in (100, 200):
        for loc in (primary, mirror):
            d = loc / f"step-{step}"
            d.mkdir(parents=True)
            (d / "__0_0.distcp").write_bytes(b"a" * 2470)
            (d / ".metadata").write_bytes(b"m" * 10)
            _aged_tree(d)
    cut = mirror / "step-200" / "__0_0.distcp"
    os.truncate(cut, 1820)
    _aged(cut)
    (primary / "step-300").mkdir()
    (primary / "step-300" / "__0_0.distcp").write_bytes(b"a")  # no .metadata yet
    r = tg("verify", str(mirror), f"--primary={primary}", "--pattern=step-{step}", "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    verdicts = {i["name"]: (i["verdict"], i["size"], i["expected_size"]) for i in doc["items"]}
    assert verdicts["step-200/"] == ("truncated", 1830, 2480)
    assert verdicts["step-100/"][0] == "complete"
    assert doc["resume_from"] == "step-100" and doc["resume_step"] == 100
    r = tg("verify", str(primary), "--pattern=step-{step}", "--json")
    doc = json.loads(r.stdout)
    verdicts = {i["name"]: i["verdict"] for i in doc["items"]}
    assert verdicts == {"step-300/": "in flight", "step-200/": "complete", "step-100/": "complete"}
    assert doc["resume_from"] == "step-200" and r.returncode == 0
    r = tg("verify", str(primary / "step-100"), "--pattern=step-{step}")
    assert r.returncode == 0 and "committed by its framework's marker" in r.stdout


def test_verify_hints_at_the_pattern_of_a_frameworks_checkpoints(tmp_path: Path) -> None:
    """Nothing matches the default pattern, but the Trainer's directories are there: the hint
    names the --pattern that finds them, in the text and the JSON; with it, none."""
    for step in (50, 100):
        (tmp_path / f"checkpoint-{step}").mkdir()
    r = tg("verify", str(tmp_path))
    assert r.returncode == 1 and "(no checkpoints)" in r.stdout
    assert "2 match 'checkpoint-{step}' (Hugging Face Trainer)" in r.stdout
    assert "try --pattern 'checkpoint-{step}'" in r.stdout
    doc = json.loads(tg("verify", str(tmp_path), "--json").stdout)
    assert "checkpoint-{step}" in doc["hint"]
    doc = json.loads(tg("verify", str(tmp_path), "--pattern=checkpoint-{step}", "--json").stdout)
    assert doc["hint"] is None and len(doc["items"]) == 2


def test_verify_bad_input(tmp_path: Path) -> None:
    r = tg("verify", str(tmp_path / "nope"))
    assert r.returncode == 2 and "does not exist" in r.stderr and r.stderr.count("\n") == 1
    d = tmp_path / "ckpt"
    d.mkdir()
    checkpoint.save(b"x" * 10, d / "step_1.pt")
    (d / ".trainguard" / "step_1.pt.json").write_text("{not json")
    r = tg("verify", str(d))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    r = tg("verify", str(d), "--pattern=nostep")
    assert r.returncode == 2 and "pattern" in r.stderr


STEADY = r"""
import os, sys, time
import trainguard
with trainguard.Run(os.environ["TRAINGUARD_RUN"], interval=0.05) as run:
    i = 0
    while True:
        run.step(i)
        print("step", i, flush=True)
        i += 1
        time.sleep(0.05)
"""


def test_launch_survives_the_death_of_its_shell(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    script = tmp_path / "child.py"
    script.write_text(STEADY)
    log, pid_file = tmp_path / "train.log", tmp_path / "train.pid"
    launch = " ".join(
        [
            *CMD,
            "launch",
            "--name=far",
            f"--log={log}",
            f"--pid-file={pid_file}",
            f"--state.dir={state}",
            "--",
            sys.executable,
            str(script),
        ]
    )
    # the shell stays after launching, as a login shell would, until its group is killed
    shell = subprocess.Popen(
        ["bash", "-c", f"{launch} && echo launched && exec sleep 1000"],
        env=plain_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    pid = 0
    try:
        assert shell.stdout is not None
        said = ""
        for line in shell.stdout:
            said += line
            if line.strip() == "launched":
                break
        assert "tail -f" in said and "trainguard status" in said, said
        pid = int(until(lambda: pid_file.exists() and pid_file.read_text().strip(), "pid file"))
        hb = wait_heartbeat(heartbeat_path(state, "far"), lambda hb: (hb.step or 0) >= 3)
        assert hb.pid == pid
        os.killpg(shell.pid, signal.SIGKILL)
        shell.wait(DEADLINE)
        # the run keeps stepping, and its log keeps growing
        size = log.stat().st_size
        wait_heartbeat(heartbeat_path(state, "far"), lambda h: (h.step or 0) >= hb.step + 20)
        until(lambda: log.stat().st_size > size, "log grows after the shell died")
        assert psutil.Process(pid).ppid() != shell.pid
        assert os.getsid(pid) == pid  # a session of its own

        doc = status_json(state, "--sample=1s")
        assert states(doc) == {"far": "alive"}
        with Exporter(args=["--no-collector.gpu"], state_dir=state) as exp:
            s = poll(exp, lambda s: value(s, "trainguard_run_process_up", run="far", rank="0") == 1)
            assert value(s, "trainguard_run_process_up", run="far", rank="0") == 1
    finally:
        if shell.poll() is None:
            os.killpg(shell.pid, signal.SIGKILL)
            shell.wait()
        if pid:
            os.kill(pid, signal.SIGKILL)


def test_launch_bad_command(tmp_path: Path) -> None:
    r = tg("launch", f"--log={tmp_path / 'x.log'}", "--", str(tmp_path / "no-such-program"))
    assert r.returncode == 2 and "cannot execute" in r.stderr and r.stderr.count("\n") == 1
    r = tg("launch", f"--log={tmp_path / 'nodir' / 'x.log'}", "--", "true")
    assert r.returncode == 2 and "log file" in r.stderr


@pytest.mark.parametrize("sub", ["status", "verify", "launch"])
def test_help(sub: str) -> None:
    r = tg(sub, "--help")
    assert r.returncode == 0
    if sub == "verify":
        # step directories are judged (test_verify_step_directories): the help says how
        text = " ".join(r.stdout.split())
        assert "Step directories" in text and "--pattern, e.g. 'checkpoint-{step}'" in text
        assert "not supported" not in text
