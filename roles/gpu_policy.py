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
from rigkit.plumbing import systemd_units as units
from rigkit.plumbing.facts_once import Read
from rigkit.plumbing.files import FileStates, put
from rigkit.gpu.accept import check_policy
from rigkit.gpu.keeper import KEEPER_UNITS, SLEEP_TARGETS
from rigkit.gpu.nvsmi import GpuReport
from rigkit.gpu.policy import power_drift
from rigkit.plumbing.render import module_source, render, template_text
from rigkit.rigside.names import (
    GPU_KEEPER_DRIVER_UNIT,
    GPU_KEEPER_PATH,
    GPU_KEEPER_RESUME_UNIT,
    GPU_KEEPER_STATE_PATH,
    GPU_KEEPER_UNIT,
    GPU_OFFSETS_TOOL_PATH,
    GPU_POLICY_NVML_PATH,
    GPU_POLICY_PATH,
    GPU_POLICY_SCRIPT_PATH,
    GPU_POLICY_UNIT,
    GPU_POLICY_UNIT_PATH,
)
from rigkit.plumbing.systemd_units import UnitStates

# Defaults: how long the unit waits for GPUs at boot. Where things go on the rig: rigkit.rigside.names.
WAIT_FOR_GPUS_S = 120
LOCK_WAIT_S = 150  # how long the script waits for a keeper's repair to finish (its own default)
RESET_WAIT_S = 30  # `gpu_policy: remove`: the GPUs answer already (the deploy just read them)
# The keeper (docs/gpu-policy.md#between-deploys; names in rigkit/gpu/keeper.py): a watch of the
# enforced limits, and re-applies on resume from the sleep targets and when nvidia-persistenced (re)starts.
KEEPER_WATCHDOG_S = 30  # a watch stuck this long in a hung NVML call is restarted by systemd
KEEPER_REPAIR_TIMEOUT_S = 180
UNITS = (GPU_POLICY_UNIT, *KEEPER_UNITS)  # read in one command
FILES = (GPU_POLICY_SCRIPT_PATH, GPU_OFFSETS_TOOL_PATH, GPU_POLICY_NVML_PATH, GPU_POLICY_PATH, GPU_POLICY_UNIT_PATH, GPU_KEEPER_PATH,
         *(f"/etc/systemd/system/{u}" for u in KEEPER_UNITS))  # read in one command


def gpu_policy_reads(rig: RigConfig) -> list[Read]:
    """What the role asks the rig while planning (deploy.py reads them ahead, all at once)."""
    if rig.spec.gpu_policy == "remove":
        return []
    return [(FileStates, {"paths": FILES}), (UnitStates, {"units": UNITS})]


