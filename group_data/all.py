"""Defaults for every rig in any inventory; a host's own data overrides them.

The values are declared once, in rigkit/config/inventory.py (docs/configuration.md lists them).
"""

from rigkit.config.inventory import DEFAULT_CATALOG_DIR, DEFAULT_RESULTS_DIR
from rigkit.plumbing.ssh import gcm_first_transport

# Where the model catalog lives: one YAML file per served model.
catalog_dir = DEFAULT_CATALOG_DIR

# Where verification results (JSON and PNG per rig, model and run) are kept on the control machine.
results_dir = DEFAULT_RESULTS_DIR

# paramiko's SSHClient.connect arguments: AES-GCM asked for first (rigkit/plumbing/ssh.py says why). A host
# that sets its own ssh_paramiko_connect_kwargs replaces this, as pyinfra documents.
ssh_paramiko_connect_kwargs = {"transport_factory": gcm_first_transport}
