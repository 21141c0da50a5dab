"""pyinfra operations for Windows rigs (through the `@winssh` connector).

- `file`: put bytes at a Windows path unless the file there already has their SHA-256 (to a
  temporary name, then moved into place: rigkit.windows.upload);
- `scheduled_task`: register a task from its XML unless the installed one, exported,
  is the same task (`rigkit.windows.same_task`);
- `run_task`: run a task now, as logon would, unless it already ran successfully on the
  same inputs. Success is recorded on the rig only after the task finished with result 0,
  so a failed run is run again by the next deploy;
- `uninstall`: run the bundle's uninstall.ps1 (GPUs reset, tasks unregistered, files removed);
  `nothing_installed` says whether there is anything to remove.

The PowerShell each sends is built by a plain function beside it (`*_script`), so tests check
every script on its syntax tree without pyinfra.
"""

from __future__ import annotations

import hashlib
from pathlib import PureWindowsPath

from pyinfra import host
from pyinfra.api import operation

from rigkit.plumbing.render import ps_quote
from rigkit.windows.bundle import same_task
from rigkit.plumbing.facts_once import read_once
from rigkit.windows.facts import ScheduledTaskXml, WindowsFileSha256, WindowsTextFile
from rigkit.windows.install_dir import WindowsInstallDir
from rigkit.windows.names import (
    API_KEY_FILE,
    INSTALL_DIR,
    POWER_SCRIPT,
    TASK_BOOTSTRAP,
    TASK_POWER,
    TASK_WATCHDOG,
    WATCHDOG_CONFIG,
    WATCHDOG_SCRIPT,
    applied_path,
    task_xml_path,
)
from rigkit.windows.upload import upload

TASK_START_S = 20  # a task that has not started by then will not (e.g. its user is not logged on)


@operation()
def file(dest: str, data: bytes):
    if host.get_fact(WindowsFileSha256, path=dest) == hashlib.sha256(data).hexdigest():
        host.noop(f"{dest} is up to date")
        return
    yield from upload(data, dest)  # to a temporary name, then moved into place: never half-written


@operation()
def scheduled_task(task_name: str, xml: str, xml_path: str, as_connecting_user: bool = True):
    """`xml_path`: where `xml` was put on the rig. The task runs as the connecting user (its UserId
    is filled in on the rig, as install.ps1 does), or with `as_connecting_user=False` as its XML says."""
    exported = host.get_fact(ScheduledTaskXml, task_name=task_name)
    if exported is not None and same_task(exported, xml):
        host.noop(f"scheduled task {task_name} is as rendered")
        return
    yield register_task_script(task_name, xml_path, as_connecting_user)


def register_task_script(task_name: str, xml_path: str, as_connecting_user: bool = True) -> str:
    name, path = ps_quote(task_name), ps_quote(xml_path)
    user = ("$xml.Task.Principals.Principal.UserId = '{0}\\{1}' -f $env:USERDOMAIN, $env:USERNAME\n"
            # A logon trigger fires for this user's logon only, not anyone's.
            "if ($xml.Task.Triggers.LogonTrigger) { $xml.Task.Triggers.LogonTrigger.UserId = "
            "$xml.Task.Principals.Principal.UserId }\n")
    return (
        f"# rigkit: register-task {name} {path}\n"
        f"$xml = [xml] (Get-Content -Raw -Encoding UTF8 -LiteralPath {path})\n"
        + (user if as_connecting_user else "")
        + f"Register-ScheduledTask -TaskName {name} -Xml $xml.OuterXml -Force | Out-Null\n"
        f"'{{0}}: registered for {{1}}' -f {name}, $xml.Task.Principals.Principal.UserId"
    )


def inputs_digest(files: dict[str, bytes]) -> str:
    """What a task's run depends on: {path: bytes} of its scripts, XML and compose files."""
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(path.encode() + b"\0" + hashlib.sha256(files[path]).digest())
    return digest.hexdigest()


def task_inputs(installed: dict[str, bytes], api_key_file: bytes | None) -> dict[str, str]:
    """{task: inputs_digest} of what each logon task's run depends on: GPU-PowerPolicy its script
    and XML; the bootstrap every installed file but the watchdog's, and the API key's env file (a
    new key brings the stacks up again). The deploy records it after a successful run; status reads
    it back."""
    watchdog_files = {str(WATCHDOG_SCRIPT), str(WATCHDOG_CONFIG), task_xml_path(TASK_WATCHDOG)}
    bootstrap = {path: data for path, data in installed.items() if path not in watchdog_files}
    if api_key_file is not None:
        bootstrap[str(API_KEY_FILE)] = api_key_file
    power = {p: installed[p] for p in (str(POWER_SCRIPT), task_xml_path(TASK_POWER))}
    return {TASK_POWER: inputs_digest(power), TASK_BOOTSTRAP: inputs_digest(bootstrap)}


def ran_on(task_name: str, inputs: str) -> bool:
    """Whether the task's last successful run had these `inputs` (read from the rig while planning)."""
    return read_once(WindowsTextFile, path=applied_path(task_name)) == inputs


