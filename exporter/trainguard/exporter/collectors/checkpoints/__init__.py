"""The checkpoints collector: checkpoint locations judged against what was recorded at write time.

Modules: ``collector`` (the collector), ``verdicts`` (a location's judged series),
``dirwatch`` (what the exporter remembers of a directory between scrapes), ``verifier`` (the
background SHA-256 verifier) and ``verdict_cache`` (its verdicts kept across restarts),
``saves`` (the save outcomes the training processes recorded).
"""
