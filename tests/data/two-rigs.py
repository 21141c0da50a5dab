"""Two inventory hosts on the one simulated rig (same SSH endpoint), for the rolling rollout test."""

import os

from tests.data.sim_ssh import sim_ssh_data

_ssh = {**sim_ssh_data(), "catalog_dir": os.environ["RIGKIT_CATALOG_DIR"]}

rigs = [
    ("rig-a", {**_ssh, "rig_file": os.environ["RIGKIT_RIG_FILE_A"]}),
    ("rig-b", {**_ssh, "rig_file": os.environ["RIGKIT_RIG_FILE_B"]}),
]
