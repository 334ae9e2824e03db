"""The runs collector: alive or gone, finished or not, progress, memory and recorded deaths.

Modules: ``collector`` (the collector) and the series it adds per row.
"""
