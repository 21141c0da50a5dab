"""What rigkit knows about GPU models before it reaches a rig.

The power ranges are the reference boards' `power.min_limit`/`power.max_limit`.
Partner and modded boards differ, so these only catch typos at validation time;
the range the rig's own driver reports is checked again before anything is
applied (see `rigkit.gpu.policy`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuModelInfo:
    name: str
    power_min_w: int
    power_max_w: int
    power_default_w: int
    memory_bandwidth_gb_s: float
    compute_capability: tuple[int, int]
    memory_gib: int


KNOWN_GPUS: tuple[GpuModelInfo, ...] = (
    GpuModelInfo("RTX 3090", 100, 400, 350, 936.0, (8, 6), 24),
    GpuModelInfo("RTX 3090 Ti", 100, 480, 450, 1008.0, (8, 6), 24),
    GpuModelInfo("RTX 4090", 150, 600, 450, 1008.0, (8, 9), 24),
    # The Chinese 48 GB rework of the 4090: blower board, 450 W stock.
    GpuModelInfo("RTX 4090 48GB", 150, 450, 450, 1008.0, (8, 9), 48),
    GpuModelInfo("RTX 5090", 400, 600, 575, 1792.0, (12, 0), 32),
    GpuModelInfo("RTX PRO 6000 Blackwell", 150, 600, 600, 1792.0, (12, 0), 96),
    GpuModelInfo("A100 80GB PCIe", 150, 300, 300, 1935.0, (8, 0), 80),
    GpuModelInfo("H100 80GB HBM3", 200, 700, 700, 3350.0, (9, 0), 80),
    GpuModelInfo("H200", 200, 700, 700, 4800.0, (9, 0), 141),
)


def normalise(name: str) -> str:
    name = name.lower().replace("nvidia", "").replace("geforce", "")
    return re.sub(r"\s+", " ", name).strip()


_BY_NAME = {normalise(info.name): info for info in KNOWN_GPUS}


def lookup(model_name: str) -> GpuModelInfo | None:
    """Find a GPU by the name a user writes or nvidia-smi reports ("NVIDIA GeForce RTX 4090")."""
    return _BY_NAME.get(normalise(model_name))



def has_native_fp8(model_name: str) -> bool | None:
    """FP8 tensor cores arrived with Ada (8.9); Ampere runs FP8 weights as W8A16 via Marlin. None if unknown."""
    info = lookup(model_name)
    return None if info is None else info.compute_capability >= (8, 9)
