"""One scrape: the collector framework, its context, the relay its calls run on, and the text.

Every collector gathers at scrape time and a failure costs only its own
``trainguard_collector_success``. Modules: ``collector`` (the framework: metric specs,
collectors, the one registered prometheus_client collector), ``context`` (one scrape as the
collectors see it: deadline, shared reads, failed parts), ``relay`` (calls run in turn on one
pooled thread, handed on when one stalls), ``exposition`` (the Prometheus text format).
"""
