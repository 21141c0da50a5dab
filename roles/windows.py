"""Role windows (a Windows 11 rig over the `@winssh` connector): the offline bundle's
work, done over SSH and idempotently.

Puts the two tasks' scripts, their XML and the models' compose files under
C:\\ProgramData\\rigkit (each only if its SHA-256 differs), registers `GPU-PowerPolicy`
and `LocalLLM-Bootstrap` (only if the exported task differs from the rendered one),
then runs them now, the way logon would: each task unless it already ran successfully
on exactly these files (recorded on the rig after a successful run only), and both
when a power limit drifted. The bootstrap locks clocks, waits for Docker, brings up
the stacks and warms each model.
The SSH user should be the administrator who logs on at the rig: the tasks run as
that user (Docker Desktop's context is per user).

Checks first, as on Linux: the GPUs (read through nvidia-smi.exe) are the rig file's, caps within the driver's
range, PSU budget.
"""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import deploy

from rigkit.config.schema import RigConfig
from rigkit.gpu.gate import accept_gpus, check_policy
from rigkit.windows import operations as winops
from rigkit.windows.bundle import (
    LOG_PATH,
    POWER_SCRIPT,
    TASK_BOOTSTRAP,
    TASK_POWER,
    installed_files,
    render_bundle,
    task_xml_path,
)
from rigkit.windows.facts import WindowsNvidiaGpus
from rigkit.windows.policy import capped_power_drift

# Defaults: how long a deploy waits for each task it runs (the bootstrap's own limit is 15 min).
POWER_TASK_WAIT_S = 300
BOOTSTRAP_TASK_WAIT_S = 960


@deploy("Windows rig")
def windows(rig: RigConfig) -> None:
    report = accept_gpus(rig, host.get_fact(WindowsNvidiaGpus))
    check_policy(rig, report)

    bundle = render_bundle(rig)
    installed = installed_files(bundle)
    for path, data in installed.items():
        winops.file(name=f"Put {path}", dest=path, data=data)
    for task in (TASK_POWER, TASK_BOOTSTRAP):
        winops.scheduled_task(
            name=f"Register scheduled task {task}", task_name=task,
            xml=bundle[f"tasks/{task}.xml"], xml_path=task_xml_path(task),
        )

    drift = capped_power_drift(rig.spec, report)
    for line in drift:
        logger.warning(f"{host.print_prefix}drift: {line}; re-applying the power policy")
    power_files = {p: installed[p] for p in (str(POWER_SCRIPT), task_xml_path(TASK_POWER))}
    winops.run_task(
        name=f"Run {TASK_POWER} now", task_name=TASK_POWER, inputs=winops.inputs_digest(power_files),
        wait_s=POWER_TASK_WAIT_S, log_path=str(LOG_PATH), force=bool(drift),
    )
    winops.run_task(
        name=f"Run {TASK_BOOTSTRAP} now", task_name=TASK_BOOTSTRAP, inputs=winops.inputs_digest(installed),
        wait_s=BOOTSTRAP_TASK_WAIT_S, log_path=str(LOG_PATH), force=bool(drift),
    )
