"""Configuration: the schema of rig files and catalog entries, the YAML loader that keeps
lines for errors, the serving-config lint rules, what a path in a rig file is (paths), the
GPU model table, and the inventory adapter (the only code that reads pyinfra's host.data)."""
