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
SYSTEM and Administrators only (rigkit.windows.acl_file), and the compose files reference it.
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
within the driver's range, PSU budget; the bootstrap's time fits (rigkit.windows.timing); and the
Windows preflight (rigkit.windows.preflight): Docker Desktop on WSL2, the GPUs inside a container,
driver and architectures against the images, the WSL2 VM's memory, disk for the weights. With the
rig's `wsl_memory_gb`/`wsl_swap_gb`, %UserProfile%\\.wslconfig gets them and WSL is restarted
(`wsl --shutdown`) when they changed and no model is serving; the bootstrap then runs.
"""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.api.exceptions import DeployError

from rigkit.config.schema import RigConfig
from rigkit.gpu.accept import accept_gpus, check_policy
from rigkit.gpu.policy import power_drift
from rigkit.serving.api_key import SecretFileError, api_key_env_file, read_api_key
from rigkit.windows import operations as winops
from rigkit.windows.bundle import installed_files, render_bundle
from rigkit.windows.facts import WindowsNvidiaGpus, WindowsPreflightFacts
from rigkit.windows.install_dir import secure_install_dir
from rigkit.windows.names import (
    API_KEY_FILE,
    INSTALL_DIR,
    LOG_PATH,
    POWER_SCRIPT,
    TASK_BOOTSTRAP,
    TASK_POWER,
    TASK_WATCHDOG,
    TASKS,
    WSLCONFIG_NAME,
    recreate_marker,
    task_xml_path,
)
from rigkit.windows.preflight import (
    docker_desktop_version,
    preflight_problems,
    serving_models,
    vm_applied,
    wslconfig_text,
)
from rigkit.windows.acl_file import private_file
from rigkit.windows.timing import POWER_TASK_WAIT_S, bootstrap_budget, timing_findings
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
    wslconfig, restart_wsl = _preflight(rig)

    key_data = api_key_env_file(api_key) if api_key is not None else None
    inputs = winops.task_inputs(installed, key_data)  # what each task's run depends on
    # Before anything is put there: a user who made the folder first would own it (install_dir).
    secure_install_dir(name=SECURE_NAME)
    if key_data is not None:
        private_file(name="Install the API key (SYSTEM and Administrators only)", dest=str(API_KEY_FILE),
                     data=key_data)
    for path, data in installed.items():
        winops.file(name=f"Put {path}", dest=path, data=data)
    if wslconfig is not None:
        winops.file(name=f"Put {wslconfig[0]} (the WSL2 VM's memory and swap)", dest=wslconfig[0],
                    data=wslconfig[1].encode())
    for task in TASKS:
        winops.scheduled_task(
            name=f"Register scheduled task {task}", task_name=task,
            xml=bundle[f"tasks/{task}.xml"], xml_path=task_xml_path(task),
            as_connecting_user=task != TASK_WATCHDOG,  # the watchdog runs as SYSTEM
        )

    # Weights onto their volumes before the bootstrap brings the stacks up on them.
    copied = weights_onto_volumes(rig, verify=verify_weights)

    # After the weights copy (it needs the engine), before the bootstrap, which starts Docker Desktop again.
    if restart_wsl:
        winops.restart_wsl(name="Restart WSL with the new .wslconfig (Docker Desktop stopped; the bootstrap starts it)")
    drift = power_drift(rig.spec, report)
    for line in drift:
        logger.warning(f"{host.print_prefix}drift: {line}; re-applying the power policy")
    power_run = winops.run_task(
        name=f"Run {TASK_POWER} now", task_name=TASK_POWER, inputs=inputs[TASK_POWER],
        wait_s=POWER_TASK_WAIT_S, log_path=str(LOG_PATH), force=bool(drift),
    )
    # Weights copied again: the bootstrap recreates that model's stack (its container still serves
    # the old weights; compose would leave it running), as Linux's rollout does.
    copies = list(copied.values())
    for model_name, copy in copied.items():
        winops.file(name=f"Mark {model_name} to be recreated on its new weights", dest=recreate_marker(model_name),
                    data=b"weights copied again\r\n", _if=copy.did_change)
    stale = bool(drift) or restart_wsl or not winops.ran_on(TASK_BOOTSTRAP, inputs[TASK_BOOTSTRAP])
    bootstrap_run = winops.run_task(
        name=f"Run {TASK_BOOTSTRAP} now", task_name=TASK_BOOTSTRAP, inputs=inputs[TASK_BOOTSTRAP],
        wait_s=bootstrap_budget(rig).deploy_wait_s, log_path=str(LOG_PATH), force=stale or bool(copies),
        _if=lambda: stale or any(copy.did_change() for copy in copies),
    )
    return [*copied.values(), power_run, bootstrap_run]


def _preflight(rig: RigConfig) -> tuple[tuple[str, str] | None, bool]:
    """The Windows preflight: raises DeployError (nothing changed) with every refusal. Returns
    (.wslconfig's path and wanted text, or None where rigkit leaves it alone; whether to restart WSL)."""
    image = rig.models[0].spec.image if rig.models else None
    sources = {m.name: m.spec.weights.source for m in rig.models if m.spec.weights.storage == "volume"}
    facts = host.get_fact(WindowsPreflightFacts, image=image, sources=sources)
    wanted = wslconfig_text(facts.wslconfig, rig.spec.wsl_memory_gb, rig.spec.wsl_swap_gb)
    changed = wanted is not None and wanted != facts.wslconfig
    pending = changed or (rig.spec.wsl_memory_gb is not None and not vm_applied(rig, facts))
    serving = serving_models(rig, facts)
    problems = preflight_problems(rig, facts, image, pending and not serving)
    if problems:
        raise DeployError(f"rig {rig.name} ({rig.file}), nothing was changed: " + "; ".join(problems))
    if pending and serving:
        logger.warning(f"{host.print_prefix}.wslconfig: {', '.join(serving)} serving, so WSL is not restarted now; "
                       "the WSL2 VM gets wsl_memory_gb/wsl_swap_gb at the next `wsl --shutdown` or reboot")
    if facts.gpu is not None and facts.gpu.exit_code != 0:
        logger.warning(f"{host.print_prefix}preflight: {image} is not pulled yet, so the GPUs inside a container, "
                       "the driver minimum and the architectures are checked by the next deploy (the bootstrap pulls it)")
    memory = facts.info_json().get("MemTotal")
    logger.info(f"{host.print_prefix}preflight: Docker Desktop {docker_desktop_version(facts)} on WSL2, "
                + (f"VM memory {memory / 1024 ** 3:.1f} GB" if isinstance(memory, int) else "VM memory unknown"))
    path = f"{facts.user_profile}\\{WSLCONFIG_NAME}"
    return ((path, wanted) if wanted is not None and facts.user_profile else None), pending and not serving


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
        name=f"Reset GPUs to default limits and clocks, unregister the tasks, remove {INSTALL_DIR}",
        script=bundle["uninstall.ps1"], task_names=tasks,
    )
