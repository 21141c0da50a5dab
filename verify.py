"""pyinfra entry point for verification only: `rigkit verify INVENTORY`
(= `pyinfra -y --data rigkit_verify=always INVENTORY verify.py`).

Benchmarks every served model on each rig and checks the GPUs under load,
without changing anything else.
"""

from pyinfra import host, inventory

from rigkit.config.inventory import rig_config, run_options, validate_inventory
from roles.verify import verify

validate_inventory(inventory)
options = run_options(host)
verify(rig_config(host), results_dir=options.results_dir, always=options.verify_always)
