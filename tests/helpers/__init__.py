"""What the tests share: the exporter as a real process (``exporter_proc``), real Prometheus and
Alertmanager (``promstack``, ``e2e_stack``), the test NVML library's state writer
(``nvml_fake``), training children that report and die (``run_child``, ``ckpt_child``, and
``framework_child``: the Hugging Face Trainer or Lightning with the trainguard callback) and
the dashboards' query extractor (``dashboard_queries``). ``tests/`` is on ``sys.path``."""
