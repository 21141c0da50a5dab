"""pyinfra entry point for fleet status only: `rigkit status INVENTORY`
(= `pyinfra -y --data rigkit_status_dir=DIR INVENTORY status.py`).

Changes nothing on any rig: one `python.call` per rig reads facts and runs the read-only status
probe (rigkit/status/; a Windows rig's reads are rigkit/windows/status.py), and leaves the rig's
document in DIR for `rigkit status` to gather.
pyinfra connects to every rig at once and runs the call on all of them in parallel; a rig it
cannot reach gets no document, and `rigkit status` reports it as unreachable.
"""

from pyinfra import host, inventory
from pyinfra.operations import python

from rigkit.config.inventory import rig_config, run_options, validate_inventory
from rigkit.plumbing.ssh import rig_call
from rigkit.status.collect import collect
from rigkit.windows.status import collect_windows

validate_inventory(inventory)
options = run_options(host)
rig = rig_config(host)
python.call(
    name="Read the rig's state (read-only)",
    function=rig_call(collect_windows if rig.spec.os == "windows" else collect), rig=rig,
    status_dir=options.status_dir or options.results_dir / "status",
    inventory=options.status_inventory, results_dir=options.results_dir,
)