@deploy("GPU policy")
def gpu_policy(rig: RigConfig, report: GpuReport, runtime_changes: list = ()) -> list:
    """`report`: the rig's GPUs, already checked against the rig file (roles/gpu_report.py);
    `runtime_changes`: the rig-side runtime's operations (roles/rigside.py), which the keeper imports.
    Returns the operations whose change means the GPUs' settings changed."""
    if rig.spec.gpu_policy == "remove":
        return _remove()
    check_policy(rig, report)

    paths = FILES
    script = put(
        name="Install the GPU policy script",
        data=template_text("gpu_policy/rigkit-gpu-policy.sh"), dest=GPU_POLICY_SCRIPT_PATH, mode="755", batch=paths,
    )
    offsets_tool = put(
        name="Install the clock-offset tool",
        data=template_text("gpu_policy/rigkit-gpu-offsets.py"), dest=GPU_OFFSETS_TOOL_PATH, mode="755", batch=paths,
    )
    put(name="Ship pynvml for the clock-offset tool", data=module_source("pynvml"),
        dest=GPU_POLICY_NVML_PATH, mode="644", batch=paths)
    policy = put(
        name="Write the rig's GPU policy",
        data=render("gpu_policy/gpu-policy.conf.j2", rig_name=rig.name, rig_file=rig.file, gpus=rig.spec.gpus),
        dest=GPU_POLICY_PATH, mode="644", batch=paths,
    )
    unit = put(
        name="Install the boot-time GPU policy unit",
        data=render(
            "gpu_policy/rigkit-gpu-policy.service.j2",
            script_path=GPU_POLICY_SCRIPT_PATH, policy_path=GPU_POLICY_PATH,
            wait_for_gpus_s=WAIT_FOR_GPUS_S, lock_wait_s=LOCK_WAIT_S, before_units=[],
        ),
        dest=GPU_POLICY_UNIT_PATH, mode="644", batch=paths,
    )
    keeper = put(name="Install the GPU policy keeper", data=template_text("gpu_policy/rigkit-gpu-keeper.py"),
                 dest=GPU_KEEPER_PATH, mode="755", batch=paths)
    keeper_units = [put(name=f"Install {name}", data=render(f"gpu_policy/{name}.j2", **_keeper_values()),
                        dest=f"/etc/systemd/system/{name}", mode="644", batch=paths) for name in KEEPER_UNITS]
    systemd.daemon_reload(name="Reload systemd units",
                                   _if=lambda: unit.did_change() or any(u.did_change() for u in keeper_units))
    units.service(name="Enable the GPU policy at boot", unit=GPU_POLICY_UNIT, batch=UNITS, enabled=True, after=(unit,))

    drift = power_drift(rig.spec, report)
    for line in drift:
        logger.warning(f"{host.print_prefix}drift: {line}; re-applying the policy")
    applied = server.shell(
        name="Apply the GPU policy now",
        commands=[_start_or_show_journal("restart")],
        _timeout=LOCK_WAIT_S + WAIT_FOR_GPUS_S + 90,  # the unit's own TimeoutStartSec: their sum + 60
        _if=lambda: bool(drift) or script.did_change() or offsets_tool.did_change() or policy.did_change()
        or unit.did_change(),
    )
    # The keeper after the policy is applied (it holds off until then anyway). The resume and
    # driver units are enabled only: the sleep targets and nvidia-persistenced start them.
    for name in (GPU_KEEPER_RESUME_UNIT, GPU_KEEPER_DRIVER_UNIT):
        units.service(name=f"Enable {name}", unit=name, batch=UNITS, running=None, enabled=True,
                      after=tuple(keeper_units))
    started = units.service(name="Start the GPU policy keeper", unit=GPU_KEEPER_UNIT, batch=UNITS, enabled=True,
                            after=tuple(keeper_units))
    server.shell(name="Restart the GPU policy keeper (new version)", commands=[f"systemctl restart {GPU_KEEPER_UNIT}"],
                 _if=lambda: (keeper.did_change() or keeper_units[0].did_change()
                              or any(op.did_change() for op in runtime_changes))
                 and not (started is not None and started.did_change()))
    return [applied]


def _keeper_values() -> dict:
    return {"keeper_path": GPU_KEEPER_PATH, "policy_unit": GPU_POLICY_UNIT, "state_path": GPU_KEEPER_STATE_PATH,
            "sleep_targets": SLEEP_TARGETS, "watchdog_s": KEEPER_WATCHDOG_S, "timeout_s": KEEPER_REPAIR_TIMEOUT_S}


def _remove() -> list:
    if host.get_fact(File, path=GPU_POLICY_UNIT_PATH) is None and host.get_fact(File, path=GPU_POLICY_PATH) is None:
        host.noop("GPU policy is not installed")
        return []
    for name in KEEPER_UNITS:  # first: the keeper must not re-apply what the reset undoes
        systemd.service(name=f"Stop and disable {name}", service=name, enabled=False, running=False)
    reset = server.shell(
        name="Reset clocks and restore default power limits",
        commands=[f"RIGKIT_GPU_WAIT_S={RESET_WAIT_S} {GPU_POLICY_SCRIPT_PATH} reset {GPU_POLICY_PATH}"],
        _timeout=RESET_WAIT_S + 60,  # the script bounds each nvidia-smi call; this bounds the whole
    )
    systemd.service(name="Disable the GPU policy unit", service=GPU_POLICY_UNIT, enabled=False, running=False)
    for path in (GPU_POLICY_UNIT_PATH, GPU_POLICY_PATH, GPU_POLICY_SCRIPT_PATH, GPU_OFFSETS_TOOL_PATH, GPU_POLICY_NVML_PATH, GPU_KEEPER_PATH,
                 *(f"/etc/systemd/system/{u}" for u in KEEPER_UNITS)):
        files.file(name=f"Remove {path}", path=path, present=False)
    systemd.daemon_reload(name="Reload systemd")
    return [reset]


def _start_or_show_journal(verb: str) -> str:
    # On failure the unit's own journal lines say why; show them in the deploy output.
    return (
        f"systemctl {verb} {GPU_POLICY_UNIT} || "
        f"{{ journalctl -u {GPU_POLICY_UNIT} -n 30 --no-pager -o cat; exit 1; }}"
    )
