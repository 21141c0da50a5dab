"""Role gpu_report (Linux): read the rig's GPUs through nvidia-smi, print them, and stop the
deploy for this rig if they are not the GPUs its rig file describes. Returns the report, which
the GPU policy role checks its caps against. (Windows rigs read theirs in roles/windows.py.)

Defaults: none; it reads only the validated RigConfig.
"""

from __future__ import annotations

from pyinfra.api import deploy

from rigkit.config.schema import RigConfig
from rigkit.plumbing.facts_once import Read, read_once
from rigkit.gpu.facts import NvidiaDriverAndGpus
from rigkit.gpu.accept import accept_gpus
from rigkit.gpu.nvsmi import GpuReport


@deploy("Report GPUs")
def gpu_report(rig: RigConfig) -> GpuReport:
    return accept_gpus(rig, read_once(NvidiaDriverAndGpus).gpus)  # nvidia-smi started once, with the preflight's


def gpu_report_reads(rig: RigConfig) -> list[Read]:
    """What the role asks the rig while planning (deploy.py reads them ahead, all at once)."""
    return [(NvidiaDriverAndGpus, {})]
