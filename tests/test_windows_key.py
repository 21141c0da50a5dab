"""A Windows rig's API key, deployed over SSH: `pyinfra tests/data/windows-rig.py deploy.py` with a rig
file that has `api_key_file`.

Real: pyinfra's CLI, rigkit's `@winssh` connector over real SSH and SFTP to the simulated rig, rigkit's
Windows role, facts and operations, the key file read on the control machine.

Simulated: Windows. powershell.exe on the rig is tests/simrig/powershell.exe: it runs no PowerShell, so
icacls, Get-Acl and Move-IntoPlace do not run; it records each `Invoke-Icacls` line a script carries (with
the names then in the target's folder) and keeps the owner and ACL that line would set, moves the
uploaded temporary file as the script's Move-IntoPlace would, fails an `Assert-Private` as the script's
would, and reports a file's SHA-256, owner and ACL to the fact. A file a user took over is simulated
by writing its owner into the stand-in's state; icacls that does not apply /setowner by a switch in
it. So these tests show what rigkit sends and in which order (owner and ACL before any content, the
content only over SFTP, never in a script), its decisions (nothing re-sent when the digest, owner and
ACL match) and the compose files; not that Windows applies the ACL (see docs/windows.md).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys

import pytest

from rigkit.windows.names import API_KEY_FILE, INSTALL_DIR, TASK_BOOTSTRAP
from rigkit.windows.upload import temporary_name
from tests.conftest import DATA, REPO, TEST_CATALOG, copy_catalog, run_deploy
from tests.ps51_rules import findings

WIN_RIG = DATA / "rigs" / "windows.yml"
INVENTORY = "tests/data/windows-rig.py"
STORE = "/var/lib/rigkit-winsim"
# Quotes (straight and typographic), $, #, spaces inside, backslash: nothing may interpret it.
KEY = "rk-7f3e9a1c \"q\" 'x' `y` $(whoami) #not-a-comment \\n"  # ASCII: an HTTP header carries no more
SECRETS = str(API_KEY_FILE.parent)
ON_RIG_KEY = "/" + str(API_KEY_FILE).replace("\\", "/")
ADMINS, SYSTEM = "S-1-5-32-544", "S-1-5-18"
USER = "S-1-5-21-1004336348-1177238915-682003330-1001"  # an ordinary local account

pytestmark = pytest.mark.simrig


@pytest.fixture(scope="module")
def rig(windows_rig):
    return windows_rig


def keyed_rig(tmp_path, key: str | None = KEY, name: str = "win.yml"):
    key_file = tmp_path / f"{name}.key"
    if key is not None:
        key_file.write_text(key + "\n")
        os.chmod(key_file, 0o600)
    rig_file = tmp_path / name
    rig_file.write_text(WIN_RIG.read_text() + f"api_key_file: {key_file}\n")
    return rig_file


def deploy(rig, rig_file):
    # Verification is tested in tests/test_windows_verify.py; here the simulated task runs bring
    # no stack up, so there would be nothing to benchmark.
    return run_deploy(rig, rig_file, inventory=INVENTORY, verify=False)


def on_rig(rig, command: str) -> str:
    code, out = rig.exec(command)
    assert code == 0, out
    return out


def icacls_calls(rig) -> list[dict]:
    return [json.loads(line) for line in rig.exec(f"cat {STORE}/icacls.log")[1].splitlines() if line.strip()]


def seed_acl(rig, path: str, acl: dict) -> None:
    """Write `path`'s owner and entries into the stand-in's state, as someone changing them would."""
    acls = json.loads(rig.exec(f"cat {STORE}/acl.json")[1] or "{}")
    acls[path.lower()] = acl
    on_rig(rig, f"printf '%s' '{json.dumps(acls)}' > {STORE}/acl.json")


def get_acl(rig, path: str) -> dict:
    """What Get-Acl would report, as the stand-in models it."""
    return json.loads(on_rig(rig, f"powershell.exe --standin-acl '{path}'"))[path]


def sent_scripts(rig) -> dict[str, str]:
    names = on_rig(rig, "ls /var/log/rigkit-winsim").split()
    return {name: rig.exec(f"cat /var/log/rigkit-winsim/{name}")[1] for name in names}


def test_a_missing_key_file_is_refused_at_check_and_deploy_before_any_change(rig, tmp_path):
    rig_file = keyed_rig(tmp_path, key=None)
    check = subprocess.run([sys.executable, "-m", "rigkit.cli", "check", str(rig_file), "--catalog", str(TEST_CATALOG)],
                           cwd=REPO, capture_output=True, text=True, timeout=120)
    assert check.returncode == 2, check.stdout + check.stderr
    assert f"api_key_file {tmp_path / 'win.yml.key'} does not exist" in check.stderr

    run = deploy(rig, rig_file)
    assert run.returncode != 0
    assert "nothing was changed" in run.output and "does not exist" in run.output, run.output
    assert "Traceback" not in run.output
    assert rig.exec("test -e /C:/ProgramData/rigkit")[0] != 0  # nothing was put


def test_the_key_file_gets_its_acl_before_its_content_and_is_never_inlined(rig, tmp_path):
    run = deploy(rig, keyed_rig(tmp_path))
    assert run.returncode == 0, run.output
    on_rig(rig, "nvidia-smi -pl 330")  # the fake ran no policy script: set the limits it would have set

    # Byte for byte the env file Compose reads raw; read past rigkit, from the rig's disk.
    assert rig.exec(f"base64 -w0 '{ON_RIG_KEY}'")[1].strip() == base64.b64encode(f"VLLM_API_KEY={KEY}\n".encode()).decode()
    temporary = temporary_name(str(API_KEY_FILE))
    assert rig.exec(f"test -e '/{temporary.replace(chr(92), '/')}'")[0] != 0  # moved, not left behind

    everything = icacls_calls(rig)
    install = [c for c in everything if c["args"][0] == str(INSTALL_DIR)]  # tests/test_windows_install_dir.py
    calls = [c for c in everything if c["args"][0] != str(INSTALL_DIR)]
    assert install and max(c["script"] for c in install) < calls[0]["script"]  # the install folder first
    assert [c["args"] for c in calls] == [
        [SECRETS, "/setowner", "*S-1-5-32-544"],
        [SECRETS, "/inheritance:r", "/grant:r", "*S-1-5-18:(OI)(CI)F", "*S-1-5-32-544:(OI)(CI)F"],
        [temporary, "/setowner", "*S-1-5-32-544"],
        [temporary, "/inheritance:r", "/grant:r", "*S-1-5-18:F", "*S-1-5-32-544:F"],
        [str(API_KEY_FILE), "/setowner", "*S-1-5-32-544"],
        [str(API_KEY_FILE), "/inheritance:r", "/grant:r", "*S-1-5-18:F", "*S-1-5-32-544:F"],
    ]
    # The folder was locked down while empty, in a script sent before the upload (scripts are numbered).
    assert calls[1]["present"] == [] and calls[1]["script"] < calls[2]["script"]
    assert calls[2]["present"] == [temporary.rsplit("\\", 1)[1]]
    assert get_acl(rig, str(API_KEY_FILE)) == {"owner": ADMINS, "protected": True, "sids": [SYSTEM, ADMINS]}

    compose = on_rig(rig, "cat /C:/ProgramData/rigkit/stacks/win-alpha/compose.yml")
    assert 'env_file: [{"path": "C:\\\\ProgramData\\\\rigkit\\\\secrets\\\\vllm-api-key.env", "format": "raw"}]' in compose
    bootstrap = on_rig(rig, "cat /C:/ProgramData/rigkit/llm-bootstrap.ps1")
    assert "$KeyFile = 'C:\\ProgramData\\rigkit\\secrets\\vllm-api-key.env'" in bootstrap
    # Read from its file on the rig, handed to the one-token probe, which sends it as a header.
    assert "$ApiKey = Read-ApiKey @{ api_key_env_file = $KeyFile" in bootstrap
    assert "Invoke-OneToken $stack.Port $stack.Model $ApiKey $ProbeTimeoutS" in bootstrap
    assert "if ($Key) { $headers['Authorization'] = 'Bearer ' + $Key }" in bootstrap
    watchdog = json.loads(on_rig(rig, "cat /C:/ProgramData/rigkit/watchdog.json"))
    assert watchdog["api_key_env_file"] == str(API_KEY_FILE)

    # The key is nowhere but in its file: no script sent, no other file on the rig, not the deploy's output.
    marker = "rk-7f3e9a1c"
    for name, script in sent_scripts(rig).items():
        assert marker not in script, name
        assert findings(script) == [], name
    holders = on_rig(rig, f"grep -rl -- '{marker}' /C: /var/log /var/lib/rigkit-winsim || true").split()
    assert holders == [ON_RIG_KEY], holders
    assert marker not in run.output
    kinds = {line.split()[2] for s in sent_scripts(rig).values() for line in s.splitlines() if line.startswith("# rigkit: ")}
    assert {"private-file-state", "secure-folder", "place-private-file", "install-dir-state",
            "secure-install-dir"} <= kinds


def test_a_second_deploy_changes_nothing_and_sends_no_key(rig, tmp_path):
    rig_file = keyed_rig(tmp_path)
    calls = len(icacls_calls(rig))
    run = deploy(rig, rig_file)
    assert run.returncode == 0, run.output
    assert run.changed_operations() == 0, run.output
    assert len(icacls_calls(rig)) == calls  # compared by the digest fact, not rewritten


@pytest.mark.parametrize("opened", [
    {"owner": ADMINS, "protected": True, "explicit": [SYSTEM, ADMINS, "S-1-5-32-545"]},  # icacls /grant Users:R
    {"owner": ADMINS, "protected": False, "explicit": [SYSTEM, ADMINS]},  # icacls /inheritance:e
    {"owner": USER, "protected": True, "explicit": [SYSTEM, ADMINS]},  # icacls /setowner <a user>
], ids=["users-granted", "inheritance-on", "user-owner"])
def test_an_acl_opened_behind_rigkits_back_is_closed_without_resending_the_key(rig, tmp_path, opened):
    rig_file = keyed_rig(tmp_path)
    seed_acl(rig, str(API_KEY_FILE), opened)
    assert get_acl(rig, str(API_KEY_FILE)) != {"owner": ADMINS, "protected": True, "sids": [SYSTEM, ADMINS]}
    before = len(icacls_calls(rig))
    runs_before = rig.exec(f"cat {STORE}/runs.log")[1].split()
    run = deploy(rig, rig_file)
    assert run.returncode == 0, run.output
    calls = [c["args"] for c in icacls_calls(rig)[before:]]
    assert {args[0] for args in calls} == {str(API_KEY_FILE)}  # its owner and ACL only: no temporary file, no key sent
    assert ([str(API_KEY_FILE), "/remove", "*S-1-5-32-545"] in calls) == ("S-1-5-32-545" in opened["explicit"])
    assert get_acl(rig, str(API_KEY_FILE)) == {"owner": ADMINS, "protected": True, "sids": [SYSTEM, ADMINS]}
    assert rig.exec(f"cat {STORE}/runs.log")[1].split() == runs_before  # same key: the stacks are left alone
    assert deploy(rig, rig_file).changed_operations() == 0


def test_assert_private_refuses_a_key_file_a_user_still_owns(rig, tmp_path):
    """Simulated: icacls.exe that exits 0 without applying /setowner (as it does when given only a path):
    the read-back, not icacls' exit code, is what stops the deploy before the stacks use the file."""
    rig_file = keyed_rig(tmp_path)
    seed_acl(rig, str(API_KEY_FILE), {"owner": USER, "protected": True, "explicit": [SYSTEM, ADMINS]})
    on_rig(rig, f"touch {STORE}/icacls-ignores-setowner")
    runs_before = rig.exec(f"cat {STORE}/runs.log")[1].split()
    try:
        run = deploy(rig, rig_file)
    finally:
        on_rig(rig, f"rm {STORE}/icacls-ignores-setowner")
    assert run.returncode != 0
    assert f"{API_KEY_FILE}: owned by {USER}, who may change its ACL at will" in run.output, run.output
    assert "Traceback" not in run.output
    assert rig.exec(f"cat {STORE}/runs.log")[1].split() == runs_before  # nothing ran on a file a user owns
    assert deploy(rig, rig_file).returncode == 0  # icacls working again: repaired
    assert get_acl(rig, str(API_KEY_FILE))["owner"] == ADMINS


