"""GPUs (role gpu_policy, templates/gpu_policy/): nvidia-smi's query and its parser, the
facts that read it and the driver (driver: what the preflight judges), matching the rig file against what the rig reports, and the policy
checks (driver range, PSU budget, drift) made before anything is applied."""
