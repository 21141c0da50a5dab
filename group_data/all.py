"""Defaults for every rig in any inventory; a host's own data overrides them.

The values are declared once, in rigkit/config/inventory.py (docs/configuration.md lists them).
"""

from rigkit.config.inventory import DEFAULT_CATALOG_DIR, DEFAULT_RESULTS_DIR

# Where the model catalog lives: one YAML file per served model.
catalog_dir = DEFAULT_CATALOG_DIR

# Where verification results (JSON and PNG per rig, model and run) are kept on the control machine.
results_dir = DEFAULT_RESULTS_DIR
