"""The GPU collector: memory, processes, Xid errors and health, as the driver reports them.

Modules: ``collector`` (the collector: memory, per-process memory, Xid errors), ``metrics``
(every GPU series, in docs/metrics.md's order), ``processes`` (the processes NVML lists on a
GPU), ``xid`` (the Xid event watcher), ``health/`` (the health reads of each GPU).
"""
