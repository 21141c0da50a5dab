"""pyinfra SSH data for the test session's simulated rig (RIGKIT_SIM_PORT, key under RIGKIT_STATE),
shared by the test inventories in this folder."""

import os
from pathlib import Path


def sim_ssh_data() -> dict:
    return {
        "ssh_hostname": "127.0.0.1",
        "ssh_port": int(os.environ["RIGKIT_SIM_PORT"]),
        "ssh_user": "root",
        "ssh_key": str(Path(os.environ["RIGKIT_STATE"]) / "ssh" / "id_ed25519"),
        "ssh_known_hosts_file": "/dev/null",
        "ssh_strict_host_key_checking": "off",
    }
