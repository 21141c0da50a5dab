"""pyinfra entry point for verification only: `rigkit verify INVENTORY`
(= `pyinfra -y --data rigkit_verify=always INVENTORY verify.py`).

Benchmarks every served model on each rig and checks the GPUs under load,
without changing anything else; on the rig that runs the gateway, then benchmarks
each model through it (roles/gateway_verify.py).
"""

from pyinfra import host, inventory

from rigkit.config.inventory import rig_config, run_options, validate_inventory
from rigkit.gateway.plan import gateway_plan
from rigkit.plumbing.ssh import tcp_nodelay
from roles.gateway_verify import gateway_verify
from roles.verify import verify

rigs = validate_inventory(inventory)
fleet_gateway = gateway_plan(inventory, rigs)
tcp_nodelay(host)  # ~45 ms less per round trip (rigkit/plumbing/ssh.py)
options = run_options(host)
verify(rig_config(host), results_dir=options.results_dir, always=options.verify_always)
if fleet_gateway is not None and fleet_gateway.host == host.name:
    fleet = {name: rig_config(h) for h in inventory for name in [h.name]}
    gateway_verify(fleet_gateway, fleet, results_dir=options.results_dir, always=options.verify_always)
