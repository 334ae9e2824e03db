"""``trainguard``: the terminal command for the person running the training.

Its subcommands (status, verify, launch, snapshot) are built on the exporter's own run table,
checkpoint verdict and GPU collector. This is the only module that imports ``rich``; nothing of
the training side imports it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeAlias

from trainguard._version import __version__
from trainguard.exporter.config.model import ConfigError, load_config
from trainguard.exporter.terminal import retire, stop
from trainguard.exporter.terminal.restore import command as restore
from trainguard.shared.units import parse_duration

EPILOG_VERIFY = (
    "Exit status: 0 when the newest checkpoint is complete (a resume can go ahead), 1 when it "
    "is not (or there is none), 2 on bad input. Verdicts: complete, truncated, oversized, hash "
    "mismatch (--hash), unrecorded, in flight, orphaned .part, unknown mtime. Step "
    "directories (one directory per step, as frameworks write them: give their name as "
    "--pattern, e.g. 'checkpoint-{step}') are one item each, shown as 'checkpoint-500/' and "
    "judged as a whole: committed by their trainguard record or by their framework's marker "
    "(the layout is detected from the location, as the exporter's layout: auto does), "
    "complete once every file has its recorded size (committed by a marker only: once every "
    "file has the length its own format gives, safetensors, torch zips and JSON, else once "
    "nothing under it was touched for --grace); --hash checks every file. An uncommitted one "
    "is in flight, or an orphaned .part after --grace. PATH may also be one step directory. "
    "When nothing matches --pattern but a framework's names are there, a hint names the "
    "pattern that finds them."
)


def _duration(value: str) -> float:
    """A duration flag, in the one grammar of the config file and the alert thresholds."""
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    """The ``trainguard`` command's parser: one subcommand each, added by its own function."""
    p = argparse.ArgumentParser(
        prog="trainguard",
        description="trainguard at the terminal: the runs of this host, checkpoint verdicts, "
        "and launching a run that survives the terminal.",
    )
    p.add_argument("--version", action="version", version=f"trainguard {__version__}")
    sub = p.add_subparsers(
        dest="command", required=True, metavar="{status,verify,launch,snapshot,stop,retire}"
    )
    _add_status(sub)
    _add_verify(sub)
    _add_launch(sub)
    _add_snapshot(sub)
    stop.add_parser(sub, _duration)
    retire.add_parser(sub)
    return p


#: what ``add_subparsers`` returns
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _add_status(sub: Subparsers) -> None:
    s = sub.add_parser(
        "status",
        help="the runs this host knows",
        description=_status_doc(),
        epilog="Exit status: 0 when every run is alive, starting, finished, or stopping or "
        "stopped by trainguard stop, and every heartbeat could be read; 1 when a run is dead, "
        "stalled, unknown or stepping on a NaN loss (nan-loss), or something could not be "
        "read (listed as error:); 2 on bad input "
        "(and an unreadable state directory). --watch exits 0 on Ctrl-C.",
    )
    s.add_argument("--state.dir", dest="state_dir", metavar="DIR", help="heartbeat directory")
    s.add_argument("--config.file", dest="config_file", metavar="FILE", help="exporter config")
    s.add_argument(
        "--stall",
        type=_duration,
        default=600.0,
        metavar="DURATION",
        help="alive without a new step this long is stalled (default: 10m)",
    )
    s.add_argument(
        "--sample",
        type=_duration,
        default=2.0,
        metavar="DURATION",
        help="read twice this far apart for steps/s; 0: no rate (default: 2s)",
    )
    s.add_argument(
        "--watch",
        action="store_true",
        help="refresh until Ctrl-C: in place on a terminal, appended when piped, one JSON "
        "line per refresh with --json",
    )
    s.add_argument(
        "--interval",
        type=_duration,
        default=2.0,
        metavar="DURATION",
        help="--watch refresh interval (default: 2s)",
    )
    s.add_argument("--json", action="store_true", help="JSON for scripts")


