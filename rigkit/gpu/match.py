"""Compare the GPUs a rig file describes with the GPUs the rig reports. Pure functions."""

from __future__ import annotations

from rigkit.config.gpu_models import normalise
from rigkit.config.schema import GpuSpec
from rigkit.gpu.nvsmi import EXIT_NO_PERMISSION, GpuReport, GpuStatus


def gpu_problems(configured: list[GpuSpec], report: GpuReport | None) -> list[str]:
    """Why this rig's GPUs are not the ones its file describes; empty when they are."""
    if report is None:
        return ["nvidia-smi is not installed on the rig: install the NVIDIA driver first"]
    if report.error:
        hint = " (not root?)" if report.exit_code == EXIT_NO_PERMISSION else ""
        return [f"nvidia-smi failed with exit code {report.exit_code}{hint}: {report.error}"]
    by_index = {g.index: g for g in report.gpus}
    problems = []
    for gpu in configured:
        found = by_index.get(gpu.index)
        if found is None:
            present = ", ".join(str(i) for i in sorted(by_index)) or "none"
            problems.append(f"GPU {gpu.index} is in the rig file, but the rig reports GPUs: {present}")
        elif not _same_model(gpu.model, found.name):
            problems.append(f"GPU {gpu.index} is described as {gpu.model!r}, but the rig reports {found.name!r}")
    return problems


def _same_model(configured: str, reported: str) -> bool:
    # "RTX 4090 48GB" (what the owner knows) matches "NVIDIA GeForce RTX 4090" (what the driver says).
    a, b = normalise(configured), normalise(reported)
    return a.startswith(b) or b.startswith(a)


def describe(gpu: GpuStatus) -> str:
    return (
        f"GPU {gpu.index}: {gpu.name}, power limit {gpu.power_limit_w:.0f} W "
        f"(enforced {gpu.enforced_power_limit_w:.0f} W, default {gpu.power_default_w:.0f} W, "
        f"range {gpu.power_min_w:.0f}-{gpu.power_max_w:.0f} W), "
        f"persistence {'on' if gpu.persistence_mode else 'off'}, {gpu.memory_total_mib} MiB"
    )
