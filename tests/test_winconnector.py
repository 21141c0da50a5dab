"""The Windows connector (`@winssh/HOST`): PowerShell -EncodedCommand and SFTP.

Real: pyinfra (its CLI and its API), SSH to the simulated rig's sshd on 127.0.0.1, SFTP.
Simulated: powershell.exe. The rig has a transport-only stand-in (tests/simrig/powershell.exe)
that decodes -EncodedCommand exactly as PowerShell does and prints the script back; it runs
no PowerShell. No Windows machine is involved.
"""

from __future__ import annotations

import base64
import io
import os
import subprocess
import sys

import pytest

from rigkit.windows.connector import (
    COMMAND_LINE_MAX,
    encode_powershell,
    powershell_command_line,
    sftp_path,
)
from tests.conftest import REPO, STATE_ROOT

NASTY = "Write-Output 'it''s \"quoted\"'\n$x = \"a`tb\" # naïve ünïcødé ✓ 🚀\r\nexit 0; & { echo $(whoami) }"


def decode_as_powershell(encoded: str) -> str:
    return base64.b64decode(encoded).decode("utf-16-le")


@pytest.mark.parametrize("script", [NASTY, "", "'" * 9, "\n".join(["line"] * 500)])
def test_encoding_round_trips_as_powershell_decodes_it(script):
    assert decode_as_powershell(encode_powershell(script)) == script
    command = powershell_command_line(script)
    assert command.startswith("powershell.exe -NoProfile -NonInteractive -ExecutionPolicy Bypass -EncodedCommand ")
    encoded = command.rsplit(" ", 1)[1]
    assert set(encoded) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=")
    assert script in decode_as_powershell(encoded)


def test_windows_paths_take_win32_openssh_sftp_form():
    assert sftp_path("C:\\ProgramData\\rigkit\\x y.ps1") == "/C:/ProgramData/rigkit/x y.ps1"
    assert sftp_path("d:/models") == "/d:/models"
    assert sftp_path("/tmp/x") == "/tmp/x"  # not a Windows path: left alone


@pytest.fixture(scope="module")
def rig(fresh_rig):
    return fresh_rig


def ssh_data(rig) -> dict:
    return {"ssh_port": rig.ssh_port, "ssh_user": "root", "ssh_key": str(STATE_ROOT / "ssh" / "id_ed25519"),
            "ssh_known_hosts_file": "/dev/null", "ssh_strict_host_key_checking": "off"}


@pytest.mark.simrig
def test_pyinfra_cli_runs_powershell_through_the_connector(rig):
    data = [arg for key, value in ssh_data(rig).items() for arg in ("--data", f"{key}={value}")]
    result = subprocess.run(
        [sys.executable, "-m", "pyinfra", "-y", *data, "@winssh/127.0.0.1", "exec", "--", NASTY],
        cwd=REPO, capture_output=True, text=True, timeout=120, env=dict(os.environ),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout + result.stderr
    assert "naïve ünïcødé ✓ 🚀" in out  # the stand-in printed back what PowerShell would have decoded
    failing = subprocess.run(
        [sys.executable, "-m", "pyinfra", "-y", *data, "@winssh/127.0.0.1", "exec", "--", "# rigkit-standin-exit 3"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert failing.returncode != 0


@pytest.mark.simrig
def test_connector_output_exit_codes_and_sftp(rig):
    from pyinfra.api import Config, Inventory, State
    from pyinfra.api.connect import connect_all

    inventory = Inventory(([("@winssh/127.0.0.1", {**ssh_data(rig), "ssh_hostname": "127.0.0.1"})], {}))
    state = State(inventory, Config())
    connect_all(state)
    host = inventory.get_host("@winssh/127.0.0.1")

    ok, output = host.run_shell_command(NASTY)
    assert ok
    assert NASTY in "\n".join(output.stdout_lines)  # arrived intact, \r and all
    assert "stand-in stderr line" in output.stderr_lines
    ok, _ = host.run_shell_command("# rigkit-standin-exit 4")
    assert not ok

    payload = "GPU policy ✓ 'quoted' \"double\"\r\n".encode("utf-8")
    assert host.put_file(io.BytesIO(payload), "/tmp/rigkit-winconnector-test.txt")
    assert rig.exec("cat /tmp/rigkit-winconnector-test.txt")[1].encode() == payload  # read past the connector
    back = io.BytesIO()
    assert host.get_file("/tmp/rigkit-winconnector-test.txt", back)
    assert back.getvalue() == payload
    # A script too long for cmd.exe's line goes as a file into the account's home, is run (its
    # output and exit code come back as from an encoded one) and removed.
    long_script = "\n".join(f"Write-Output 'line {n} ✓'" for n in range(400))
    assert len(powershell_command_line(long_script)) > COMMAND_LINE_MAX
    ok, output = host.run_shell_command(long_script)
    assert ok and "Write-Output 'line 399 ✓'" in output.stdout_lines
    ok, _ = host.run_shell_command(long_script + "\n# rigkit-standin-exit 5")
    assert not ok
    assert rig.exec("ls -A ~/.rigkit-commands")[1].strip() == ""
    # A Windows path: sent as /C:/..., its missing folders made over SFTP.
    assert host.put_file(io.BytesIO(payload), "C:\\rigkit-test\\new folder\\x.txt")
    assert rig.exec("cat '/C:/rigkit-test/new folder/x.txt'")[1].encode() == payload
    host.disconnect()
