"""pyinfra entry point for fleet status only: `rigkit status INVENTORY`
(= `pyinfra -y --data rigkit_status_dir=DIR INVENTORY status.py`).

Changes nothing on any rig: one `python.call` per rig reads facts and runs the read-only status
probe (rigkit/status/), and leaves the rig's document in DIR for `rigkit status` to gather.
pyinfra connects to every rig at once and runs the call on all of them in parallel; a rig it
cannot reach gets no document, and `rigkit status` reports it as unreachable.
"""

from pyinfra import host, inventory
from pyinfra.operations import python

from rigkit.config.inventory import rig_config, run_options, validate_inventory
from rigkit.ssh import rig_call
from rigkit.status.collect import collect

validate_inventory(inventory)
options = run_options(host)
python.call(
    name="Read the rig's state (read-only)",
    function=rig_call(collect), rig=rig_config(host), status_dir=options.status_dir or options.results_dir / "status",
    inventory=options.status_inventory, results_dir=options.results_dir,
)
