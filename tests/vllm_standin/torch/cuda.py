"""torch.cuda of the torch stand-in (tests/vllm_standin/torch/__init__.py says what it fakes)."""

from __future__ import annotations

_current = [0]


def device_count() -> int:
    import torch

    torch._faults()  # no simulated rig, no GPUs: refused as a missing driver would be
    return len(torch._rig_gpus())


def set_device(device) -> None:
    import torch

    _current[0] = torch._ordinal(f"cuda:{int(device)}")


def synchronize(device=None) -> None:
    """Copies and collectives complete when they are called (a hung one never returns)."""


def current_device() -> int:
    return _current[0]
