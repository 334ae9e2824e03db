"""Settled single-file checkpoints with their records, as ``checkpoint.save`` leaves them.

For the golden /metrics test and the scrape benchmark, which both need a fixed checkpoint state
the collector judges at once: files older than the grace period, each with its record, and a
mirror whose newest copy is cut short (the case the collector exists to catch).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Sequence
from pathlib import Path

from trainguard.shared.manifest import MANIFEST_DIR, Record, record_path


def write_settled_checkpoints(
    directory: Path, steps: Sequence[int], *, mirror_of: Path | None, age: float, payload: int
) -> float:
    """Write ``step_<N>.pt`` for each step, ``payload`` bytes and recorded, ``age`` seconds old.

    A mirror (``mirror_of`` the primary) gets its newest copy cut to half its recorded size.
    Returns the files' mtime.
    """
    (directory / MANIFEST_DIR).mkdir(parents=True, exist_ok=True)
    old = time.time() - age
    for i, step in enumerate(steps):
        name = f"step_{step}.pt"
        data = step.to_bytes(8, "little") * (payload // 8)
        path = directory / name
        truncated = mirror_of is not None and i == len(steps) - 1
        path.write_bytes(data[: payload // 2] if truncated else data)
        rec = Record(
            name=name,
            step=step,
            size=payload,
            sha256=hashlib.sha256(data).hexdigest(),
            written=old,
            source=str(mirror_of / name) if mirror_of else None,
        )
        record_path(directory, name).write_bytes(rec.encode())
        os.utime(path, (old, old))
    return old
