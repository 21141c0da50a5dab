"""The built-in simulated rig, reached over real SSH on 127.0.0.1.

`./run demo` and the tests start it (tests/simrig). RIGKIT_SIM_PORT,
RIGKIT_RIG_FILE, RIGKIT_CATALOG_DIR and RIGKIT_RESULTS_DIR let the tests point this inventory at their own rig.
"""

import os
from pathlib import Path

_state = Path(os.environ.get("RIGKIT_STATE", Path(__file__).resolve().parent.parent / ".state"))

_overrides = {"catalog_dir": "RIGKIT_CATALOG_DIR", "results_dir": "RIGKIT_RESULTS_DIR"}

rigs = [
    (
        "sim-rig",
        {
            "ssh_hostname": "127.0.0.1",
            "ssh_port": int(os.environ.get("RIGKIT_SIM_PORT", "2222")),
            "ssh_user": "root",
            "ssh_key": str(_state / "ssh" / "id_ed25519"),
            "ssh_known_hosts_file": "/dev/null",
            "ssh_strict_host_key_checking": "off",
            "rig_file": os.environ.get("RIGKIT_RIG_FILE", "inventory/rigs/sim.yml"),
            # Tests point these at their own folders; otherwise group_data/all.py's defaults apply.
            **{key: os.environ[var] for key, var in _overrides.items() if var in os.environ},
        },
    ),
]
