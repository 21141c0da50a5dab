"""Windows rigs: the two scheduled tasks (Task Scheduler XML), the PowerShell they run, the
offline bundle a person installs with one elevated `install.ps1` (and removes with
`uninstall.ps1`), and the same files laid out as a deploy over SSH installs them. Pure
rendering; nothing here talks to a rig.

Values reach PowerShell only as single-quoted literals (`ps_quote`) or validated integers,
and XML only through Jinja's XML autoescaping. Every path and task name on the rig is
rigkit.windows.names'; the bundle's scripts/ folder is laid out as INSTALL_DIR is.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path, PurePosixPath, PureWindowsPath

from rigkit.config.schema import RigConfig
from rigkit.plumbing.render import render
from rigkit.rigside.keyfile import API_KEY_ENV_NAME
from rigkit.rigside.names import served_name
from rigkit.serving.compose import render_compose
from rigkit.windows.install_dir import secure_install_script
from rigkit.windows.names import (
    API_KEY_FILE,
    BOOTSTRAP_SCRIPT,
    DOCKER_DESKTOP,
    INSTALL_DIR,
    LOG_PATH,
    POWER_SCRIPT,
    ROLLOUT_LOCK,
    TASK_BOOTSTRAP,
    TASK_POWER,
    TASK_WATCHDOG,
    TASKS,
    WATCHDOG_CONFIG,
    WATCHDOG_SCRIPT,
    compose_path,
    recreate_marker,
    task_xml_path,
)
from rigkit.windows.timing import DOCKER_WAIT_S, POWER_TASK_LIMIT, bootstrap_budget
from rigkit.windows.upload import UPLOAD_SUFFIX
from rigkit.windows.watchdog import watchdog_script, watchdog_settings, watchdog_task_xml

# Filled with the installing user by install.ps1 (the task runs as the logged-in user).
USER_PLACEHOLDER = "RIGKIT-INSTALLING-USER"
_TASK_NS = "{http://schemas.microsoft.com/windows/2004/02/mit/task}"
# GPU-PowerPolicy also runs on resume: Windows loses power limits over sleep (mVolt#32). The System
# log's resume events: Kernel-Power 107 ("The system has resumed from sleep") and
# Power-Troubleshooter 1 ("The system has returned from a low power state"); one resume writes
# both, and the task's IgnoreNew runs it once. The delay lets the driver settle after resume.
RESUME_EVENTS = (("Microsoft-Windows-Kernel-Power", 107), ("Microsoft-Windows-Power-Troubleshooter", 1))
RESUME_DELAY = "PT10S"


def resume_subscription() -> str:
    """The event query (a QueryList) the resume trigger subscribes to; the template escapes it."""
    select = " or ".join(f"*[System[Provider[@Name='{provider}'] and EventID={event}]]"
                         for provider, event in RESUME_EVENTS)
    return (f'<QueryList><Query Id="0" Path="System"><Select Path="System">{select}</Select>'
            "</Query></QueryList>")


def render_bundle(rig: RigConfig) -> dict[str, str]:
    """{path inside the bundle: content}."""
    gpus = rig.spec.gpus
    budget = bootstrap_budget(rig)
    key_file = str(API_KEY_FILE) if rig.spec.api_key_file else None
    logs = {"log_path": str(LOG_PATH), "log_dir": str(LOG_PATH.parent)}
    stacks = [
        {
            "name": m.name,
            "compose_file": compose_path(m.name),
            "port": m.spec.port,
            "served_name": served_name(m),
            "ready_timeout_s": m.spec.ready_timeout_s,
            "recreate_marker": recreate_marker(m.name),
        }
        for m in rig.models
    ]
    files = {
        _in_scripts(POWER_SCRIPT): render(
            "windows/gpu-power-policy.ps1.j2", rig_name=rig.name, gpus=gpus, log_source=TASK_POWER, **logs),
        _in_scripts(BOOTSTRAP_SCRIPT): render(
            "windows/llm-bootstrap.ps1.j2", rig_name=rig.name, stacks=stacks, power_script=str(POWER_SCRIPT),
            power_task=TASK_POWER, docker_desktop_path=str(DOCKER_DESKTOP), docker_wait_s=DOCKER_WAIT_S,
            budget_s=budget.total_s, key_file=key_file, api_key_env_name=API_KEY_ENV_NAME,
            lock_path=str(ROLLOUT_LOCK), log_source=TASK_BOOTSTRAP, **logs),
        f"tasks/{TASK_POWER}.xml": render(
            "windows/task-gpu-power-policy.xml.j2", rig_name=rig.name, task_name=TASK_POWER, user=USER_PLACEHOLDER,
            script_path=str(POWER_SCRIPT), execution_time_limit=POWER_TASK_LIMIT,
            resume_subscription=resume_subscription(), resume_delay=RESUME_DELAY),
        f"tasks/{TASK_BOOTSTRAP}.xml": render(
            "windows/task-llm-bootstrap.xml.j2", rig_name=rig.name, task_name=TASK_BOOTSTRAP, user=USER_PLACEHOLDER,
            script_path=str(BOOTSTRAP_SCRIPT), execution_time_limit=budget.task_duration()),
        "install.ps1": render(
            "windows/install.ps1.j2", rig_name=rig.name, install_dir=str(INSTALL_DIR),
            secure_install=secure_install_script().split("\n", 1)[1],
            task_names=list(TASKS), system_tasks=[TASK_WATCHDOG], key_file=key_file, upload_suffix=UPLOAD_SUFFIX),
        "uninstall.ps1": render(
            "windows/uninstall.ps1.j2", rig_name=rig.name, install_dir=str(INSTALL_DIR),
            power_script=str(POWER_SCRIPT), task_names=list(TASKS)),
        _in_scripts(WATCHDOG_SCRIPT): watchdog_script(rig),
        _in_scripts(WATCHDOG_CONFIG): watchdog_settings(rig, key_file),
        f"tasks/{TASK_WATCHDOG}.xml": watchdog_task_xml(rig),
    }
    for model in rig.models:
        files[_in_scripts(compose_path(model.name))] = render_compose(
            model, with_api_key=key_file is not None, env_file=str(API_KEY_FILE), host=rig.spec.serve_address,
            publish=True)
    return files


def _in_scripts(rig_path: PureWindowsPath | str) -> str:
    """A file's path in the bundle's scripts/ folder, which install.ps1 copies into INSTALL_DIR as it
    is laid out there (installed_files does the same over SSH)."""
    return "scripts/" + PureWindowsPath(rig_path).relative_to(INSTALL_DIR).as_posix()


def file_bytes(relative: str, content: str) -> bytes:
    """A bundle file as it lands on Windows: CRLF, and for scripts a BOM, which is what
    Windows PowerShell 5.1 needs to read them as UTF-8 rather than the ANSI code page."""
    data = content.replace("\r\n", "\n").replace("\n", "\r\n").encode("utf-8")
    return (b"\xef\xbb\xbf" if relative.endswith(".ps1") else b"") + data


STACKS_DIR = "scripts/stacks"  # install.ps1 installs every stack it finds here


def is_bundle(folder: Path) -> bool:
    """Whether `folder` holds a bundle written earlier (rewritten in place; other folders are not)."""
    return (folder / "install.ps1").is_file() and (folder / "scripts").is_dir()


def write_bundle(rig: RigConfig, out_dir: Path) -> list[Path]:
    """Write the bundle into `out_dir` (new, empty, or an earlier bundle). An earlier bundle's stacks
    go first: a model the rig file no longer serves must not be installed by install.ps1."""
    import shutil

    stacks = Path(out_dir) / STACKS_DIR
    if is_bundle(Path(out_dir)) and stacks.is_dir() and not stacks.is_symlink():
        shutil.rmtree(stacks)
    written = []
    for relative, content in render_bundle(rig).items():
        path = Path(out_dir) / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(file_bytes(relative, content))
        written.append(path)
    return written


def installed_files(bundle: dict[str, str]) -> dict[str, bytes]:
    """{Windows path: bytes} a deploy over SSH puts on the rig, from `render_bundle`: the bundle's
    scripts and compose files where install.ps1 copies them, the tasks' XML beside them in `tasks`."""
    return {
        _installed_path(relative): file_bytes(relative, content)
        for relative, content in bundle.items()
        if relative.startswith(("scripts/", "tasks/"))
    }


