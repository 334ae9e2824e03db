"""The exporter side: ``trainguard-exporter``, the sidecar that watches training processes.

It watches from outside because a dead process cannot report its own death. Here are the CLI and
config, the web layer, the scrape/collector framework, one module per collector, the background
hash verifier and the caches that keep a scrape cheap.
"""
