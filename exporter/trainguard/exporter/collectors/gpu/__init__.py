"""The GPU collector: memory, processes, Xid errors and health, as the driver reports them.

Modules: ``collector`` (the collector: memory, per-process memory, Xid errors), ``processes``
(the processes NVML lists on a GPU), ``xid`` (the Xid event watcher), ``health_metrics`` (the
health series' contract), ``health/`` (the health reads of each GPU).
"""
