"""Role windows (a Windows 11 rig over the `@winssh` connector): the offline bundle's
work, done over SSH and idempotently.

Puts the two tasks' scripts, their XML and the models' compose files under
C:\\ProgramData\\rigkit (each only if its SHA-256 differs), registers `GPU-PowerPolicy`
and `LocalLLM-Bootstrap` (only if the exported task differs from the rendered one),
then runs them now, the way logon would: each task unless it already ran successfully
on exactly these files (recorded on the rig after a successful run only), and both
when a power limit drifted from the policy (as on Linux: a GPU without a cap should be
at its driver's default). GPU-PowerPolicy's script is the only one that sets limits and
clocks; the bootstrap runs it again before it waits for Docker, brings up the stacks
and warms each model.
The SSH user should be the administrator who logs on at the rig: the logon tasks run as
that user (Docker Desktop's context is per user).

With the rig's `api_key_file`, the key's env file goes to C:\\ProgramData\\rigkit\\secrets, readable by
SYSTEM and Administrators only (rigkit.windows.private_file), and the compose files reference it.
The watchdog (rigkit.windows.watchdog) is a third task, LocalLLM-Watchdog, as SYSTEM.
Before any of it, C:\\ProgramData\\rigkit itself is secured (rigkit.windows.install_dir): owned by
Administrators, SYSTEM and Administrators only, whoever made it first.

With `gpu_policy: remove` in the rig file it runs the bundle's uninstall.ps1 instead:
GPUs back to default limits with clocks reset, the tasks unregistered, the folder
removed (nothing is done when nothing of rigkit's is there).

Models with `weights.storage: volume` get their weights copied onto their volumes first, as on
Linux (rigkit.windows.weights: the same copier, through Docker Desktop's Engine); a model whose
weights were copied again is marked (C:\\ProgramData\\rigkit\\recreate\\<model>.txt) and the bootstrap
runs, recreating its stack on them (Linux's rollout does the same).

Checks first, as on Linux: the GPUs (read through nvidia-smi.exe) are the rig file's, caps
within the driver's range, PSU budget; and the bootstrap's time fits (rigkit.windows.timing).
"""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.api.exceptions import DeployError

from rigkit.config.schema import RigConfig
from rigkit.gpu.gate import accept_gpus, check_policy
from rigkit.gpu.policy import power_drift
from rigkit.serving.api_key import SecretFileError, api_key_env_file, read_api_key
from rigkit.windows import operations as winops
from rigkit.windows.bundle import (
    API_KEY_FILE,
    INSTALL_DIR,
    LOG_PATH,
    POWER_SCRIPT,
    TASK_BOOTSTRAP,
    TASK_POWER,
    TASKS,
    installed_files,
    recreate_marker,
    render_bundle,
    task_xml_path,
)
from rigkit.windows.facts import WindowsNvidiaGpus
from rigkit.windows.install_dir import secure_install_dir
from rigkit.windows.private_file import private_file
from rigkit.windows.timing import POWER_TASK_WAIT_S, bootstrap_budget, timing_findings
from rigkit.windows.watchdog import CONFIG_NAME, SCRIPT_NAME, TASK_WATCHDOG
from rigkit.windows.weights import weights_onto_volumes

SECURE_NAME = f"Secure {INSTALL_DIR}: owned by Administrators, SYSTEM and Administrators only"


