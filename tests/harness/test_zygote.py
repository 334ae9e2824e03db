"""The fork server that starts the framework training children (helpers/zygote.py): a child
forked from it must behave as ``python SCRIPT ARGS`` does, or the tests that use it prove
less than they claim (an uncaught exception, ``sys.exit``, atexit, a SIGKILL)."""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from helpers.exporter_proc import child_env
from helpers.wait import wait_for
from helpers.zygote import Zygote

SCRIPT = textwrap.dedent(
    """
    import atexit, os, sys, time
    atexit.register(lambda: print("atexit", flush=True))
    print(__name__, sys.argv[1:], os.environ.get("ZYGOTE_TEST"), os.getcwd(), flush=True)
    print("session", os.getsid(0) == os.getpid(), flush=True)
    mode = sys.argv[1]
    if mode == "raise":
        raise ValueError("boom")
    if mode == "exit":
        sys.exit(3)
    if mode == "hang":
        time.sleep(600)
    """
)


@pytest.fixture(scope="module")
def zygote() -> Iterator[Zygote]:
    with Zygote(["json"], child_env()) as z:
        yield z


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "script.py"
    path.write_text(SCRIPT)
    return path


def test_a_child_runs_its_script_as_main_with_its_argv_env_and_atexit(
    zygote: Zygote, script: Path, tmp_path: Path
) -> None:
    env = {**child_env(), "ZYGOTE_TEST": "yes"}
    proc = zygote.spawn([script, "ok"], env, stdout=subprocess.PIPE, cwd=tmp_path)
    out, _ = proc.communicate(60)
    assert proc.returncode == 0
    assert out == f"__main__ ['ok'] yes {tmp_path}\nsession False\natexit\n"
    assert proc.pid != os.getpid()


def test_exit_status_uncaught_exception_and_sys_exit(zygote: Zygote, script: Path) -> None:
    rc, out = zygote.run([script, "raise"], child_env(), 60)
    assert rc == 1
    assert "Traceback" in out and out.rstrip().endswith("ValueError: boom\natexit")
    rc, out = zygote.run([script, "exit"], child_env(), 60)
    assert rc == 3 and out.endswith("atexit\n")


def test_a_killed_child_reports_the_signal_and_a_session_of_its_own(
    zygote: Zygote, script: Path
) -> None:
    proc = zygote.spawn(
        [script, "hang"], child_env(), stdout=subprocess.PIPE, start_new_session=True
    )
    assert proc.stdout is not None
    proc.stdout.readline()
    assert proc.stdout.readline() == "session True\n"
    assert proc.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(60)
    assert proc.returncode == -signal.SIGKILL


def test_closing_the_server_ends_what_it_started(script: Path, tmp_path: Path) -> None:
    with Zygote([], child_env()) as z, open(tmp_path / "log", "w") as log:
        proc = z.spawn([script, "hang"], child_env(), stdout=log)

        def started() -> bool:
            assert proc.poll() is None
            return "session" in (tmp_path / "log").read_text()

        wait_for(started, 120, 0.01, "the child to write its session")
    assert not psutil.pid_exists(proc.pid)


def test_kill_goes_through_the_server_and_is_harmless_once_the_child_ended(
    zygote: Zygote, script: Path
) -> None:
    """Popen.kill never signals a pid its child no longer holds; neither may this: the server
    reaps children as they end, so the pid could already belong to someone else."""
    done = zygote.spawn([script, "ok"], child_env(), stdout=subprocess.DEVNULL)
    # ended and reaped, its status not yet read here
    wait_for(lambda: not psutil.pid_exists(done.pid), 60, 0.01, f"pid {done.pid} reaped")
    done.kill()  # no ProcessLookupError, and no signal to whoever has the pid now
    assert done.wait(60) == 0
    hanging = zygote.spawn([script, "hang"], child_env(), stdout=subprocess.PIPE)
    assert hanging.stdout is not None
    hanging.stdout.readline()
    hanging.kill()
    assert hanging.wait(60) == -signal.SIGKILL


def test_a_kill_sent_while_the_child_is_reaped_never_loses_its_status(
    zygote: Zygote, script: Path
) -> None:
    """A test that SIGKILLs its child itself and then, in ``finally``, polls and kills it
    through the server can send "signal 9" while the server reaps it: the server once closed
    the connection with that message unread, the kernel reset it, and the client's next read
    failed with ECONNRESET before the exit status queued for it (seen in CI, test_starting).
    The same steps, many times: every status must arrive."""
    for _ in range(400):
        proc = zygote.spawn([script, "hang"], child_env(), stdout=subprocess.PIPE)
        assert proc.stdout is not None
        proc.stdout.readline()
        os.kill(proc.pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
        assert proc.wait(60) == -signal.SIGKILL
        proc.stdout.close()
