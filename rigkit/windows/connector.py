"""pyinfra connector for Windows rigs over Windows' own OpenSSH server: `@winssh/HOST`.

An administrator's SSH session on Windows 11 is elevated. Every command is run as
`powershell.exe -EncodedCommand <base64 of UTF-16LE>`, so nothing depends on how
cmd.exe or PowerShell would re-parse quotes; files move over SFTP, straight to
their destination (Windows paths such as `C:\\ProgramData\\rigkit\\x.ps1` are sent in
Win32-OpenSSH's SFTP form `/C:/ProgramData/rigkit/x.ps1`; missing folders are made over SFTP
too). Connection data are pyinfra's `ssh_*` keys (it extends the SSH connector), registered
through the `pyinfra.connectors` entry point.
"""

from __future__ import annotations

import base64
import re
from pathlib import PurePosixPath

from pyinfra.connectors.ssh import SSHConnector
from pyinfra.connectors.util import read_output_buffers

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


def powershell_command_line(script: str) -> str:
    wrapped = f"{_PRELUDE}try {{\n{script}\n}} catch {{ [Console]::Error.WriteLine($_.Exception.Message); exit 1 }}{_EPILOGUE}"
    return f"powershell.exe -NoProfile -NonInteractive -ExecutionPolicy Bypass -EncodedCommand {encode_powershell(wrapped)}"


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
        stdin, stdout, stderr = self.client.exec_command(powershell_command_line(script))
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
