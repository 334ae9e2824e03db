"""One module per collector; each is a :class:`trainguard.exporter.collector.Collector`."""
