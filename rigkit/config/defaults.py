"""Where rigkit looks for things on the control machine when the inventory does not say.

A module of its own, without imports, so that `rigkit`'s command line can name them in its
help without loading the rig file schema (docs/configuration.md lists them).
"""

DEFAULT_CATALOG_DIR = "inventory/models"  # one YAML file per served model
DEFAULT_RESULTS_DIR = "results"  # verification results on the control machine