@operation()
def run_task(task_name: str, inputs: str, wait_s: int, log_path: str, force: bool = False):
    """Start the task and wait, bounded, for it to finish; fail with its result and the tail of
    rigkit's log. Skipped when its last successful run had these `inputs` (`inputs_digest`),
    unless `force` (the GPUs drifted, or a weights copy may run first: the caller's `_if` decides)."""
    applied = applied_path(task_name)
    if not force and ran_on(task_name, inputs):
        host.noop(f"{task_name} already ran on these files")
        return
    yield run_task_script(task_name, applied, inputs, wait_s, log_path)


def run_task_script(task_name: str, applied: str, inputs: str, wait_s: int, log_path: str) -> str:
    name, wait_s = ps_quote(task_name), int(wait_s)
    return (
        f"# rigkit: run-task {name} {ps_quote(applied)} {ps_quote(inputs)}\n"
        f"Remove-Item -LiteralPath {ps_quote(applied)} -ErrorAction SilentlyContinue\n"
        f"$before = (Get-ScheduledTaskInfo -TaskName {name}).LastRunTime\n"
        f"Start-ScheduledTask -TaskName {name}\n"
        f"function Test-Started {{ (Get-ScheduledTask -TaskName {name}).State -eq 'Running' -or "
        f"(Get-ScheduledTaskInfo -TaskName {name}).LastRunTime -ne $before }}\n"
        f"$deadline = (Get-Date).AddSeconds({TASK_START_S})\n"
        "while (-not (Test-Started) -and (Get-Date) -lt $deadline) { Start-Sleep -Seconds 1 }\n"
        f"if (-not (Test-Started)) {{ throw ('{{0}} did not start within {TASK_START_S} s: it runs in its "
        f"user''s session; is that user logged on?' -f {name}) }}\n"
        f"$deadline = (Get-Date).AddSeconds({wait_s})\n"
        f"while ((Get-ScheduledTask -TaskName {name}).State -eq 'Running' -and (Get-Date) -lt $deadline) "
        "{ Start-Sleep -Seconds 2 }\n"
        f"Get-Content -LiteralPath {ps_quote(log_path)} -Encoding UTF8 -Tail 30 -ErrorAction SilentlyContinue\n"
        f"if ((Get-ScheduledTask -TaskName {name}).State -eq 'Running') "
        f"{{ throw ('{{0}} still running after {wait_s} s; its log is above' -f {name}) }}\n"
        f"$result = (Get-ScheduledTaskInfo -TaskName {name}).LastTaskResult\n"
        f"if ($result -ne 0) {{ throw ('{{0}} failed with result {{1}}; its log is above' -f {name}, $result) }}\n"
        f"New-Item -ItemType Directory -Force -Path {ps_quote(PureWindowsPath(applied).parent)} | Out-Null\n"
        f"Set-Content -LiteralPath {ps_quote(applied)} -Value {ps_quote(inputs)} -Encoding ASCII"
    )


def nothing_installed(task_names: list[str]) -> bool:
    """No task in `task_names` is registered and INSTALL_DIR is gone (read from the rig)."""
    registered = [t for t in task_names if host.get_fact(ScheduledTaskXml, task_name=t) is not None]
    # The same fact secure_install_dir reads next: asked once.
    return not registered and read_once(WindowsInstallDir) is None


@operation()
def uninstall(script: str, task_names: list[str]):
    """Run `script` (the bundle's uninstall.ps1). The caller checks `nothing_installed` first."""
    yield uninstall_script(script, task_names)


def uninstall_script(script: str, task_names: list[str]) -> str:
    names = " ".join(ps_quote(t) for t in task_names)
    return f"# rigkit: uninstall {ps_quote(INSTALL_DIR)} {names}\n{script}"


WSL_SHUTDOWN_S = 60  # `wsl --shutdown` returns once every WSL2 VM has stopped


@operation()
def restart_wsl():
    """Stop Docker Desktop and shut the WSL2 VM down, so that it starts again with .wslconfig's
    `memory=` and `swap=` (Microsoft: they take effect after `wsl --shutdown`). The bootstrap task,
    which the role then runs, starts Docker Desktop again in the user's session and brings the
    stacks up. The caller runs it only when .wslconfig changed and no model is serving (`_if`)."""
    yield restart_wsl_script()


def restart_wsl_script() -> str:
    return (
        "# rigkit: wsl-shutdown\n"
        # Docker Desktop, left running, would find its VM gone and not bring its engine back by itself.
        "Get-Process -Name 'Docker Desktop' -ErrorAction SilentlyContinue | Stop-Process -Force\n"
        "$info = New-Object System.Diagnostics.ProcessStartInfo\n"
        "$info.FileName = 'wsl.exe'\n"
        "$info.Arguments = '--shutdown'\n"
        "$info.UseShellExecute = $false\n"
        "$info.CreateNoWindow = $true\n"
        "$process = [Diagnostics.Process]::Start($info)\n"
        f"if (-not $process.WaitForExit({WSL_SHUTDOWN_S * 1000})) {{ "
        f"throw 'wsl --shutdown did not return within {WSL_SHUTDOWN_S} s' }}\n"
        "if ($process.ExitCode -ne 0) { throw ('wsl --shutdown failed with exit code {0}' -f $process.ExitCode) }\n"
        "'WSL shut down; Docker Desktop starts again with the new .wslconfig'"
    )
