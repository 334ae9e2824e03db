"""The training side's reporter, ``trainguard.Run``.

It writes the heartbeat the exporter reads, carries the death history across restarts and dumps
memory snapshots at an OOM.
"""

from trainguard.run.reporter import Run

__all__ = ["Run"]
