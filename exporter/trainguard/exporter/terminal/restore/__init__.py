"""``trainguard verify --restore``: load the checkpoint a resume would load, as training would.

Modules: ``command`` (the drill and its result), ``load`` (the loader run in a child process),
``files`` (the loaders of single files, and how a failure to load is told).
"""
