"""The restore collector: what the restore drills (``trainguard verify --restore``) last loaded.

Modules: ``collector`` (the collector), ``metrics`` (its series), ``result`` (the result file a
drill leaves in the state directory, and its strict reader, shared with the drill).
"""