@deploy("Windows rig")
def windows(rig: RigConfig, verify_weights: bool = False) -> list:
    """Returns the operations after which the served models should be verified: the weights
    copies and the two task runs (the policy applied, the stacks brought up)."""
    for warning in rig.warnings:
        logger.warning(f"{host.print_prefix}serving config: {warning}")
    report = accept_gpus(rig, host.get_fact(WindowsNvidiaGpus))
    bundle = render_bundle(rig)
    installed = installed_files(bundle)
    if rig.spec.gpu_policy == "remove":
        _remove(bundle, installed)
        return []
    check_policy(rig, report)
    errors, warnings = timing_findings(rig)
    if errors:
        raise DeployError(f"rig {rig.name}, nothing was changed: " + "; ".join(str(e) for e in errors))
    for warning in warnings:
        logger.warning(f"{host.print_prefix}{warning}")
    try:
        api_key = read_api_key(rig)
    except SecretFileError as exc:
        raise DeployError(f"rig {rig.name}, nothing was changed: {exc}") from None

    # What a bootstrap run depends on: the files it reads (not the watchdog's), and the key.
    watchdog_files = {str(INSTALL_DIR / SCRIPT_NAME), str(INSTALL_DIR / CONFIG_NAME), task_xml_path(TASK_WATCHDOG)}
    bootstrap_inputs = {path: data for path, data in installed.items() if path not in watchdog_files}
    # Before anything is put there: a user who made the folder first would own it (install_dir).
    secure_install_dir(name=SECURE_NAME)
    if api_key is not None:
        key_data = api_key_env_file(api_key)
        private_file(name="Install the API key (SYSTEM and Administrators only)", dest=str(API_KEY_FILE),
                     data=key_data)
        bootstrap_inputs[str(API_KEY_FILE)] = key_data  # a new key: the stacks come up again with it
    for path, data in installed.items():
        winops.file(name=f"Put {path}", dest=path, data=data)
    for task in TASKS:
        winops.scheduled_task(
            name=f"Register scheduled task {task}", task_name=task,
            xml=bundle[f"tasks/{task}.xml"], xml_path=task_xml_path(task),
            as_connecting_user=task != TASK_WATCHDOG,  # the watchdog runs as SYSTEM
        )

    # Weights onto their volumes before the bootstrap brings the stacks up on them.
    copied = weights_onto_volumes(rig, verify=verify_weights)

    drift = power_drift(rig.spec, report)
    for line in drift:
        logger.warning(f"{host.print_prefix}drift: {line}; re-applying the power policy")
    power_files = {p: installed[p] for p in (str(POWER_SCRIPT), task_xml_path(TASK_POWER))}
    power_run = winops.run_task(
        name=f"Run {TASK_POWER} now", task_name=TASK_POWER, inputs=winops.inputs_digest(power_files),
        wait_s=POWER_TASK_WAIT_S, log_path=str(LOG_PATH), force=bool(drift),
    )
    # Weights copied again: the bootstrap recreates that model's stack (its container still serves
    # the old weights; compose would leave it running), as Linux's rollout does.
    copies = list(copied.values())
    for model_name, copy in copied.items():
        winops.file(name=f"Mark {model_name} to be recreated on its new weights", dest=recreate_marker(model_name),
                    data=b"weights copied again\r\n", _if=copy.did_change)
    inputs = winops.inputs_digest(bootstrap_inputs)
    stale = bool(drift) or not winops.ran_on(TASK_BOOTSTRAP, inputs)
    bootstrap_run = winops.run_task(
        name=f"Run {TASK_BOOTSTRAP} now", task_name=TASK_BOOTSTRAP, inputs=inputs,
        wait_s=bootstrap_budget(rig).deploy_wait_s, log_path=str(LOG_PATH), force=stale or bool(copies),
        _if=lambda: stale or any(copy.did_change() for copy in copies),
    )
    return [*copied.values(), power_run, bootstrap_run]


def _remove(bundle: dict[str, str], installed: dict[str, bytes]) -> None:
    # The reset runs through the one script that sets limits and clocks, in its current
    # version: it is put first (uninstall.ps1 then removes it with the rest).
    tasks = list(TASKS)
    if winops.nothing_installed(tasks):
        host.noop("rigkit's GPU policy and tasks are not installed")
        return
    secure_install_dir(name=SECURE_NAME)  # the reset script runs elevated: nobody else may swap it
    winops.file(name=f"Put {POWER_SCRIPT} for the reset", dest=str(POWER_SCRIPT), data=installed[str(POWER_SCRIPT)])
    winops.uninstall(
        name="Reset GPUs to default limits and clocks, unregister the tasks, remove C:\\ProgramData\\rigkit",
        script=bundle["uninstall.ps1"], task_names=tasks,
    )
