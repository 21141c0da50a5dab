"""pyinfra facts read from a Windows rig through the `@winssh` connector, in PowerShell.

Each script's first line says what it is (`# rigkit: <what> <argument>`), which is what
a reader of the rig's logs sees. Every script exits 0 and says "absent" in its output, so
"not there" is never confused with "the query failed". `requires_command` stays unset:
pyinfra's check for it is POSIX shell.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import PureWindowsPath

from pyinfra.api import FactBase

from rigkit.gpu.nvsmi import EXIT_MARK, GpuReport, parse_query, query_arguments
from rigkit.plumbing.render import ps_quote
from rigkit.weights.layout import source_layout
from rigkit.windows.names import DOCKER_DESKTOP_DISK_DIR, WSLCONFIG_NAME
from rigkit.windows.preflight import PreflightFacts, parse_preflight

ABSENT = "rigkit-absent"


def _if_file(what: str, path: str, expression: str) -> str:
    """`expression` (which reads `$path`) where the file exists, else the ABSENT mark."""
    return (
        f"# rigkit: {what} {ps_quote(path)}\n"
        f"$path = {ps_quote(path)}\n"
        f"if (Test-Path -LiteralPath $path -PathType Leaf) {{ {expression} }} else {{ {ps_quote(ABSENT)} }}"
    )


def _unless_absent(output) -> str | None:
    value = "\n".join(output).strip()
    return None if value == ABSENT else value


class WindowsFileSha256(FactBase):
    """The SHA-256 (lower-case hex) of a file on the rig, or None where there is none."""

    def command(self, path: str) -> str:
        return _if_file("file-sha256", path, "(Get-FileHash -Algorithm SHA256 -LiteralPath $path).Hash")

    def process(self, output) -> str | None:
        value = _unless_absent(output)
        return value and value.lower()


class WindowsTextFile(FactBase):
    """A small text file's content (stripped), or None where there is none."""

    def command(self, path: str) -> str:
        return _if_file("read-text", path, "Get-Content -Raw -Encoding UTF8 -LiteralPath $path")

    def process(self, output) -> str | None:
        return _unless_absent(output)


class ScheduledTaskXml(FactBase):
    """A scheduled task in the root folder as Export-ScheduledTask writes it, or None."""

    def command(self, task_name: str) -> str:
        name = ps_quote(task_name)
        return (
            f"# rigkit: export-task {name}\n"
            f"if (Get-ScheduledTask -TaskName {name} -TaskPath '\\' -ErrorAction SilentlyContinue) "
            f"{{ Export-ScheduledTask -TaskName {name} -TaskPath '\\' }} else {{ {ps_quote(ABSENT)} }}"
        )

    def process(self, output) -> str | None:
        return _unless_absent(output)


class WindowsNvidiaGpus(FactBase):
    """The rig's GPUs through nvidia-smi.exe (same fields and report as `rigkit.gpu.facts.NvidiaGpus`):
    None where nvidia-smi.exe is not installed, a report with `error` where it failed."""

    def command(self) -> str:
        arguments = " ".join(ps_quote(a) for a in query_arguments())
        return (
            "# rigkit: nvidia-smi\n"
            # Windows PowerShell turns a native program's stderr into errors; 'Stop' would throw.
            "$ErrorActionPreference = 'Continue'\n"
            f"if (-not (Get-Command nvidia-smi.exe -ErrorAction SilentlyContinue)) {{ {ps_quote(ABSENT)}; exit 0 }}\n"
            f"& nvidia-smi.exe {arguments} 2>&1 | ForEach-Object {{ [string] $_ }}\n"
            f"{ps_quote(EXIT_MARK + '{0}')} -f $LASTEXITCODE\n"
            "exit 0"
        )

    def process(self, output) -> GpuReport | None:
        lines = list(output)
        if [line.strip() for line in lines] == [ABSENT]:
            return None
        return parse_query(lines)


