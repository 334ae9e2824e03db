"""trainguard's alert rules as code: thresholds, rule groups and the generator of
``alerts/trainguard.rules.yml`` (see ``alerts/README.md``)."""
