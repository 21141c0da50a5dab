"""The active P2P check's key (control side, pure). The check itself runs on the rig (rigkit/rigside/p2p.py,
templates/serving/rigkit-p2p-probe.py; docs/topology.md), started by `rigkit-stack probe`, whose command
line rigkit.rigside.stack.probe_command builds.

A passed check is kept on the rig under a key: the SHA-256 of what it proved, so a deploy runs it again
only when that changes: the model's image, its GPUs, the links and P2P status between them (from the
topology fact: not the current PCIe generation or width, which drop at idle), the IOMMU's mode, the
bridges redirecting peer traffic, and the environment NCCL and CUDA run with.
"""

from __future__ import annotations

import hashlib
import json

from rigkit.config.schema import ModelConfig
from rigkit.topology.decide import ALLOW_RISKY_P2P, Verdict

# What the check's environment can change: NCCL's and CUDA's variables (catalog `env` or rigkit's own).
_ENV_PREFIXES = ("NCCL_", "CUDA_", "TORCH_NCCL_")


def probe_key(model: ModelConfig, verdict: Verdict | None) -> str:
    env = {**(verdict.env if verdict else {}), **model.spec.env}
    facts = {
        "image": model.spec.image,
        "gpus": sorted(model.spec.gpus),
        "pairs": [[p.a, p.b, p.link, p.p2p, p.gbps] for p in verdict.pairs] if verdict else None,
        # ACS and IOMMU findings a rig file allowed (as errors they stop the deploy before any check)
        "allowed": sorted(w for w in verdict.warnings if ALLOW_RISKY_P2P in w) if verdict else [],
        "env": {k: v for k, v in sorted(env.items()) if k.startswith(_ENV_PREFIXES)},
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()