def test_a_new_key_is_put_the_same_way_and_the_stacks_come_up_with_it(rig, tmp_path):
    """Simulated as well: the uploaded file arrives with the entries Win32-OpenSSH's sftp-server may give
    a file it creates (owned by the SSH user, explicit entries for that user and Everyone from the open's
    mode bits): they are removed from the temporary file before it is moved in, and the key file's ACL
    is read back (Assert-Private) with SYSTEM and Administrators only."""
    rig_file = keyed_rig(tmp_path, key="rk-second-key")
    before = len(icacls_calls(rig))
    runs_before = rig.exec(f"cat {STORE}/runs.log")[1].split()
    everyone = "S-1-1-0"
    on_rig(rig, f"echo '{json.dumps({'owner': USER, 'protected': False, 'explicit': [everyone, USER]})}' "
                f"> {STORE}/sftp-upload-acl.json")
    try:
        run = deploy(rig, rig_file)
    finally:
        on_rig(rig, f"rm {STORE}/sftp-upload-acl.json")
    assert run.returncode == 0, run.output
    assert on_rig(rig, f"cat '{ON_RIG_KEY}'") == "VLLM_API_KEY=rk-second-key\n"
    temporary = temporary_name(str(API_KEY_FILE))
    assert [c["args"] for c in icacls_calls(rig)[before:]][2:6] == [
        [temporary, "/setowner", "*S-1-5-32-544"],
        [temporary, "/inheritance:r", "/grant:r", "*S-1-5-18:F", "*S-1-5-32-544:F"],
        [temporary, "/remove", f"*{everyone}"], [temporary, "/remove", f"*{USER}"]]
    assert [c["args"][0] for c in icacls_calls(rig)[before:]] == [SECRETS, SECRETS, *[temporary] * 4,
                                                                  str(API_KEY_FILE), str(API_KEY_FILE)]
    assert get_acl(rig, str(API_KEY_FILE)) == {"owner": ADMINS, "protected": True, "sids": [SYSTEM, ADMINS]}
    assert rig.exec(f"cat {STORE}/runs.log")[1].split()[len(runs_before):] == [TASK_BOOTSTRAP]
    assert "rk-second-key" not in run.output


def test_a_watchdog_setting_changes_its_settings_file_only(rig, tmp_path):
    """The watchdog's settings are not the bootstrap's input: a change to them runs no task."""
    rig_file = keyed_rig(tmp_path, key="rk-second-key")
    catalog = copy_catalog(tmp_path)  # compose files name their catalog file: one folder for both deploys
    assert run_deploy(rig, rig_file, catalog=catalog, inventory=INVENTORY, verify=False).returncode == 0
    copy_catalog(tmp_path, win_alpha=[("ready_timeout_s: 30\n", "ready_timeout_s: 30\nwatchdog: {wedged_after_s: 45}\n")])
    runs_before = rig.exec(f"cat {STORE}/runs.log")[1].split()
    run = run_deploy(rig, rig_file, catalog=catalog, inventory=INVENTORY, verify=False)
    assert run.returncode == 0, run.output
    assert json.loads(on_rig(rig, "cat /C:/ProgramData/rigkit/watchdog.json"))["models"][0]["wedged_after_s"] == 45
    assert run.changed_operations() == 1, run.output  # Put C:\\ProgramData\\rigkit\\watchdog.json
    assert rig.exec(f"cat {STORE}/runs.log")[1].split() == runs_before
