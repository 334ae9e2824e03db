"""Heartbeat files: what a training process tells the exporter, and what outlives the process.

One definition for the writer (``trainguard.Run``) and the readers (the exporter's run table,
``trainguard status``), so the two never disagree on a field. Modules: ``record`` (the record
and its parts, the file's name, how it is written), ``fields`` (the checks of each field of its
JSON document), ``read`` (reading a file anyone may have written: bounded, strict, every
problem named).
"""
