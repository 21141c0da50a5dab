"""What the rig's NVIDIA driver and its GPUs' architectures are, as read on the rig
(rigkit.gpu.facts.NvidiaDriver); the preflight judges them (rigkit.preflight.checks). Plain data."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuArch:
    index: int
    name: str
    compute_capability: tuple[int, int] | None  # as the rig reports it; None when it could not say


@dataclass(frozen=True)
class DriverState:
    """The rig's NVIDIA driver as nvidia-smi and the kernel report it (rigkit.gpu.facts.NvidiaDriver)."""

    installed: bool  # nvidia-smi is on the rig
    library_version: str | None = None  # user-space: nvidia-smi's driver_version, or NVML's own
    module_version: str | None = None  # kernel: /sys/module/nvidia/version or /proc/driver/nvidia/version
    gpus: tuple[GpuArch, ...] = ()
    exit_code: int = 0
    error: str | None = None  # nvidia-smi's own words when it failed
