"""RIGKIT_STATUS_RIGS inventory hosts (rig-1, rig-2, ...) on the one simulated rig (same SSH endpoint,
distinct names), for `rigkit status` tests and bench/status_fleet.py; with RIGKIT_STATUS_DOWN_PORT
also `rig-down`, an inventory host on a closed port."""

import os

from tests.data.sim_ssh import sim_ssh_data

_data = {
    **sim_ssh_data(),
    "rig_file": os.environ["RIGKIT_RIG_FILE"],
    **{key: os.environ[var] for key, var in (("catalog_dir", "RIGKIT_CATALOG_DIR"), ("results_dir", "RIGKIT_RESULTS_DIR"))
       if var in os.environ},
}

rigs = [(f"rig-{n}", dict(_data)) for n in range(1, int(os.environ.get("RIGKIT_STATUS_RIGS", "1")) + 1)]
if os.environ.get("RIGKIT_STATUS_DOWN_PORT"):
    rigs.append(("rig-down", {**_data, "ssh_port": int(os.environ["RIGKIT_STATUS_DOWN_PORT"])}))
