"""Role gpu_report: read the rig's GPUs through nvidia-smi (nvidia-smi.exe on Windows), print them, and stop
the deploy for this rig if they are not the GPUs its rig file describes. Returns the report, which the
policy roles check their caps against.

Defaults: none; it reads only the validated RigConfig.
"""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.api.exceptions import DeployError

from rigkit.config import RigConfig
from rigkit.facts import NvidiaGpus
from rigkit.gpucheck import describe, gpu_problems
from rigkit.nvsmi import GpuReport
from rigkit.winfacts import WindowsNvidiaGpus


@deploy("Report GPUs")
def gpu_report(rig: RigConfig) -> GpuReport:
    report = host.get_fact(WindowsNvidiaGpus if rig.spec.os == "windows" else NvidiaGpus)
    for gpu in report.gpus if report else ():
        logger.info(f"{host.print_prefix}{describe(gpu)}")
    problems = gpu_problems(rig.spec.gpus, report)
    if problems:
        raise DeployError(f"rig {rig.name} ({host.name}): " + "; ".join(problems))
    return report
