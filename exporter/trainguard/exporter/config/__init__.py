"""The exporter's config file: read once at start, validated strictly.

A typo is an error naming the file, line, field and what was expected, never a silently ignored
key. Modules: ``model`` (the dataclasses a config file becomes, and ``load_config``),
``schema`` (the one validator that turns a YAML document into them), ``yamlfile`` (the one
reader of trainguard's YAML files, which keeps every value's line and column).
"""