class WindowsWeightsVolumeState(FactBase):
    """Is a model's weights volume complete and the source's copy? The same answer as
    `rigkit.weights.facts.WeightsVolumeStates`, from the same copier's `check`. Docker Desktop keeps
    volumes inside its VM, out of the shell's reach, so the check runs in a throwaway container:
    the copier (put on the rig by the Windows role), the source and the volume all mounted
    read-only, no network, no pull, removed when done. It reads metadata only, so planning (and
    `--dry`) changes nothing; each docker.exe call has a deadline (INSPECT_TIMEOUT_S,
    CHECK_TIMEOUT_S). `unreachable` (the copier is not on the rig yet, or Docker did not answer,
    with `why` where it did not answer in time): the copy operation checks through its helper instead."""

    def command(self, volume: str, source: str, image: str, copier: str) -> str:
        return weights_check_script(volume, source, image, copier)

    def process(self, output) -> dict:
        lines = [line for line in output if line.strip()]
        try:
            return json.loads(lines[-1])
        except (IndexError, ValueError):
            # No answer from the copier (e.g. the image is not pulled yet): the copy operation
            # checks through its helper, which pulls, and reports what really failed.
            return {"status": "unreachable", "why": " ".join(lines)[-300:]}


# How long the weights check waits for docker.exe (Docker Desktop's engine may be starting or
# wedged): `volume inspect` answers at once from a running engine; the check container stats the
# source over 9P and reads the volume's manifest.
INSPECT_TIMEOUT_S = 30
CHECK_TIMEOUT_S = 180

# docker.exe as a process with a deadline (a native call under & has none), stdout and stderr
# together; `$CommandLine` is one Windows command line (Python's list2cmdline, the MS C runtime's
# quoting), so no argument is split or joined by PowerShell.
_INVOKE_DOCKER = (
    "function Invoke-Docker([string] $CommandLine, [int] $TimeoutS) {\n"
    "    $info = New-Object System.Diagnostics.ProcessStartInfo\n"
    "    $info.FileName = 'docker.exe'\n"
    "    $info.Arguments = $CommandLine\n"
    "    $info.UseShellExecute = $false\n"
    "    $info.RedirectStandardOutput = $true\n"
    "    $info.RedirectStandardError = $true\n"
    "    $info.CreateNoWindow = $true\n"
    "    try { $process = [Diagnostics.Process]::Start($info) } "
    "catch { return @{ ExitCode = -1; TimedOut = $false; Output = [string] $_ } }\n"
    "    $out = $process.StandardOutput.ReadToEndAsync()\n"
    "    $err = $process.StandardError.ReadToEndAsync()\n"
    "    if (-not $process.WaitForExit($TimeoutS * 1000)) {\n"
    "        try { $process.Kill() } catch { }\n"
    "        return @{ ExitCode = -1; TimedOut = $true; Output = '' }\n"
    "    }\n"
    "    return @{ ExitCode = $process.ExitCode; TimedOut = $false; Output = $out.Result + $err.Result }\n"
    "}\n"
)


def _unreachable(why: str | None = None) -> str:
    return ps_quote(json.dumps({"status": "unreachable", **({"why": why} if why else {})}))


def weights_check_script(volume: str, source: str, image: str, copier: str) -> str:
    root, inside = source_layout(source)
    copier_dir = str(PureWindowsPath(copier).parent)
    script = f"/rigkit/{PureWindowsPath(copier).name}"
    mounts = (f"type=bind,source={copier_dir},target=/rigkit,readonly",
              f"type=bind,source={root},target=/src,readonly",
              f"type=volume,source={volume},target=/dst,readonly")
    inspect = ["volume", "inspect", "--format", "{{.Name}}", volume]
    run = ["run", "--rm", "--pull", "never", "--network", "none", "--label", "rigkit.weights-check=1",
           *(part for mount in mounts for part in ("--mount", mount)),
           "--entrypoint", "python3", image, script, "check", f"/src/{inside}", "/dst", "/src"]
    missing = ps_quote(json.dumps({"status": "missing"}))
    inspect_late = _unreachable(f"docker.exe volume inspect {volume} did not answer within {INSPECT_TIMEOUT_S} s "
                                "(is Docker Desktop running?)")
    check_late = _unreachable(f"the weights check container for {volume} did not finish within {CHECK_TIMEOUT_S} s "
                              "(docker.exe stopped; the container, label rigkit.weights-check=1, may still be running)")
    return (
        f"# rigkit: weights-check {ps_quote(volume)} {ps_quote(copier)}\n"
        + _INVOKE_DOCKER
        + f"$answer = Invoke-Docker {ps_quote(subprocess.list2cmdline(inspect))} {INSPECT_TIMEOUT_S}\n"
        f"if ($answer.TimedOut) {{ {inspect_late}; exit 0 }}\n"
        "if ($answer.ExitCode -ne 0) {\n"
        f"    if ($answer.Output -match 'no such volume') {{ {missing} }} else {{ {_unreachable()} }}\n"
        "    exit 0\n"
        "}\n"
        f"if (-not (Test-Path -LiteralPath {ps_quote(copier)} -PathType Leaf)) {{ {_unreachable()}; exit 0 }}\n"
        f"$answer = Invoke-Docker {ps_quote(subprocess.list2cmdline(run))} {CHECK_TIMEOUT_S}\n"
        f"if ($answer.TimedOut) {{ {check_late}; exit 0 }}\n"
        "$answer.Output\n"
        "exit 0"
    )


