"""The exporter side: ``trainguard-exporter``, the sidecar that watches training processes.

It watches from outside because a dead process cannot report its own death. One folder per
concern, with one way down between them (tests/generators/test_layout.py holds it):

- ``cli``: the ``trainguard-exporter`` command (flags, start-up, serving);
- ``terminal/``: the ``trainguard`` command (status, verify, launch, snapshot);
- ``http/``: the HTTP server, the WSGI app, the web config (TLS, basic auth), the runbook page;
- ``collectors/``: one package per collector (``runs``, ``gpu``, ``checkpoints``, ``restore``;
  ``processes`` a module), and the list the exporter builds them from;
- ``runs/``: the run table the collectors and ``trainguard status`` share, its rows and what a
  row means, runs declared in the config file, checkpoint locations to watch;
- ``scrape/``: the collector framework, one scrape's context, the relay its calls run on, and
  the text exposition;
- ``config/``: the config file's model, its schema and the one YAML reader.
"""
