"""Crash-safe checkpoints for training scripts: a checkpoint only gets its final name once it is
whole and on disk, its size and SHA-256 are recorded for the exporter to judge it by, mirrors
are checked against that record before they are published, and pruning never deletes what is
being written, copied, or of unknown age.

    from trainguard import checkpoint
    checkpoint.save(model.state_dict(), "/data/ckpt/step_100.pt")   # torch.save, crash-safe
    checkpoint.mirror("/data/ckpt/step_100.pt", "/mnt/backup/ckpt")
    checkpoint.prune("/data/ckpt", keep=12, mirrors=["/mnt/backup/ckpt"])
    state = torch.load(checkpoint.latest("/data/ckpt"))

torch is imported only when an object has to go through ``torch.save``. Checkpoints are single
regular files (a directory per step is not supported). Locking uses ``flock`` where the platform
has it (POSIX); elsewhere the grace period alone protects files in flight.
"""

from trainguard.checkpoint.copier import mirror
from trainguard.checkpoint.part import CheckpointError
from trainguard.checkpoint.retention import Checkpoint, latest, prune
from trainguard.checkpoint.writer import save
from trainguard.shared.manifest import Record

__all__ = ["Checkpoint", "CheckpointError", "Record", "latest", "mirror", "prune", "save"]
