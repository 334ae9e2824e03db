"""The exporter's HTTP side: the server, the app it serves, and what guards it.

Modules: ``server`` (the HTTP/1.1 server: persistent connections, a thread each, WSGI apps),
``connections`` (which open connection is closed to make room for a new one), ``request``
(the request parser, strict against smuggling), ``app`` (landing page, health endpoint,
``/metrics``, ``/runbook``), ``webconfig`` (TLS and basic auth from the web configuration file
Prometheus exporters share), ``runbook`` (the runbook shipped in the package, served as HTML).
"""