def _add_verify(sub: Subparsers) -> None:
    v = sub.add_parser(
        "verify",
        help="checkpoint verdicts of a location or one checkpoint file",
        description="Each checkpoint of a location (or one checkpoint file) with its verdict, "
        "and which one trainguard.checkpoint.latest() would resume from.",
        epilog=EPILOG_VERIFY + " " + restore.EPILOG,
    )
    v.add_argument("path", type=Path, metavar="PATH")
    v.add_argument(
        "--primary",
        type=Path,
        metavar="DIR",
        help="PATH is a mirror of DIR: check it against DIR's records",
    )
    v.add_argument(
        "--pattern",
        default="step_{step}",
        metavar="P",
        help="checkpoint name pattern: {step} the step, {name} any other value, * any text, e.g. "
        "'epoch={epoch}-step={step}.ckpt' (docs/checkpoints.md#checkpoint-names; "
        "default: %(default)s)",
    )
    v.add_argument(
        "--grace",
        type=_duration,
        default=300.0,
        metavar="DURATION",
        help="a file touched more recently may still be written (default: 5m)",
    )
    v.add_argument("--hash", action="store_true", help="verify content against the SHA-256")
    v.add_argument("--json", action="store_true", help="JSON for scripts")
    restore.add_arguments(v, _duration)


def _add_launch(sub: Subparsers) -> None:
    la = sub.add_parser(
        "launch",
        help="start a training command that survives the terminal",
        description="Start COMMAND detached: a new session (setsid), stdin from /dev/null, "
        "output appended to the log; closing the terminal, logging out or killing this shell "
        "leaves it running. The run's name is passed as $TRAINGUARD_RUN (pass it to "
        "trainguard.Run yourself), the state dir as $TRAINGUARD_STATE_DIR. Not on Windows: "
        "use WSL, or PowerShell's Start-Process -WindowStyle Hidden with "
        "-RedirectStandardOutput.",
    )
    la.add_argument("--name", metavar="RUN", help="the run's name ($TRAINGUARD_RUN)")
    la.add_argument(
        "--log",
        type=Path,
        metavar="FILE",
        help="stdout and stderr appended here (default: RUN.log)",
    )
    la.add_argument("--pid-file", type=Path, metavar="FILE", help="write the pid here")
    la.add_argument(
        "--state.dir",
        dest="state_dir",
        type=Path,
        metavar="DIR",
        help="set $TRAINGUARD_STATE_DIR for the run",
    )
    la.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND...")


def _add_snapshot(sub: Subparsers) -> None:
    sn = sub.add_parser(
        "snapshot",
        help="ask a live run for a CUDA memory snapshot now",
        description="Ask the live process of RUN (started with trainguard.Run(..., "
        "oom_snapshots=True)) for a CUDA memory snapshot, without restarting it: its reporter "
        "dumps one next to its heartbeat (<name>-<hash>.rank<N>.requested-<n>.pickle, with a "
        ".json of metadata) and this command prints where. Open it at "
        "https://pytorch.org/memory_viz.",
        epilog="Exit status: 0 when the snapshot was written, 1 when the run could not take "
        "one (gone, finished, no CUDA, no reply in time), 2 on bad input. The run takes at "
        "most one requested snapshot every 30 seconds and keeps its newest snapshot_keep.",
    )
    sn.add_argument("run", metavar="RUN", help="the run's name, as passed to trainguard.Run")
    sn.add_argument("--rank", type=int, default=0, metavar="N", help="the rank (default: 0)")
    sn.add_argument("--state.dir", dest="state_dir", metavar="DIR", help="heartbeat directory")
    sn.add_argument("--config.file", dest="config_file", metavar="FILE", help="exporter config")
    sn.add_argument(
        "--timeout",
        type=_duration,
        default=60.0,
        metavar="DURATION",
        help="wait this long for the run's reply (default: 60s)",
    )
    sn.add_argument("--json", action="store_true", help="JSON for scripts")


def _status_doc() -> str:
    from trainguard.exporter.terminal.status import command as status

    return (status.__doc__ or "").split("\n\n", 1)[1]


def _console(stderr: bool = False) -> Any:
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


