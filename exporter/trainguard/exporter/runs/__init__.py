"""The runs the exporter knows: one table, read once per scrape, for every reader alike.

The runs, GPU and checkpoints collectors and ``trainguard status`` all read the same table, so
they never disagree on which runs exist and whether each is alive. Modules: ``table`` (the
table: heartbeat files and configured runs, and whether each process is alive), ``rows`` (its
rows and what a row means: starting, ended, stuck, a run's last death), ``configured`` (runs
declared in the config file, and their pid files), ``targets`` (the checkpoint locations to
watch).
"""
