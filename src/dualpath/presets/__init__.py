"""Packaged presets (TOML data): hardware/, model/, pd-cluster/ (and the runtime's cluster/)."""
