"""The dashboards, one module per dashboard.

Each has ``UID`` and ``build(site, ...) -> Dashboard`` made of one small function per row,
built with :mod:`grafana.panels` for one site's configuration (:mod:`grafana.promql`). A row
too long to share its dashboard's module has its own, named for the row (``gpu_allocator``:
the GPU memory dashboard's driver vs allocator row).
"""
