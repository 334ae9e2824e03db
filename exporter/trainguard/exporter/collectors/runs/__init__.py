"""The runs collector: alive or gone, finished or not, progress, memory and recorded deaths.

Modules: ``collector`` (the collector: what each row of the run table publishes), ``metrics``
(its series, in docs/metrics.md's order).
"""
