"""pyinfra connector for Windows rigs over Windows' own OpenSSH server: `@winssh/HOST`.

An administrator's SSH session on Windows 11 is elevated. Every command is run as
`powershell.exe -EncodedCommand <base64 of UTF-16LE>`, so nothing depends on how
cmd.exe or PowerShell would re-parse quotes. sshd hands that line to the account's shell, cmd.exe
unless DefaultShell says otherwise, which takes at most 8191 characters: a script whose line would
be longer is sent as a file instead (`plan_command`): uploaded over SFTP into the account's home,
then run by a short encoded command that holds it open against writes, checks its SHA-256 and
removes it after. Files move over SFTP to the path they are given (rigkit.windows.upload gives a
temporary name and moves it into place) (Windows paths such as `C:\\ProgramData\\rigkit\\x.ps1` are sent in
Win32-OpenSSH's SFTP form `/C:/ProgramData/rigkit/x.ps1`; missing folders are made over SFTP
too). Connection data are pyinfra's `ssh_*` keys (it extends the SSH connector), registered
through the `pyinfra.connectors` entry point.
"""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass
from io import BytesIO
from pathlib import PurePosixPath
from typing import Callable

from pyinfra.connectors.ssh import SSHConnector
from pyinfra.connectors.util import read_output_buffers

from rigkit.plumbing.render import ps_quote
from rigkit.windows.names import COMMAND_FILE_DIR

# Progress records would arrive on stderr as CLIXML; output must be UTF-8 (redirected, Windows
# PowerShell writes the OEM code page, which would mangle non-ASCII text such as an exported
# task; without a BOM in front); a failing script must exit non-zero with its message on stderr.
_PRELUDE = (
    "$ProgressPreference = 'SilentlyContinue'\n"
    "$utf8 = New-Object System.Text.UTF8Encoding $false\n"
    "[Console]::OutputEncoding = $utf8\n"
    "$OutputEncoding = $utf8\n"
    "$ErrorActionPreference = 'Stop'\n"
)
_EPILOGUE = "\nif ($LASTEXITCODE) { exit $LASTEXITCODE }\n"


def encode_powershell(script: str) -> str:
    """PowerShell's -EncodedCommand form: base64 of the script's UTF-16LE bytes."""
    return base64.b64encode(script.encode("utf-16-le")).decode("ascii")


def wrap(script: str) -> str:
    """The script as powershell.exe runs it: the prelude, then the script inside a try whose catch
    writes the message to stderr and exits 1."""
    return f"{_PRELUDE}try {{\n{script}\n}} catch {{ [Console]::Error.WriteLine($_.Exception.Message); exit 1 }}{_EPILOGUE}"


def powershell_command_line(script: str) -> str:
    return f"powershell.exe -NoProfile -NonInteractive -ExecutionPolicy Bypass -EncodedCommand {encode_powershell(wrap(script))}"


# cmd.exe, Win32-OpenSSH's default shell, takes at most 8191 characters on its command line (Microsoft,
# "Command prompt (Cmd.exe) command-line string limitation"); sshd puts the shell's own path and `/c`
# in front of the command: room for a path of MAX_PATH (260) characters, quoted, is kept for that.
CMD_LINE_MAX = 8191
SHELL_PREFIX_RESERVE = 300
COMMAND_LINE_MAX = CMD_LINE_MAX - SHELL_PREFIX_RESERVE
FILE_COMMAND_MARK = "# rigkit-file-command"


@dataclass(frozen=True)
class WindowsCommand:
    line: str  # what is sent to sshd: never longer than COMMAND_LINE_MAX
    upload: tuple[str, bytes] | None = None  # (SFTP path, bytes) put before `line` runs, for a long script


def windows_path_from_sftp(path: str) -> str:
    """`/C:/Users/you` (Win32-OpenSSH's SFTP form) -> `C:\\Users\\you`; any other path as it is."""
    return path[1:].replace("/", "\\") if re.match(r"^/[A-Za-z]:/", path) else path


