"""Checkpoint locations to watch, whether declared in the config file or announced by a
running ``trainguard.Run`` in its heartbeat."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from trainguard.config import DEFAULT_CHECKPOINT_PATTERN, Config

PRIMARY = "primary"


@dataclass(frozen=True)
class CheckpointTarget:
    run: str
    location: str  # "primary" or a mirror's name
    path: Path
    pattern: str = DEFAULT_CHECKPOINT_PATTERN
    refused: str | None = None  # why this location is not read (see runtable.announced_dir_problem)
    trust_unrecorded: bool = False  # see CheckpointLocations.trust_unrecorded


def config_targets(config: Config) -> list[CheckpointTarget]:
    targets: list[CheckpointTarget] = []
    for run in config.runs:
        ck = run.checkpoints
        if ck is None:
            continue
        if ck.primary is not None:
            targets.append(
                CheckpointTarget(
                    run.name, PRIMARY, ck.primary, ck.pattern, trust_unrecorded=ck.trust_unrecorded
                )
            )
        for name, path in sorted(ck.mirrors.items()):
            targets.append(
                CheckpointTarget(
                    run.name, name, path, ck.pattern, trust_unrecorded=ck.trust_unrecorded
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
