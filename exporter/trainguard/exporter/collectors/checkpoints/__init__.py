"""The checkpoints collector: checkpoint locations judged against what was recorded at write time.

Modules: ``collector`` (the collector: reads each location, decides when its verdict still
holds), ``metrics`` (its series), ``verdicts`` (a location's judged series and what they were
judged from), ``dirwatch`` (what the exporter remembers of a directory between scrapes),
``verifier`` (the background SHA-256 verifier) and ``verdict_cache`` (its verdicts kept across
restarts), ``saves`` (the save outcomes the training processes recorded).
"""
