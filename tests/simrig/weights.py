"""Tiny stand-in checkpoints for the simulated rig's models. TEST INFRASTRUCTURE.

They live under SIM_MODELS on the host, which SimRig mounts into the rig at the
same path: the rig's docker CLI drives the host's dockerd, which resolves bind
sources on the host, so the rig's paths and the host's must agree.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

SIM_MODELS = Path("/srv/rigkit-sim-models")


def ensure_checkpoint(name: str) -> Path:
    """A model folder the vLLM stand-in accepts: config.json and one safetensors-shaped shard."""
    folder = SIM_MODELS / name
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "config.json"
    if not config.exists():
        header = json.dumps({"w": {"dtype": "BF16", "shape": [512], "data_offsets": [0, 1024]}}).encode()
        (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(1024))
        config.write_text(json.dumps({"model_type": "standin", "name": name}))
    return folder
