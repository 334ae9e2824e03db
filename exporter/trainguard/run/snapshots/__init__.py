"""CUDA memory snapshots for PyTorch's memory_viz, taken by the reporter.

Modules: ``capture`` (what is taken, when, and what the heartbeat says of it: at an OOM, on a
schedule, on request), ``files`` (a run and rank's snapshot files in the state directory and
their rotation), ``requests`` (answering ``trainguard snapshot RUN``).
"""
