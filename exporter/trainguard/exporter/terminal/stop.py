"""``trainguard stop RUN``: stop a run on purpose, so that its end does not page.

A caught SIGTERM reads the same whoever sent it (a Python handler never sees the sender), so a
run stopped with ``kill`` warns (TrainingProcessTerminated) and, not restarted, pages
(TrainingProcessDied) as a preempted run nobody restarts must. This command is the sender that
says who it is: for each live rank of the run on this host it first writes a stop record naming
that very process (pid, create time, boot) next to the rank's heartbeat, then sends it the
signal, so that the exporter publishes its end as ``trainguard_run_exit_info{cause="on_purpose"}``
and no rule pages for it, provided it ends within ``--within`` (a record never covers a
process that runs on and crashes later). The signal goes through a pidfd opened before the
process is checked (Linux), so a pid reused meanwhile is never signalled; elsewhere the check
comes just before ``kill``. It then waits, up to ``--timeout``, for each process to end (a
SIGTERM handler may save a checkpoint first), and says what happened.

With ``--no-signal`` it only records, for a run that the person then stops by other means. The
ranks of a job of many nodes die in any order once one is gone (a collective fails), and each
is covered only if its node recorded the stop before: record on every node first (``srun
--jobid=JOB --overlap --ntasks-per-node=1 trainguard stop RUN --no-signal``), then ``scancel
JOB``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeAlias

from trainguard.exporter.config.model import Config, ConfigError, load_config, resolve_state_dir
from trainguard.exporter.runs.rows import RunRow
from trainguard.exporter.runs.table import RunTable
from trainguard.shared import procinfo
from trainguard.shared.heartbeat.record import check_run_name
from trainguard.shared.stops import StopRecord, stop_filename, write_stop
from trainguard.shared.units import format_duration

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

#: the signals it may send, where the platform has them (no SIGHUP on Windows)
SIGNALS = tuple(name for name in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, name))
POLL = 0.05
#: how long a SIGKILLed process (--kill) is waited for: the kernel ends it at once
KILL_WAIT = 10.0

EPILOG = (
    "Exit status: 0 when every live rank of the run on this host was stopped and has ended "
    "(--no-signal: its stop recorded); 1 when one was not (still running at the deadline, no "
    "permission to signal it, alive or dead unknown) or the run has no live rank here; 2 on "
    "bad input. A job of many nodes: record on every node first, then cancel it, e.g. srun "
    "--jobid=JOB --overlap --ntasks-per-node=1 trainguard stop RUN --no-signal && scancel JOB "
    "(each node's state dir: TRAINGUARD_STATE_DIR or --state.dir). A rank not recorded (and a "
    "job scancel-ed without it) pages as stopped by a signal, as a preemption does; a rank "
    "relaunched later, or still running after --within, is judged afresh."
)


def add_parser(sub: Subparsers, duration: type | object) -> None:
    """``trainguard stop``'s arguments (``duration``: the terminal's duration parser)."""
    s = sub.add_parser(
        "stop",
        help="stop a run on purpose (SIGTERM), so that its end does not page",
        description=(__doc__ or "").split("\n\n", 1)[1],
        epilog=EPILOG,
    )
    s.add_argument("run", metavar="RUN", help="the run's name, as passed to trainguard.Run")
    s.add_argument("--state.dir", dest="state_dir", metavar="DIR", help="heartbeat directory")
    s.add_argument("--config.file", dest="config_file", metavar="FILE", help="exporter config")
    s.add_argument(
        "--signal",
        default="SIGTERM",
        choices=SIGNALS,
        help="the signal to send (default: %(default)s)",
    )
    s.add_argument(
        "--timeout",
        type=duration,  # type: ignore[arg-type]
        default=120.0,
        metavar="DURATION",
        help="wait this long for the processes to end (default: 2m)",
    )
    s.add_argument(
        "--kill",
        action="store_true",
        help="send SIGKILL to a process still running at the deadline",
    )
    s.add_argument(
        "--within",
        type=duration,  # type: ignore[arg-type]
        default=600.0,
        metavar="DURATION",
        help="a process that ends later than this after the command is not covered: its end "
        "pages as if nobody had said anything (default: 10m; at least --timeout)",
    )
    s.add_argument(
        "--no-signal",
        action="store_true",
        help="record the stop only, send nothing: stop the run yourself (scancel, kubectl "
        "delete pod, Ctrl-C) within --within",
    )


@dataclass
class Target:
    """A live rank to stop: its row, the pid to signal here, and its pidfd where there is one."""

    row: RunRow
    pid: int
    pidfd: int | None = None
    ended_after: float | None = None
    problem: str | None = None


@dataclass
class Outcome:
    stopped: list[Target] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # why each other rank was not stopped
    unknown: int = 0  # ranks that may be alive but cannot be stopped from here


def _same_process(row: RunRow, pid: int) -> bool | None:
    """Whether ``pid`` (this host's number) is still the process that wrote the row's heartbeat."""
    hb = row.heartbeat
    assert hb is not None
    here = procinfo.same_boot(hb.boot_id, hb.boot_time, procinfo.boot_id(), procinfo.boot_time())
    exact = pid == hb.pid and here is True and procinfo.ticks_comparable()
    return procinfo.process_alive(pid, hb.create_time, hb.start_ticks if exact else None)


def _open_pidfd(pid: int) -> int | None:
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        return int(opener(pid))
    except OSError:
        return None  # an old kernel, or gone (the check that follows says which)


def _send(target: Target, signum: int) -> str | None:
    """Send ``signum`` to the target's process if it is still that process; why not, else None."""
    if _same_process(target.row, target.pid) is not True:
        return "gone before the signal"
    send = getattr(signal, "pidfd_send_signal", None)
    try:
        if target.pidfd is not None and send is not None:
            send(target.pidfd, signum)
        else:
            os.kill(target.pid, signum)
    except ProcessLookupError:
        return "gone before the signal"
    except PermissionError:
        return f"no permission to signal pid {target.pid} (another user's process: run as them)"
    except OSError as exc:
        return f"pid {target.pid}: {exc.strerror or exc}"
    return None


def choose(config: Config, state_dir: Path, run: str) -> Outcome:
    """The run's live ranks on this host, and why each other rank is left alone."""
    out = Outcome()
    for row in RunTable(config, state_dir).view().rows:
        if row.run != run or row.heartbeat is None:
            continue
        if row.finished:
            out.skipped.append(f"rank {row.rank} already finished")
        elif row.up is False:
            out.skipped.append(
                f"rank {row.rank} already ended (pid {row.pid}): a stop cannot be said after "
                f"the fact; `trainguard retire {run}` forgets the run"
            )
        elif row.up is None or not row.pids:
            out.unknown += 1
            out.skipped.append(
                f"rank {row.rank}: cannot tell whether pid {row.pid} is alive from here "
                "(another pid namespace): run trainguard stop where it runs"
            )
        else:
            out.stopped.append(Target(row, row.pids[0]))
    return out


def record(state_dir: Path, targets: list[Target], sig: str, within: float) -> None:
    """Write each target's stop record (``sig`` empty: we send none), before any is signalled.

    The ranks of one run on a host may end in any order once the first is gone, and each is
    covered only by its own record.
    """
    now = time.time()
    for t in targets:
        hb = t.row.heartbeat
        assert hb is not None
        rec = StopRecord(
            hb.run, hb.rank, hb.pid, hb.create_time, hb.boot_id, now, now + within, sig
        )
        try:
            write_stop(state_dir, rec)
        except OSError as exc:
            t.problem = f"cannot write the stop record: {exc.strerror or exc}; not signalled"


def stop(
    state_dir: Path, targets: list[Target], sig: str, timeout: float, within: float, kill: bool
) -> None:
    """Record the stop of each target, signal it, and wait for it to end (see the module)."""
    signum = int(getattr(signal, sig))
    started = time.monotonic()
    for t in targets:
        t.pidfd = _open_pidfd(t.pid)  # before the check in _send: never a pid reused since
    record(state_dir, targets, sig, within + (KILL_WAIT if kill else 0.0))
    for t in targets:
        if t.problem is None:
            t.problem = _send(t, signum)
            if t.problem is not None:  # not stopped by us: its end is not ours to explain
                with contextlib.suppress(OSError):
                    os.unlink(state_dir / stop_filename(t.row.run, int(t.row.rank)))
    _wait([t for t in targets if t.problem is None], started, timeout)
    if kill:
        late = [t for t in targets if t.problem is None and t.ended_after is None]
        for t in late:
            why = _send(t, signal.SIGKILL)
            if why is not None and why != "gone before the signal":
                t.problem = why
        again = time.monotonic() - started + KILL_WAIT
        _wait([t for t in late if t.problem is None], started, again)
    for t in targets:
        if t.pidfd is not None:
            os.close(t.pidfd)


def _wait(targets: list[Target], started: float, timeout: float) -> None:
    deadline = started + timeout
    while True:
        for t in targets:
            if t.ended_after is None and _same_process(t.row, t.pid) is not True:
                t.ended_after = time.monotonic() - started
        if all(t.ended_after is not None for t in targets) or time.monotonic() >= deadline:
            return
        time.sleep(POLL)


def main(args: argparse.Namespace) -> int:
    problem = check_run_name(args.run)
    if problem:
        return _bad(f"RUN: {problem}")
    if not 0 < args.timeout <= 86400:
        return _bad("--timeout: expected a duration above 0 and at most 1d")
    if not args.timeout <= args.within <= 7 * 86400:
        return _bad("--within: expected at least --timeout and at most 7d")
    try:
        config = load_config(args.config_file)
    except ConfigError as exc:
        return _bad(str(exc))
    state_dir = resolve_state_dir(args.state_dir, config)
    if not state_dir.is_dir():
        return _bad(f"state dir {state_dir}: does not exist")
    chosen = choose(config, state_dir, args.run)
    for why in chosen.skipped:
        print(f"trainguard stop: {why}", file=sys.stderr)
    if not chosen.stopped:
        if any(rc.name == args.run for rc in config.runs) and not chosen.skipped:
            print(
                f"trainguard stop: run {args.run!r} is declared in the config file and writes "
                "no heartbeat: stop it yourself, then remove its pid file",
                file=sys.stderr,
            )
        elif not chosen.skipped:
            print(
                f"trainguard stop: no heartbeat of run {args.run!r} in {state_dir}",
                file=sys.stderr,
            )
        return 1
    if args.no_signal:
        record(state_dir, chosen.stopped, "", args.within)
    else:
        ranks = ", ".join(f"rank {t.row.rank} (pid {t.pid})" for t in chosen.stopped)
        if any(_launcher(t) == "torchrun" for t in chosen.stopped):
            print(
                "trainguard stop: these are torchrun's workers: with --max-restarts it starts "
                "them again, as new processes no record covers; to end the run, record with "
                "--no-signal and stop torchrun itself",
                file=sys.stderr,
            )
        print(f"stopping run {args.run!r} on this host: {args.signal} to {ranks}")
        stop(state_dir, chosen.stopped, args.signal, args.timeout, args.within, args.kill)
    ok = _report(chosen.stopped, args)
    return 0 if ok and not chosen.unknown else 1


def _launcher(t: Target) -> str | None:
    hb = t.row.heartbeat
    return hb.job.launcher if hb is not None and hb.job is not None else None


def _bad(message: str) -> int:
    print(f"trainguard stop: {message}", file=sys.stderr)
    return 2


def _report(targets: list[Target], args: argparse.Namespace) -> bool:
    """Say what became of each target; whether all went as asked."""
    ok = True
    within = format_duration(args.within)
    for t in targets:
        label = f"rank {t.row.rank} (pid {t.pid})"
        if t.problem is not None:
            ok = False
            print(f"trainguard stop: {label}: {t.problem}", file=sys.stderr)
        elif args.no_signal:
            print(f"{label}: recorded as stopped on purpose")
        elif t.ended_after is None:
            ok = False
            print(
                f"trainguard stop: {label} still running after "
                f"{format_duration(args.timeout)} (saving a checkpoint?): wait, or run again "
                f"with --kill; its end counts as on purpose if it comes within {within}",
                file=sys.stderr,
            )
        else:
            print(f"{label} ended after {t.ended_after:.1f} s")
    if args.no_signal and ok:
        print(
            f"now stop run {args.run!r} (scancel, kubectl delete pod, Ctrl-C) within {within}: "
            "its end then does not page; a process still running by then is judged as if "
            "nothing had been said"
        )
    elif any(t.problem is None for t in targets):
        print(
            "recorded as stopped on purpose: its end does not page (exit cause on_purpose); "
            f"`trainguard retire {args.run}` forgets the run"
        )
    return ok
