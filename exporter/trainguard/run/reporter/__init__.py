"""``trainguard.Run``, the reporter a training script calls, and the writer behind it.

- :mod:`~trainguard.run.reporter.run`: :class:`Run`, what a training script calls (``step()``,
  ``begin()``, ``close()``, ``capture_oom()``) and the constructor that wires the parts;
- :mod:`~trainguard.run.reporter.writer`: the background thread that writes the heartbeats and
  the closing protocol (the final heartbeat, with the signal guard), the base of :class:`Run`.

Two modules because the two sides run on different threads under different rules: the
training thread's calls must never block, the writer's must never raise into the script.
"""

from trainguard.run.reporter.run import Run

__all__ = ["Run"]
