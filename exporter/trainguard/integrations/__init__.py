"""Framework callbacks that report a run in one line, without touching the training loop.

One line in the frameworks people train with reports the run through :class:`trainguard.Run`.

- :mod:`trainguard.integrations.transformers`: ``TrainguardCallback`` for the Hugging Face
  ``Trainer`` (``pip install 'trainguard[transformers]'``);
- :mod:`trainguard.integrations.lightning`: ``TrainguardCallback`` for ``lightning.Trainer``
  (``pip install 'trainguard[lightning]'``).

Each module imports its framework when it is imported itself, never before: ``import
trainguard`` (and this package) load neither transformers nor lightning.
"""