def _installed_path(relative: str) -> str:
    if relative.startswith("tasks/"):
        return task_xml_path(PurePosixPath(relative).stem)
    return str(INSTALL_DIR / PureWindowsPath(relative.removeprefix("scripts/")))


def same_task(exported_xml: str, rendered_xml: str) -> bool:
    """Whether an installed task (Export-ScheduledTask) is the rendered one. Windows adds
    RegistrationInfo/Date and Author and reformats, so both are canonicalised first; the
    principal's user is compared only where the rendered task names one (SYSTEM), not where
    install fills it in."""
    keep_user = USER_PLACEHOLDER not in rendered_xml
    return _canonical(exported_xml, keep_user) == _canonical(rendered_xml, keep_user)


def _canonical(text: str, keep_user: bool = False) -> str:
    # Export-ScheduledTask declares UTF-16; as text, the declaration only gets in the way.
    root = ET.fromstring(re.sub(r"^\s*<\?xml[^>]*\?>", "", text))
    info = root.find(f"{_TASK_NS}RegistrationInfo")
    if info is not None:
        for name in ("Date", "Author", "Version", "SecurityDescriptor", "Source", "Documentation"):
            for element in info.findall(f"{_TASK_NS}{name}"):
                info.remove(element)
    for user in root.iter(f"{_TASK_NS}UserId"):
        user.text = user.text if keep_user else ""
    for element in root.iter():
        element.text = (element.text or "").strip() or None
        element.tail = None
    return ET.tostring(root, encoding="unicode")
