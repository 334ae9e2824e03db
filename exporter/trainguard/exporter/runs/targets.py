"""Checkpoint locations to watch, from the config file or a running run's heartbeat.

A location is either declared in the config file or announced by a running ``trainguard.Run``
in its heartbeat.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from trainguard.exporter.config.model import Config
from trainguard.shared.pattern import DEFAULT_CHECKPOINT_PATTERN
from trainguard.shared.steps import DEFAULT_LAYOUT

PRIMARY = "primary"


@dataclass(frozen=True)
class CheckpointTarget:
    run: str
    location: str  # "primary" or a mirror's name
    path: Path
    pattern: str = DEFAULT_CHECKPOINT_PATTERN
    #: uid that owns the heartbeat that announced it, which must own the directory too (see
    #: :func:`ownership_problem`); None for a location from the config file
    owner: int | None = None
    trust_unrecorded: bool = False  # see CheckpointLocations.trust_unrecorded
    layout: str = DEFAULT_LAYOUT  # how step directories are committed (shared.steps.LAYOUTS)


def config_targets(config: Config) -> list[CheckpointTarget]:
    targets: list[CheckpointTarget] = []
    for run in config.runs:
        ck = run.checkpoints
        if ck is None:
            continue
        if ck.primary is not None:
            targets.append(
                CheckpointTarget(
                    run.name,
                    PRIMARY,
                    ck.primary,
                    ck.pattern,
                    trust_unrecorded=ck.trust_unrecorded,
                    layout=ck.layout,
                )
            )
        for name, path in sorted(ck.mirrors.items()):
            targets.append(
                CheckpointTarget(
                    run.name,
                    name,
                    path,
                    ck.pattern,
                    trust_unrecorded=ck.trust_unrecorded,
                    layout=ck.layout,
                )
            )
    return targets


def merge_targets(*sources: Iterable[CheckpointTarget]) -> list[CheckpointTarget]:
    """One target per (run, location): the first source wins (config before heartbeats)."""
    seen: dict[tuple[str, str], CheckpointTarget] = {}
    for source in sources:
        for t in source:
            seen.setdefault((t.run, t.location), t)
    return list(seen.values())


def ownership_problem(st: os.stat_result, owner: int | None, what: str) -> str | None:
    """Why an announced ``what`` with stat ``st`` is not watched; None when it is.

    ``what`` is a checkpoint directory or a log file, announced in a heartbeat owned by uid
    ``owner``. Whoever can write the state directory can announce any path, and the exporter
    (often root) would then list it, stat its files and hash them, and publish modification
    times: it is watched only when the heartbeat's owner owns it too, or the heartbeat is
    root's. ``owner`` None (declared in the config file) is always watched. Checked on the stat
    of what is actually read (an open directory's fstat), so that swapping the path after the
    check changes nothing.
    """
    if owner is None or owner == 0 or not hasattr(os, "getuid") or st.st_uid == owner:
        return None
    return (
        f"not watched: announced in a heartbeat owned by uid {owner}, but the {what} is owned "
        f"by uid {st.st_uid}; declare it in the config file to watch it"
    )
