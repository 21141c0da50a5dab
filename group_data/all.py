"""Defaults for every rig in any inventory; a host's own data overrides them."""

# Where the model catalog lives: one YAML file per served model.
catalog_dir = "inventory/models"

# Where verification results (JSON and PNG per rig, model and run) are kept on the control machine.
results_dir = "results"
