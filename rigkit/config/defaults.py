"""Where rigkit looks for things on the control machine when the inventory does not say.

A module of its own, without imports, so that `rigkit`'s command line can name them in its
help without loading the rig file schema (docs/configuration.md lists them).
"""

DEFAULT_CATALOG_DIR = "inventory/models"  # one YAML file per served model
DEFAULT_RESULTS_DIR = "results"  # verification results on the control machine
# A copy from another rig's volume is fsynced, journaled and resumed in chunks of this many bytes
# (`rigkit_weights_chunk_bytes`, within the range): after a kill at most one chunk crosses twice.
WEIGHTS_CHUNK_BYTES = 64 * 1024 * 1024
WEIGHTS_CHUNK_BYTES_RANGE = (64 * 1024, 1024 * 1024 * 1024)
