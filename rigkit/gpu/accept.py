"""The GPU checks every OS role runs before it changes anything, as pyinfra errors.

Both `roles/gpu_report.py` (Linux) and `roles/windows.py` call these with the report
they read through their own fact; the decisions are the pure functions in
`rigkit.gpu.match` and `rigkit.gpu.policy`.
"""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api.exceptions import DeployError

from rigkit.config.schema import RigConfig
from rigkit.gpu.match import describe, gpu_problems
from rigkit.gpu.nvsmi import GpuReport
from rigkit.gpu.policy import policy_problems


def accept_gpus(rig: RigConfig, report: GpuReport | None) -> GpuReport:
    """Print the rig's GPUs; stop this rig's deploy if they are not the ones its file describes."""
    for gpu in report.gpus if report else ():
        logger.info(f"{host.print_prefix}{describe(gpu)}")
    problems = gpu_problems(rig.spec.gpus, report)
    if problems:
        raise DeployError(f"rig {rig.name} ({host.name}): " + "; ".join(problems))
    return report


def check_policy(rig: RigConfig, report: GpuReport) -> None:
    """Stop the run for this rig, before any change, if its policy must not be applied."""
    problems, override = policy_problems(rig.spec, report)
    if override:
        logger.warning(f"{host.print_prefix}{override} ({rig.file})")
    if problems:
        raise DeployError(f"rig {rig.name} ({rig.file}), nothing was changed: " + "; ".join(problems))
