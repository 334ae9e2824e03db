"""``trainguard status``: the runs this host knows, as a table, plain text or JSON.

Modules: ``command`` (the table and its rows), ``checkpoints`` (the checkpoint column),
``stuck`` (where each stuck rank is, one line per rank under the table).
"""
