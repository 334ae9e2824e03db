"""One module per dashboard; each has ``UID`` and ``build(...) -> Dashboard`` made of one small
function per row, built with :mod:`grafana.panels`."""
