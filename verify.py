"""pyinfra entry point for verification only: `rigkit verify INVENTORY`
(= `pyinfra -y --data rigkit_verify=always INVENTORY verify.py`).

Benchmarks every served model on each rig and checks the GPUs under load,
without changing anything else.
"""

from pyinfra import host, inventory

from rigkit.hostconfig import rig_config, validate_inventory
from roles.verify import verify

validate_inventory(inventory)
verify(rig_config(host))
