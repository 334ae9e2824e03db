"""Crash-safe checkpoints for training scripts: save, mirror, prune and find the latest.

A checkpoint only gets its final name once it is whole and on disk, its size and SHA-256 are
recorded for the exporter to judge it by, mirrors are checked against that record before they
are published, and pruning never deletes what is being written, copied, or of unknown age.

    from trainguard import checkpoint
    checkpoint.save(model.state_dict(), "/data/ckpt/step_100.pt")   # torch.save, crash-safe
    checkpoint.mirror("/data/ckpt/step_100.pt", "/mnt/backup/ckpt")
    checkpoint.prune("/data/ckpt", keep=12, mirrors=["/mnt/backup/ckpt"])
    state = torch.load(checkpoint.latest("/data/ckpt"))
    with checkpoint.save_dir("/data/ckpt/step-200", pattern="step-{step}") as tmp:
        torch.distributed.checkpoint.save(state, checkpoint_id=tmp)   # a directory per step
    checkpoint.watch_save(dcp.async_save(state, checkpoint_id=path), path)  # counted when done

Every save's outcome (failures by reason, the last success) is counted for the exporter
(``outcomes``; docs/checkpoints.md, "Saves that fail"), also when the script catches the error.

torch is imported only when an object has to go through ``torch.save``. A checkpoint is a
single regular file or a directory per step (written by ``save_dir`` or by a framework, see
docs/checkpoints.md). Locking uses ``flock`` where the platform
has it (POSIX); elsewhere the grace period alone protects files in flight.

Modules, by the verbs they hold: ``save`` (``save``, ``save_dir``), ``mirror`` (``mirror``,
``mirror_dir``), ``retention`` (``prune``, ``latest``), ``outcomes`` (``watch_save``), with
``part`` (the ``.part`` discipline all writers follow) and ``transfer`` (moving and hashing
the bytes) beneath them. The package re-exports the functions under the same names as the
``save`` and ``mirror`` modules, so ``trainguard.checkpoint.save`` is the function: import the
functions from here.
"""

from trainguard.checkpoint.mirror import mirror
from trainguard.checkpoint.outcomes import watch_save
from trainguard.checkpoint.part import CheckpointError
from trainguard.checkpoint.retention import Checkpoint, latest, prune
from trainguard.checkpoint.save import save, save_dir
from trainguard.shared.manifest import Record

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "Record",
    "latest",
    "mirror",
    "prune",
    "save",
    "save_dir",
    "watch_save",
]
