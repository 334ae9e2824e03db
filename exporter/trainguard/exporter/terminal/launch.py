"""``trainguard launch``: start a training command that outlives the terminal that started it.

It outlives the terminal, the SSH session and the shell that started it (the field report's run died
when its SSH session closed): a new session (no controlling terminal, so no SIGHUP when the terminal
closes; its own process group, so a kill of the shell's group does not reach it), stdin from
/dev/null, stdout and stderr appended to a log file, the pid written to a pid file. The launcher
exits at once; the run is reparented to init (or the nearest subreaper), outside the caller's
tree.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

# RUN_ENV: the run's name for the training script, ``trainguard.Run(os.environ["TRAINGUARD_RUN"])``
# (the framework callbacks read it themselves)
from trainguard.shared.statedir import RUN_ENV, STATE_DIR_ENV

WINDOWS_HELP = (
    "not supported on Windows (no sessions nor SIGHUP to escape); run it "
    "inside WSL, or start the command detached with PowerShell: Start-Process -WindowStyle "
    "Hidden -FilePath python -ArgumentList 'train.py' -RedirectStandardOutput train.log "
    "-RedirectStandardError train.err"
)


class LaunchError(Exception):
    pass


def launch(
    command: Sequence[str],
    *,
    name: str | None,
    log: Path,
    pid_file: Path | None,
    state_dir: Path | None,
) -> int:
    """Start ``command`` detached; its pid."""
    if os.name == "nt":
        raise LaunchError(WINDOWS_HELP)
    if not command:
        raise LaunchError("no command given (put it after --)")
    env = dict(os.environ)
    if name:
        env[RUN_ENV] = name
    if state_dir is not None:
        env[STATE_DIR_ENV] = str(state_dir.expanduser().resolve())
    try:
        out = open(log, "ab", buffering=0)  # noqa: SIM115 - handed to the child, closed below
    except OSError as exc:
        raise LaunchError(f"log file {log}: cannot open: {exc.strerror or exc}") from exc
    try:
        with open(os.devnull, "rb") as devnull:
            proc = subprocess.Popen(
                list(command),
                stdin=devnull,
                stdout=out,
                stderr=out,
                env=env,
                start_new_session=True,  # setsid(): no controlling terminal, own group
                close_fds=True,
            )
    except FileNotFoundError as exc:
        raise LaunchError(f"cannot execute {command[0]!r}: command not found") from exc
    except PermissionError as exc:
        raise LaunchError(f"cannot execute {command[0]!r}: permission denied") from exc
    except OSError as exc:
        raise LaunchError(f"cannot execute {command[0]!r}: {exc.strerror or exc}") from exc
    finally:
        out.close()
    # the launcher exits without waiting: the child is reparented and reaped by init
    proc.returncode = 0  # no ResourceWarning for a child deliberately left running
    if pid_file is not None:
        tmp = pid_file.with_name(f".{pid_file.name}.tmp")
        try:
            tmp.write_text(f"{proc.pid}\n")
            os.replace(tmp, pid_file)
        except OSError as exc:
            raise LaunchError(
                f"started pid {proc.pid}, but pid file {pid_file}: {exc.strerror or exc}"
            ) from exc
    return proc.pid


def follow_hint(pid: int, name: str | None, log: Path, state_dir: Path | None) -> str:
    status = "trainguard status"
    if state_dir is not None:
        status += f" --state.dir {shlex.quote(str(state_dir))}"
    what = f"run {name!r}" if name else "command"
    return (
        f"started {what} as pid {pid} in a session of its own; it survives this terminal\n"
        f"  follow:  tail -f {shlex.quote(str(log))}\n"
        f"  status:  {status}\n"
        f"  stop:    kill {pid}\n"
    )


def main_launch(
    command: Sequence[str],
    name: str | None,
    log: Path | None,
    pid_file: Path | None,
    state_dir: Path | None,
) -> int:
    log = log or Path(f"{name or 'trainguard-run'}.log")
    try:
        pid = launch(command, name=name, log=log, pid_file=pid_file, state_dir=state_dir)
    except LaunchError as exc:
        print(f"trainguard launch: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(follow_hint(pid, name, log.resolve(), state_dir))
    return 0
