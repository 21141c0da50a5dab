"""pyinfra facts read from a Windows rig through the `@winssh` connector, in PowerShell.

Each script's first line says what it is (`# rigkit: <what> <argument>`), which is what
a reader of the rig's logs sees. Every script exits 0 and says "absent" in its output, so
"not there" is never confused with "the query failed". `requires_command` stays unset:
pyinfra's check for it is POSIX shell.
"""

from __future__ import annotations

from pyinfra.api import FactBase

from rigkit.gpu.nvsmi import EXIT_MARK, GpuReport, parse_query, query_arguments
from rigkit.render import ps_quote

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


class WindowsFolderExists(FactBase):
    """Whether a folder exists on the rig."""

    def command(self, path: str) -> str:
        return (
            f"# rigkit: folder-exists {ps_quote(path)}\n"
            f"if (Test-Path -LiteralPath {ps_quote(path)} -PathType Container) {{ 'present' }} else {{ {ps_quote(ABSENT)} }}"
        )

    def process(self, output) -> bool:
        return _unless_absent(output) is not None


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
