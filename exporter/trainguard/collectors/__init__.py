"""One module per collector; each is a :class:`trainguard.collector.Collector`."""