# The preflight's deadlines: docker.exe answers at once from a running engine; the GPU container
# starts from an image already pulled (`--pull never`) and runs nvidia-smi once.
PREFLIGHT_DOCKER_S = 30
PREFLIGHT_GPU_S = 120
GPU_QUERY = "--query-gpu=index,name,driver_version,compute_cap"


def _docker_line(section: str, arguments: list[str], deadline_s: int) -> str:
    return f"Write-Answer {ps_quote(section)} (Invoke-Docker {ps_quote(subprocess.list2cmdline(arguments))} {deadline_s})\n"


def preflight_script(image: str | None, sources: dict[str, str]) -> str:
    """The Windows preflight's one read (`WindowsPreflightFacts`): `image` is the serving image the GPU
    container runs nvidia-smi in (None: no model); `sources` {model: Windows folder} the weights to
    measure. Each docker.exe call is a process with a deadline; nothing is pulled, created to stay,
    or written."""
    d = PREFLIGHT_DOCKER_S
    gpu = ["run", "--rm", "--gpus", "all", "--pull", "never", "--network", "none", "--label", "rigkit.preflight=1",
           "--entrypoint", "nvidia-smi", image, GPU_QUERY, "--format=csv,noheader"] if image else None
    script = (
        f"# rigkit: windows-preflight {ps_quote(image or '')}\n"
        + _INVOKE_DOCKER
        + "function Write-Answer([string] $Name, $Answer) {\n"
        "    'rigkit-section={0}' -f $Name\n"
        "    'rigkit-exit={0} timed-out={1}' -f $Answer.ExitCode, $Answer.TimedOut\n"
        "    $Answer.Output\n"
        "}\n"
        + _docker_line("version", ["version", "--format", "{{json .}}"], d)
        + _docker_line("info", ["info", "--format", "{{json .}}"], d)
        + _docker_line("compose", ["compose", "version", "--short"], d)
        + _docker_line("serving", ["ps", "--format", '{{.Label "com.docker.compose.project"}}'], d)
        + _docker_line("volumes", ["volume", "ls", "--format", "{{.Name}}"], d)
        + (_docker_line("gpu", gpu, PREFLIGHT_GPU_S) if gpu else "")
        + "'rigkit-section=host'\n"
        "'profile={0}' -f $env:USERPROFILE\n"
        "'memory={0}' -f (Get-CimInstance -ClassName Win32_ComputerSystem).TotalPhysicalMemory\n"
        f"'disk-dir={{0}}' -f (Join-Path $env:LOCALAPPDATA {ps_quote(DOCKER_DESKTOP_DISK_DIR)})\n"
        "'disk-free={0}' -f ([System.IO.DriveInfo] [System.IO.Path]::GetPathRoot($env:LOCALAPPDATA)).AvailableFreeSpace\n"
        "'rigkit-section=wslconfig'\n"
        f"$wslconfig = Join-Path $env:USERPROFILE {ps_quote(WSLCONFIG_NAME)}\n"
        # Its bytes, so its line endings and encoding come back as they are.
        "if (Test-Path -LiteralPath $wslconfig -PathType Leaf) { "
        "[Convert]::ToBase64String([IO.File]::ReadAllBytes($wslconfig)) } "
        f"else {{ {ps_quote(ABSENT)} }}\n"
    )
    for model, source in sources.items():
        script += (
            f"'rigkit-section=source {model}'\n"
            f"$source = {ps_quote(source)}\n"
            "if (Test-Path -LiteralPath $source -PathType Container) { "
            "(Get-ChildItem -LiteralPath $source -Recurse -File -Force | Measure-Object -Property Length -Sum).Sum } "
            f"else {{ {ps_quote(ABSENT)} }}\n"
        )
    return script + "exit 0"


class WindowsPreflightFacts(FactBase):
    """What the Windows preflight checks (rigkit.windows.preflight.PreflightFacts), in one read."""

    def command(self, image: str | None, sources: dict[str, str]) -> str:
        return preflight_script(image, sources)

    def process(self, output) -> PreflightFacts:
        return parse_preflight(list(output))
