"""GPUs (role gpu_policy, templates/gpu_policy/): nvidia-smi's query and its parser, the
facts that read it, matching the rig file against what the rig reports, and the policy
checks (driver range, PSU budget, drift) made before anything is applied."""
