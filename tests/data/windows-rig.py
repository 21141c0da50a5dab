"""The simulated rig as a Windows rig: reached through rigkit's `@winssh` connector."""

import os

from tests.data.sim_ssh import sim_ssh_data

rigs = [
    (
        "@winssh/127.0.0.1",
        {**sim_ssh_data(), "rig_file": os.environ["RIGKIT_RIG_FILE"], "catalog_dir": os.environ["RIGKIT_CATALOG_DIR"],
         "results_dir": os.environ["RIGKIT_RESULTS_DIR"]},
    ),
]