def file_stager(path: str, sha256_hex: str) -> str:
    """The short script that runs the uploaded file at `path`: opened first so nothing can write or
    swap it while it runs (FileShare.Read), its SHA-256 compared with the one sent, run, removed."""
    sha = sha256_hex.upper()
    return (
        f"{FILE_COMMAND_MARK} {ps_quote(path)} {sha}\n"
        f"$path = {ps_quote(path)}\n"
        "$hold = [IO.File]::Open($path, [IO.FileMode]::Open, [IO.FileAccess]::Read, [IO.FileShare]::Read)\n"
        "try {\n"
        "    $sha = [BitConverter]::ToString([Security.Cryptography.SHA256]::Create().ComputeHash($hold)).Replace('-', '')\n"
        f"    if ($sha -ne '{sha}') {{ throw ('{{0}} is not the script rigkit sent (SHA-256 {{1}})' -f $path, $sha) }}\n"
        "    $global:LASTEXITCODE = 0\n"
        "    & $path\n"
        "    $code = $LASTEXITCODE\n"
        "} finally {\n"
        "    $hold.Dispose()\n"
        "    Remove-Item -LiteralPath $path -Force -ErrorAction SilentlyContinue\n"
        "}\n"
        "exit $code"
    )


def plan_command(script: str, home: Callable[[], str]) -> WindowsCommand:
    """How `script` reaches powershell.exe: encoded on the command line where that fits
    COMMAND_LINE_MAX, else as a file (UTF-8 with a BOM, which 5.1 needs) under COMMAND_FILE_DIR in
    `home()` (the SFTP start folder, asked only then) run by `file_stager`."""
    line = powershell_command_line(script)
    if len(line) <= COMMAND_LINE_MAX:
        return WindowsCommand(line)
    data = b"\xef\xbb\xbf" + wrap(script).encode("utf-8")
    digest = hashlib.sha256(data).hexdigest()
    relative = f"{COMMAND_FILE_DIR}/{digest}.ps1"
    base = windows_path_from_sftp(home().rstrip("/"))
    separator = "\\" if re.match(r"^[A-Za-z]:\\", base) else "/"
    stager = powershell_command_line(file_stager(base + separator + relative.replace("/", separator), digest))
    if len(stager) > COMMAND_LINE_MAX:
        raise ValueError(f"the account's home {base!r} is too long for a command line that runs a script file")
    return WindowsCommand(stager, (relative, data))


def sftp_path(path: str) -> str:
    """Win32-OpenSSH's SFTP spelling of a Windows path: `C:\\a\\b` -> `/C:/a/b`. A bare `C:/a`
    would be taken as relative to the user's home."""
    path = str(path).replace("\\", "/")
    return f"/{path}" if re.match(r"^[A-Za-z]:/", path) else path


class WindowsSSHConnector(SSHConnector):
    """Windows over OpenSSH: PowerShell -EncodedCommand for commands, SFTP for files."""

    # Read by rigkit.config.inventory to refuse a Linux rig behind this connector (and the reverse).
    target_os = "windows"
    # The SSH session command that becomes a Docker Engine connection (rigkit.weights.engine):
    # sshd hands it to the account's shell (cmd.exe unless DefaultShell says otherwise), never
    # to PowerShell from here, so the Engine API's bytes pass through untouched. Docker Desktop's
    # CLI is docker.exe on the PATH.
    docker_dial_command = "docker.exe system dial-stdio"

    @staticmethod
    def make_names_data(name):
        yield f"@winssh/{name}", {"ssh_hostname": name}, []

    def run_shell_command(self, command, print_output=False, print_input=False, **arguments):
        timeout = arguments.pop("_timeout", None)
        success_codes = arguments.pop("_success_exit_codes", None) or [0]
        script = command.get_raw_value() if hasattr(command, "get_raw_value") else str(command)
        if print_input:
            print(f"{self.host.print_prefix}>>> {script}")
        planned = plan_command(script, lambda: self.get_file_transfer_connection().normalize("."))
        if planned.upload is not None:
            remote, data = planned.upload
            self._make_parents(remote)
            self._put_file(BytesIO(data), remote)
        stdin, stdout, stderr = self.client.exec_command(planned.line)
        stdin.close()
        output = read_output_buffers(stdout, stderr, timeout=timeout, print_output=print_output,
                                     print_prefix=self.host.print_prefix)
        return stdout.channel.recv_exit_status() in success_codes, output

    def put_file(self, filename_or_io, remote_filename, remote_temp_filename=None, print_output=False,
                 print_input=False, **arguments):
        remote = sftp_path(remote_filename)
        self._make_parents(remote)
        self._put_file(filename_or_io, remote)
        return True

    def get_file(self, remote_filename, filename_or_io, remote_temp_filename=None, print_output=False,
                 print_input=False, **arguments):
        self._get_file(sftp_path(remote_filename), filename_or_io)
        return True

    def _make_parents(self, remote: str) -> None:
        sftp = self.get_file_transfer_connection()
        for parent in reversed(PurePosixPath(remote).parents):
            if str(parent) in ("/", "."):
                continue
            try:
                sftp.stat(str(parent))
            except FileNotFoundError:
                sftp.mkdir(str(parent))
