"""pyinfra entry point for verification only: `rigkit verify INVENTORY`
(= `pyinfra -y --data rigkit_verify=always INVENTORY verify.py`).

Benchmarks every served model on each rig and checks the GPUs under load,
without changing anything else.
"""

from pyinfra import host, inventory

from rigkit.config.inventory import rig_config, run_options, validate_inventory
from rigkit.ssh import tcp_nodelay
from roles.verify import verify

validate_inventory(inventory)
tcp_nodelay(host)  # ~45 ms less per round trip (rigkit/ssh.py)
options = run_options(host)
verify(rig_config(host), results_dir=options.results_dir, always=options.verify_always)
