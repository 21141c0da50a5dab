"""Preflight (role preflight): what must hold on a rig before rigkit changes anything on it --
the NVIDIA driver is there, its kernel module and library agree, it is new enough for every
serving image, every GPU's architecture is in every image, and Docker's disk has room for the
weights to copy. Pure checks in `checks`, the read-only facts in `facts` (the driver's own
fact is rigkit.gpu.facts.NvidiaDriver: the GPU report reads it with the GPUs in one start).
Offline, on the control machine: `rigkit check` of a rig file (rig_file_check) and what every
inventory command checks before it reaches a rig (inventory_check)."""