def _fail(command: str, message: str) -> int:
    print(f"trainguard {command}: {message}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "status":
            return _status(args)
        if args.command == "verify":
            return restore.main_restore(args) if args.restore else _verify(args)
        if args.command == "snapshot":
            return _snapshot(args)
        if args.command == "stop":
            return stop.main(args)
        if args.command == "retire":
            return retire.main(args)
        from trainguard.exporter.terminal.launch import main_launch

        cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
        return main_launch(cmd, args.name, args.log, args.pid_file, args.state_dir)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 1


def _status(args: argparse.Namespace) -> int:
    from trainguard.exporter.config.model import resolve_state_dir
    from trainguard.exporter.terminal.status import checkpoints as sc
    from trainguard.exporter.terminal.status import command as st

    try:
        config = load_config(args.config_file)
    except ConfigError as exc:
        return _fail("status", str(exc))
    state_dir = resolve_state_dir(args.state_dir, config)
    problem = st.state_dir_problem(state_dir, explicit=bool(args.state_dir))
    if problem:
        return _fail("status", problem)
    status = st.Status(config, state_dir, args.stall)
    try:
        if args.watch and args.json:
            st.watch_json(status, args.interval, sys.stdout)
            return 0
        if args.watch:
            if _console().is_terminal:
                st.watch(status, args.interval, st.rich_view)
            else:
                st.watch_plain(status, args.interval, sys.stdout)
            return 0
        snap = status.read(checkpoints=False)
        # the rate's second read comes --sample after the first; checkpoints are judged meanwhile
        sample = args.sample if any(r.state in ("alive", "stalled") for r in snap.runs) else 0.0
        with sc.Progress() as progress:
            found = sc.judged_while_waiting(lambda: sc.judge_all(status.targets, progress), sample)
        if sample > 0:
            snap = status.read(checkpoints=False)
        status.attach(snap, found)
    except st.StateDirError as exc:
        return _fail("status", str(exc))
    finally:
        status.close()
    if args.json:
        print(json.dumps(snap.to_json(), indent=2))
        return st.exit_status(snap)
    console = _console()
    if console.is_terminal:
        console.print(st.rich_view(snap))
    else:
        sys.stdout.write(st.plain(snap))
    return st.exit_status(snap)


def _verify(args: argparse.Namespace) -> int:
    from trainguard.exporter.terminal import verify as vf
    from trainguard.shared.manifest import ManifestError

    progress_cm: Any = None
    hook = None
    if args.hash:
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        err = _console(stderr=True)
        progress_cm = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(binary_units=True),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=err,
            disable=not err.is_terminal,
            transient=True,
        )

        def hook(name: str, total: int) -> Callable[[int], None]:
            task = progress_cm.add_task(f"sha256 {name}", total=total)
            return lambda done: progress_cm.update(task, completed=done)

        progress_cm.start()
    try:
        report = vf.verify(
            args.path,
            primary=args.primary,
            pattern=args.pattern,
            grace=args.grace,
            check_hash=args.hash,
            progress=hook,
        )
    except (OSError, ValueError, ManifestError) as exc:
        msg = (
            str(exc)
            if not isinstance(exc, OSError) or not exc.strerror
            else (f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror)
        )
        return _fail("verify", msg)
    finally:
        if progress_cm is not None:
            progress_cm.stop()
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        console = _console()
        if console.is_terminal:
            console.print(vf.rich_view(report))
        else:
            sys.stdout.write(vf.plain(report))
    return 0 if report.ok else 1


def _snapshot(args: argparse.Namespace) -> int:
    from trainguard.exporter.config.model import resolve_state_dir
    from trainguard.exporter.terminal import snapshot as sn
    from trainguard.shared.heartbeat.record import MAX_RANK, check_run_name

    problem = check_run_name(args.run)
    if problem:
        return _fail("snapshot", f"RUN: {problem}")
    if not 0 <= args.rank <= MAX_RANK:
        return _fail("snapshot", f"--rank: expected 0..{MAX_RANK}, got {args.rank}")
    if not 0 < args.timeout <= 86400:
        return _fail("snapshot", "--timeout: expected a duration above 0 and at most 1d")
    try:
        config = load_config(args.config_file)
    except ConfigError as exc:
        return _fail("snapshot", str(exc))
    state_dir = Path(resolve_state_dir(args.state_dir, config))
    try:
        taken = sn.request_snapshot(state_dir, args.run, args.rank, args.timeout)
    except sn.SnapshotError as exc:
        if args.json:
            print(json.dumps({"ok": False, "error": str(exc)}))
        print(f"trainguard snapshot: {exc}", file=sys.stderr)
        return 1
    if args.json:
        doc = {
            "ok": True,
            "snapshot": str(taken.snapshot),
            "metadata": str(taken.metadata),
            "step": taken.step,
        }
        print(json.dumps(doc))
        return 0
    step = "" if taken.step is None else f" at step {taken.step}"
    print(f"memory snapshot{step}: {taken.snapshot}")
    print(f"metadata: {taken.metadata}")
    print("open it at https://pytorch.org/memory_viz")
    return 0
