"""``trainguard retire RUN``: a run stopped on purpose stops paging.

TrainingProcessDied pages for a rank whose process is gone without a clean finish until it is
relaunched or its heartbeat passes ``run_retention`` (7 days): right for a crash, and for a
preempted job that nobody restarts, but a person who stopped a run on purpose (SIGTERM,
``scancel``) and will not restart it needs a way to say it is over. Retiring removes the run's
heartbeat files from this host's state directory, so the exporter no longer knows the run and
its alerts resolve. A run with a live process is refused: its reporter would write its heartbeat
again at once, and a live run is no run to forget. Nothing else is touched: its checkpoints,
memory snapshots and log stay.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeAlias

from trainguard.exporter.config.model import Config, ConfigError, load_config, resolve_state_dir
from trainguard.exporter.runs.table import RunTable
from trainguard.shared.heartbeat.record import check_run_name, heartbeat_filename
from trainguard.shared.stops import stop_filename

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

EPILOG = (
    "Exit status: 0 when the run's heartbeat files were removed, 1 when nothing was (no such "
    "run here, a rank still alive or of unknown state without --force, a file that could not "
    "be removed), 2 on bad input. Run it on every node of a job of many nodes (or once, on a "
    "state directory they share). A relaunch under the same name starts afresh (its death "
    "count from 0)."
)


def add_parser(sub: Subparsers) -> None:
    """``trainguard retire``'s arguments."""
    r = sub.add_parser(
        "retire",
        help="forget a run stopped on purpose, so that it stops paging",
        description=(__doc__ or "").split("\n\n", 1)[1],
        epilog=EPILOG,
    )
    r.add_argument("run", metavar="RUN", help="the run's name, as passed to trainguard.Run")
    r.add_argument("--state.dir", dest="state_dir", metavar="DIR", help="heartbeat directory")
    r.add_argument("--config.file", dest="config_file", metavar="FILE", help="exporter config")
    r.add_argument(
        "--force",
        action="store_true",
        help="retire ranks whose process cannot be told alive or dead (another pid namespace "
        "this host cannot see into); never a rank known alive",
    )


@dataclass
class Retired:
    removed: list[Path] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # why each rank was kept


def retire(config: Config, state_dir: Path, run: str, force: bool) -> Retired:
    """Remove the heartbeat files of ``run``'s ranks that are not alive; say why for the rest."""
    out = Retired()
    for row in RunTable(config, state_dir).view().rows:
        if row.run != run or row.heartbeat is None:
            continue
        if row.up is True and not row.finished:
            out.refused.append(f"rank {row.rank} is alive (pid {row.pid}): stop it first")
            continue
        if row.up is None and not row.finished and not force:
            out.refused.append(
                f"rank {row.rank}: cannot tell whether pid {row.pid} is alive (--force to "
                "retire it anyway)"
            )
            continue
        path = state_dir / heartbeat_filename(run, int(row.rank))
        try:
            os.unlink(path)
        except FileNotFoundError:
            continue  # gone meanwhile: nothing left to retire
        except OSError as exc:
            out.refused.append(f"rank {row.rank}: {path}: {exc.strerror or exc}")
            continue
        out.removed.append(path)
        with contextlib.suppress(OSError):  # trainguard stop's record: about a process now gone
            os.unlink(state_dir / stop_filename(run, int(row.rank)))
    return out


def main(args: argparse.Namespace) -> int:
    problem = check_run_name(args.run)
    if problem:
        print(f"trainguard retire: RUN: {problem}", file=sys.stderr)
        return 2
    try:
        config = load_config(args.config_file)
    except ConfigError as exc:
        print(f"trainguard retire: {exc}", file=sys.stderr)
        return 2
    state_dir = resolve_state_dir(args.state_dir, config)
    if not state_dir.is_dir():
        print(f"trainguard retire: state dir {state_dir}: does not exist", file=sys.stderr)
        return 2
    if any(rc.name == args.run for rc in config.runs):
        print(
            f"trainguard retire: run {args.run!r} is declared in the config file: remove it "
            "there (or its pid file) instead",
            file=sys.stderr,
        )
        return 1
    done = retire(config, state_dir, args.run, args.force)
    for path in done.removed:
        print(f"removed {path}")
    for why in done.refused:
        print(f"trainguard retire: kept {why}", file=sys.stderr)
    if not done.removed and not done.refused:
        print(
            f"trainguard retire: no heartbeat of run {args.run!r} in {state_dir}", file=sys.stderr
        )
        return 1
    if done.removed:
        print(
            f"run {args.run!r} retired on this host: its alerts resolve once Prometheus no "
            "longer sees it (after the alert's keep_firing_for)"
        )
    return 0 if done.removed and not done.refused else 1
