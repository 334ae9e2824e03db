"""``trainguard status``: the runs this host knows, as a table, plain text or JSON.

Modules: ``command`` (the snapshot of the runs and its three views: table, plain text, JSON),
``checkpoints`` (the checkpoint column, judged once while the rate's sample is waited for).
"""
