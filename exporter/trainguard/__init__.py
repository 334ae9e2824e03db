"""trainguard: tell within one scrape that a training run died, stalled, holds ghost GPU
memory or left a truncated checkpoint.

The exporter lives in :mod:`trainguard.cli`; training scripts use :class:`trainguard.Run` and
:mod:`trainguard.checkpoint`. Both are imported lazily so that the exporter never pays for the
training-side code (or torch) and a training script never pays for the exporter.
"""

from typing import Any

from trainguard._version import __version__

__all__ = ["Run", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "Run":
        from trainguard.reporter import Run

        return Run
    raise AttributeError(f"module 'trainguard' has no attribute {name!r}")
