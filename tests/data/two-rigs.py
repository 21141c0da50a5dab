"""Two inventory hosts on the one simulated rig (same SSH endpoint), for the rolling rollout test."""

import os
from pathlib import Path

_state = Path(os.environ["RIGKIT_STATE"])
_ssh = {
    "ssh_hostname": "127.0.0.1",
    "ssh_port": int(os.environ["RIGKIT_SIM_PORT"]),
    "ssh_user": "root",
    "ssh_key": str(_state / "ssh" / "id_ed25519"),
    "ssh_known_hosts_file": "/dev/null",
    "ssh_strict_host_key_checking": "off",
    "catalog_dir": os.environ["RIGKIT_CATALOG_DIR"],
}

rigs = [
    ("rig-a", {**_ssh, "rig_file": os.environ["RIGKIT_RIG_FILE_A"]}),
    ("rig-b", {**_ssh, "rig_file": os.environ["RIGKIT_RIG_FILE_B"]}),
]
