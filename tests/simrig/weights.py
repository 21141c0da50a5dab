"""Tiny stand-in checkpoints for the simulated rig's models. TEST INFRASTRUCTURE.

They live under SIM_MODELS on the host, which SimRig mounts into the rig at the
same path: the rig's docker CLI drives the host's dockerd, which resolves bind
sources on the host, so the rig's paths and the host's must agree.
"""

from __future__ import annotations

import json
import os
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
        _write_atomically(folder / "model.safetensors", struct.pack("<Q", len(header)) + header + bytes(1024))
        _write_atomically(config, json.dumps({"model_type": "standin", "name": name}).encode())
    return folder


def _write_atomically(path: Path, data: bytes) -> None:
    """Whole or absent, never a half-written file: `./run test`'s processes may make the same
    checkpoint at once while another reads it."""
    part = path.with_name(f"{path.name}.{os.getpid()}.part")
    part.write_bytes(data)
    os.replace(part, path)
