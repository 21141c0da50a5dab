"""Role gpu_policy (Linux): power caps and clock locks applied at boot, now, and on drift.

Installs a script, the rig's policy file and a systemd oneshot unit ordered
after nvidia-persistenced and before Docker, so the policy is in force before
any model loads. The same unit applies it now when the policy changed or the
rig drifted from it. With `gpu_policy: remove` in the rig file it resets the
clocks, restores default limits and removes what it installed.

Checks first (stop the run before any rig is changed): caps within the range
the rig's driver reports, and the PSU budget (unless `psu_budget_override`).
"""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.facts.files import File
from pyinfra.operations import files, server, systemd

from rigkit.config.schema import RigConfig
from rigkit import units
from rigkit.facts_once import Read
from rigkit.files import FileStates, put
from rigkit.gpu.gate import check_policy
from rigkit.gpu.nvsmi import GpuReport
from rigkit.gpu.policy import power_drift
from rigkit.render import module_source, render, template_text
from rigkit.units import UnitStates

# Defaults: where things go on the rig, and how long the unit waits for GPUs at boot.
UNIT = "rigkit-gpu-policy.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT}"
SCRIPT_PATH = "/usr/local/sbin/rigkit-gpu-policy"
POLICY_PATH = "/etc/rigkit/gpu-policy.conf"
OFFSETS_TOOL_PATH = "/usr/local/sbin/rigkit-gpu-offsets"  # NVML clock offsets (clock_offsets_mhz)
NVML_COPY_PATH = "/usr/local/lib/rigkit/gpu-policy/pynvml.py"  # for rigs without nvidia-ml-py
WAIT_FOR_GPUS_S = 120
RESET_WAIT_S = 30  # `gpu_policy: remove`: the GPUs answer already (the deploy just read them)
FILES = (SCRIPT_PATH, OFFSETS_TOOL_PATH, NVML_COPY_PATH, POLICY_PATH, UNIT_PATH)  # read in one command


def gpu_policy_reads(rig: RigConfig) -> list[Read]:
    """What the role asks the rig while planning (deploy.py reads them ahead, all at once)."""
    if rig.spec.gpu_policy == "remove":
        return []
    return [(FileStates, {"paths": FILES}), (UnitStates, {"units": (UNIT,)})]


@deploy("GPU policy")
def gpu_policy(rig: RigConfig, report: GpuReport) -> list:
    """`report`: the rig's GPUs, already checked against the rig file (roles/gpu_report.py).
    Returns the operations whose change means the GPUs' settings changed."""
    if rig.spec.gpu_policy == "remove":
        return _remove()
    check_policy(rig, report)

    paths = FILES
    script = put(
        name="Install the GPU policy script",
        data=template_text("gpu_policy/rigkit-gpu-policy.sh"), dest=SCRIPT_PATH, mode="755", batch=paths,
    )
    offsets_tool = put(
        name="Install the clock-offset tool",
        data=template_text("gpu_policy/rigkit-gpu-offsets.py"), dest=OFFSETS_TOOL_PATH, mode="755", batch=paths,
    )
    put(name="Ship pynvml for the clock-offset tool", data=module_source("pynvml"),
        dest=NVML_COPY_PATH, mode="644", batch=paths)
    policy = put(
        name="Write the rig's GPU policy",
        data=render("gpu_policy/gpu-policy.conf.j2", rig_name=rig.name, rig_file=rig.file, gpus=rig.spec.gpus),
        dest=POLICY_PATH, mode="644", batch=paths,
    )
    unit = put(
        name="Install the boot-time GPU policy unit",
        data=render(
            "gpu_policy/rigkit-gpu-policy.service.j2",
            script_path=SCRIPT_PATH, policy_path=POLICY_PATH,
            wait_for_gpus_s=WAIT_FOR_GPUS_S, before_units=[],
        ),
        dest=UNIT_PATH, mode="644", batch=paths,
    )
    systemd.daemon_reload(name="Reload systemd units", _if=unit.did_change)
    units.service(name="Enable the GPU policy at boot", unit=UNIT, batch=(UNIT,), enabled=True, after=(unit,))

    drift = power_drift(rig.spec, report)
    for line in drift:
        logger.warning(f"{host.print_prefix}drift: {line}; re-applying the policy")
    applied = server.shell(
        name="Apply the GPU policy now",
        commands=[_start_or_show_journal("restart")],
        _timeout=WAIT_FOR_GPUS_S + 90,  # the unit's own TimeoutStartSec is WAIT_FOR_GPUS_S + 60
        _if=lambda: bool(drift) or script.did_change() or offsets_tool.did_change() or policy.did_change()
        or unit.did_change(),
    )
    return [applied]


def _remove() -> list:
    if host.get_fact(File, path=UNIT_PATH) is None and host.get_fact(File, path=POLICY_PATH) is None:
        host.noop("GPU policy is not installed")
        return []
    reset = server.shell(
        name="Reset clocks and restore default power limits",
        commands=[f"RIGKIT_GPU_WAIT_S={RESET_WAIT_S} {SCRIPT_PATH} reset {POLICY_PATH}"],
        _timeout=RESET_WAIT_S + 60,  # the script bounds each nvidia-smi call; this bounds the whole
    )
    systemd.service(name="Disable the GPU policy unit", service=UNIT, enabled=False, running=False)
    for path in (UNIT_PATH, POLICY_PATH, SCRIPT_PATH, OFFSETS_TOOL_PATH, NVML_COPY_PATH):
        files.file(name=f"Remove {path}", path=path, present=False)
    systemd.daemon_reload(name="Reload systemd")
    return [reset]


def _start_or_show_journal(verb: str) -> str:
    # On failure the unit's own journal lines say why; show them in the deploy output.
    return (
        f"systemctl {verb} {UNIT} || "
        f"{{ journalctl -u {UNIT} -n 30 --no-pager -o cat; exit 1; }}"
    )
