"""One line in the frameworks people train with: callbacks that report a run through
:class:`trainguard.Run` without touching the training loop.

- :mod:`trainguard.integrations.transformers`: ``TrainguardCallback`` for the Hugging Face
  ``Trainer`` (``pip install 'trainguard[transformers]'``);
- :mod:`trainguard.integrations.lightning`: ``TrainguardCallback`` for ``lightning.Trainer``
  (``pip install 'trainguard[lightning]'``).

Each module imports its framework when it is imported itself, never before: ``import
trainguard`` (and this package) load neither transformers nor lightning.
"""
