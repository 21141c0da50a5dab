"""GPU policy rules that differ on Windows rigs. Pure functions.

The Windows tasks set only the caps a rig file gives; a GPU without one is left as it
is (Linux restores the driver's default), so only capped GPUs can drift.
"""

from __future__ import annotations

from rigkit.config.schema import RigSpec
from rigkit.gpu.nvsmi import GpuReport
from rigkit.gpu.policy import drift_lines


def capped_power_drift(spec: RigSpec, report: GpuReport) -> list[str]:
    """Capped GPUs whose current power limit is not the rig file's, as lines for the deploy log."""
    wanted = {g.index: float(g.power_limit_w) for g in spec.gpus if g.power_limit_w is not None}
    return drift_lines(report, wanted)
