"""trainguard: tell within one scrape what went wrong with a long GPU training run.

Within one scrape it tells that a run died, stalled, holds ghost GPU memory or left a truncated
checkpoint.

Two sides, two rooms:

- the training side, imported by training scripts and light: :mod:`trainguard.run`
  (:class:`trainguard.Run`) and :mod:`trainguard.checkpoint`;
- the exporter side, the sidecar that watches from outside: :mod:`trainguard.exporter`;
- what both read and write the same way, in :mod:`trainguard.shared`.

The training side never imports the exporter side (nor PyYAML, prometheus_client or bcrypt),
and ``trainguard.Run`` is imported lazily so that the exporter never pays for it either.
"""

from typing import Any

from trainguard._version import __version__

__all__ = ["Run", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "Run":
        from trainguard.run.reporter import Run

        return Run
    raise AttributeError(f"module 'trainguard' has no attribute {name!r}")
