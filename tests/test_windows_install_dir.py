"""Who owns C:\\ProgramData\\rigkit: the install folder secured before anything is put there
(rigkit.windows.install_dir), and Assert-Private's owner check.

The simrig tests deploy over SSH: `pyinfra tests/data/windows-rig.py deploy.py` with a rig file that
has an API key. Real: pyinfra's CLI, rigkit's `@winssh` connector over real SSH and SFTP to the
simulated rig, rigkit's Windows role, facts and operations.

Simulated: Windows, by tests/simrig/powershell.exe. No icacls, Get-Acl or New-Item runs: the
stand-in keeps each path's owner and ACL in its state, applies each `Invoke-Icacls` line of a
script (`/setowner` changes only the owner; `/inheritance:r`, `/grant:r`, `/remove`, `/T` as
icacls does), runs the secure-install script's steps in the script's order and fails its
read-back as the script would. A folder an ordinary user made before the first deploy is
simulated by making it on the rig's disk and writing into that state an owner
S-1-5-21-...-1001 with an entry for that user; a link by a symlink. So these tests show what
rigkit sends, in which order and when (not at all on a second deploy); not that Windows
applies it (docs/windows.md says what was verified where).

The pure tests (no mark) check the fact's parsing and verdicts, that every path rigkit uses is
in a folder the fact reads, and Assert-Private's owner check on its syntax tree.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import PureWindowsPath

import pytest

from rigkit.config.loader import load_rig
from rigkit.windows.bundle import installed_files, render_bundle
from rigkit.windows.install_dir import ROOT, WindowsInstallDir, install_dir_problems
from rigkit.windows.names import (
    API_KEY_FILE,
    COPIER,
    INSTALL_DIR,
    LOG_PATH,
    ROLLOUT_LOCK,
    SUBFOLDERS,
    WATCHDOG_LOG_PATH,
    WATCHDOG_STATE_DIR,
    applied_path,
    recreate_marker,
)
from tests.conftest import DATA, TEST_CATALOG, run_deploy
from tests.ps51_rules import PARSER, findings

WIN_RIG = DATA / "rigs" / "windows.yml"
INVENTORY = "tests/data/windows-rig.py"
STORE = "/var/lib/rigkit-winsim"
ADMINS, SYSTEM = "S-1-5-32-544", "S-1-5-18"
USER = "S-1-5-21-1004336348-1177238915-682003330-1001"  # an ordinary local account
ON_RIG_ROOT = "/C:/ProgramData/rigkit"
SECURED = {"owner": ADMINS, "sids": [SYSTEM, ADMINS]}


# ----- pure ----------------------------------------------------------------------------


def test_every_path_rigkit_uses_is_in_a_folder_the_fact_reads():
    rig = load_rig(WIN_RIG, TEST_CATALOG)
    paths = [*installed_files(render_bundle(rig)), str(API_KEY_FILE), str(ROLLOUT_LOCK), str(LOG_PATH),
             str(WATCHDOG_LOG_PATH), applied_path("x"), str(COPIER), str(WATCHDOG_STATE_DIR / "m.json"),
             recreate_marker("m")]
    for path in paths:
        relative = PureWindowsPath(path).relative_to(INSTALL_DIR)
        assert len(relative.parts) == 1 or relative.parts[0] in SUBFOLDERS, path


def folder_line(name: str, owner: str = ADMINS, protected: bool = True, sids: str = f"{SYSTEM},{ADMINS}",
                link: bool = False, folder: bool = True) -> str:
    return f"{name}|owner={owner}|protected={protected}|sids={sids}|link={link}|folder={folder}"


def test_the_fact_finds_a_secured_folder_secure_and_says_what_is_wrong_otherwise():
    fact = WindowsInstallDir()
    assert fact.process(["rigkit-absent"]) is None
    assert install_dir_problems(None) == [f"{INSTALL_DIR} does not exist yet"]
    # Subfolders may inherit (rigkit makes some under the secured folder later); the folder may not.
    secure = fact.process([folder_line(ROOT), folder_line("secrets"), folder_line("stacks", protected=False)])
    assert install_dir_problems(secure) == []
    taken = fact.process([
        folder_line(ROOT, owner=USER, protected=False, sids=f"{SYSTEM},{ADMINS},S-1-5-32-545,{USER}"),
        folder_line("watchdog", sids=f"{USER}"),
        folder_line("logs", link=True),
        folder_line("locks", folder=False),
        "secrets|unreadable=Attempted to perform an unauthorized operation.",
    ])
    assert install_dir_problems(taken) == [
        f"{INSTALL_DIR} is owned by {USER}, not Administrators or SYSTEM",
        f"{INSTALL_DIR} grants {SYSTEM}, {USER}, {ADMINS}, S-1-5-32-545, not SYSTEM and Administrators only",
        f"{INSTALL_DIR} inherits entries from C:\\ProgramData",
        f"{INSTALL_DIR}\\watchdog grants {USER}, not SYSTEM and Administrators only",
        f"{INSTALL_DIR}\\logs is a link (reparse point)",
        f"{INSTALL_DIR}\\locks is not a folder",
        f"{INSTALL_DIR}\\secrets: its ACL cannot be read (Attempted to perform an unauthorized operation.)",
    ]


def _function(script: str, name: str):
    tree = PARSER.parse(script.encode()).root_node
    stack = [tree]
    while stack:
        node = stack.pop()
        if node.type == "function_statement" and name.lower() in node.text.decode().split("{", 1)[0].lower():
            return node
        stack.extend(node.children)
    raise AssertionError(f"no function {name}")


def test_assert_private_throws_for_an_owner_other_than_system_or_administrators():
    """On the syntax tree of what rigkit sends: the owner is read by SID and a throw is reached
    when it is not an allowed one, before the entries are looked at."""
    from rigkit.windows.acl_file import place_script, protect_script, secure_folder_script

    for script in (secure_folder_script("C:\\x"), place_script("C:\\x\\.a", "C:\\x\\a"), protect_script("C:\\x\\a")):
        assert findings(script) == []
        body = _function(script, "Assert-Private").text.decode()
        assert "$owner = $acl.GetOwner([Security.Principal.SecurityIdentifier]).Value" in body
        guard = body.index("if ($allowed -notcontains $owner) {")
        assert body.index("throw", guard) < body.index("AreAccessRulesProtected", guard)
        assert "$allowed = @('S-1-5-18', 'S-1-5-32-544')" in body
        # Every Assert-Private follows the icacls lines that set the owner of the same path.
        lines = script.splitlines()
        for n, line in enumerate(lines):
            if line.startswith("Assert-Private "):
                path = line.split(" ", 1)[1]
                assert f"Invoke-Icacls @({path}, '/setowner', '*S-1-5-32-544')" in lines[:n]


# ----- over @winssh, against the simulated rig --------------------------------------------


@pytest.fixture(scope="module")
def rig(windows_rig):
    return windows_rig


def on_rig(rig, command: str) -> str:
    code, out = rig.exec(command)
    assert code == 0, out
    return out


def keyed_rig(tmp_path, key: str = "rk-install-dir-key"):
    key_file = tmp_path / "win.yml.key"
    key_file.write_text(key + "\n")
    os.chmod(key_file, 0o600)
    rig_file = tmp_path / "win.yml"
    rig_file.write_text(WIN_RIG.read_text() + f"api_key_file: {key_file}\n")
    return rig_file


def deploy(rig, rig_file):
    return run_deploy(rig, rig_file, inventory=INVENTORY, verify=False)


def icacls_calls(rig) -> list[dict]:
    return [json.loads(line) for line in rig.exec(f"cat {STORE}/icacls.log")[1].splitlines() if line.strip()]


def seed_acls(rig, acls: dict[str, dict]) -> None:
    """Owners and entries written into the stand-in's state, as a user (or anyone) made them."""
    code, out = rig.exec(f"cat {STORE}/acl.json")
    state = json.loads(out) if code == 0 else {}
    state.update({path.lower(): acl for path, acl in acls.items()})
    on_rig(rig, f"mkdir -p {STORE} && printf '%s' '{json.dumps(state)}' > {STORE}/acl.json")


def windows_tree(rig) -> list[str]:
    """Every file and folder under the install folder, as Windows paths, read from the rig's disk."""
    found = on_rig(rig, f"find {ON_RIG_ROOT}").split("\n")
    return [line.lstrip("/").replace("/", "\\") for line in found if line.strip()]


def get_acls(rig, paths: list[str]) -> dict[str, dict]:
    """What Get-Acl would report for each path, as the stand-in models it."""
    quoted = " ".join(f"'{p}'" for p in paths)
    return json.loads(on_rig(rig, f"powershell.exe --standin-acl {quoted}"))


def sent_kinds(rig, since: int = 0) -> list[str]:
    names = on_rig(rig, "ls /var/log/rigkit-winsim").split()[since:]
    kinds = []
    for name in names:
        first = on_rig(rig, f"grep -m1 '^# rigkit: ' /var/log/rigkit-winsim/{name} || true").split()
        kinds.append(first[2] if len(first) > 2 else "")
    return kinds


def script_count(rig) -> int:
    return len(rig.exec("ls /var/log/rigkit-winsim")[1].split())


@pytest.mark.simrig
def test_a_folder_a_user_made_first_is_taken_over_before_anything_is_put(rig, tmp_path):
    root = str(INSTALL_DIR)
    watchdog_script = f"{root}\\rigkit-watchdog.ps1"
    # The user made the folder, a watchdog\ only they may use, and a rigkit-watchdog.ps1 of their own.
    on_rig(rig, f"mkdir -p {ON_RIG_ROOT}/watchdog && printf 'Start-Process evil.exe' > {ON_RIG_ROOT}/rigkit-watchdog.ps1")
    seed_acls(rig, {
        root: {"owner": USER, "protected": False, "explicit": [USER]},
        f"{root}\\watchdog": {"owner": USER, "protected": True, "explicit": [USER]},
        watchdog_script: {"owner": USER, "protected": False, "explicit": [USER]},
    })
    before = get_acls(rig, [root, watchdog_script])
    assert before[root]["owner"] == USER and USER in before[watchdog_script]["sids"]

    rig_file = keyed_rig(tmp_path)
    run = deploy(rig, rig_file)
    assert run.returncode == 0, run.output
    assert f"{root} is owned by {USER}, not Administrators or SYSTEM; securing {root}" in run.output
    on_rig(rig, "nvidia-smi -pl 330")  # the fake ran no policy script: set the limits it would have set

    # Independent read: every file and folder there now, the key file and the watchdog script included.
    tree = windows_tree(rig)
    assert {str(API_KEY_FILE), watchdog_script, f"{root}\\watchdog"} <= set(tree)
    acls = get_acls(rig, tree)
    wrong = {path: acl for path, acl in acls.items() if {k: acl[k] for k in SECURED} != SECURED}
    assert wrong == {}
    assert acls[root]["protected"] is True
    rendered = installed_files(render_bundle(load_rig(rig_file, TEST_CATALOG)))[watchdog_script]
    assert on_rig(rig, f"base64 -w0 {ON_RIG_ROOT}/rigkit-watchdog.ps1").strip() == base64.b64encode(rendered).decode()

    # Owner first, then the ACL, then the user's SID removed everywhere; before anything of rigkit's was put.
    calls = icacls_calls(rig)
    on_root = [c["args"] for c in calls if c["args"][0] == root]
    assert on_root == [
        [root, "/setowner", "*S-1-5-32-544", "/T", "/C", "/L", "/Q"],
        [root, "/inheritance:r", "/grant:r", "*S-1-5-18:(OI)(CI)F", "*S-1-5-32-544:(OI)(CI)F", "/T", "/C", "/L", "/Q"],
        [root, "/setowner", "*S-1-5-32-544", "/T", "/C", "/L", "/Q"],
        [root, "/remove", f"*{USER}", "/T", "/C", "/L", "/Q"],
    ]
    assert calls[0]["args"][0] == root and calls[0]["present"] == ["rigkit-watchdog.ps1", "watchdog"]
    kinds = sent_kinds(rig)
    assert kinds.index("secure-install-dir") < kinds.index("secure-folder")  # before the key's folder


@pytest.mark.simrig
def test_a_second_deploy_changes_nothing_and_sends_no_icacls(rig, tmp_path):
    calls = len(icacls_calls(rig))
    since = script_count(rig)
    run = deploy(rig, keyed_rig(tmp_path))
    assert run.returncode == 0, run.output
    assert run.changed_operations() == 0, run.output
    assert len(icacls_calls(rig)) == calls
    assert "secure-install-dir" not in sent_kinds(rig, since) and "install-dir-state" in sent_kinds(rig, since)


@pytest.mark.simrig
@pytest.mark.parametrize("folder, changed", [
    ("", {"owner": USER}),  # icacls C:\ProgramData\rigkit /setowner <a user>
    ("\\secrets", {"owner": USER}),
    ("\\watchdog", {"protected": False, "explicit": [SYSTEM, ADMINS, "S-1-5-32-545"]}),  # Users granted
], ids=["folder-owner", "secrets-owner", "watchdog-users-granted"])
def test_an_owner_or_acl_changed_behind_rigkits_back_is_repaired_without_resending_the_key(rig, tmp_path, folder,
                                                                                          changed):
    path = str(INSTALL_DIR) + folder
    state = json.loads(on_rig(rig, f"cat {STORE}/acl.json"))
    seed_acls(rig, {path: {**state[path.lower()], **changed}})
    assert {k: v for k, v in get_acls(rig, [path])[path].items() if k in SECURED} != SECURED
    runs_before = rig.exec(f"cat {STORE}/runs.log")[1].split()
    since = script_count(rig)

    run = deploy(rig, keyed_rig(tmp_path))
    assert run.returncode == 0, run.output
    assert run.changed_operations() == 1, run.output  # Secure C:\ProgramData\rigkit
    kinds = sent_kinds(rig, since)
    assert "secure-install-dir" in kinds and "place-private-file" not in kinds and "secure-folder" not in kinds
    tree = windows_tree(rig)
    assert all({k: a[k] for k in SECURED} == SECURED for a in get_acls(rig, tree).values())
    assert get_acls(rig, [str(API_KEY_FILE)])[str(API_KEY_FILE)]["protected"] is True  # still private
    assert rig.exec(f"cat {STORE}/runs.log")[1].split() == runs_before  # same files and key: no task ran
    assert deploy(rig, keyed_rig(tmp_path)).changed_operations() == 0


@pytest.mark.simrig
def test_a_link_where_the_folder_should_be_is_refused_before_anything_is_put(rig, tmp_path):
    """Simulated: a symlink stands for a reparse point (a junction a user made to a folder of theirs)."""
    on_rig(rig, f"rm -rf {ON_RIG_ROOT} && mkdir -p /C:/Users/someone/mine && ln -s /C:/Users/someone/mine {ON_RIG_ROOT}")
    try:
        run = deploy(rig, keyed_rig(tmp_path))
    finally:
        on_rig(rig, f"rm {ON_RIG_ROOT}")
    assert run.returncode != 0
    assert f"{INSTALL_DIR} is a link (reparse point)" in run.output, run.output
    assert "Traceback" not in run.output
    assert on_rig(rig, "ls -A /C:/Users/someone/mine") == ""  # nothing was put through the link


def test_the_offline_install_secures_the_folder_before_it_copies_anything():
    """install.ps1 (the offline bundle) runs the same steps, before its first Copy-Item or
    Register-ScheduledTask, after the elevation check. On its text; nothing runs it."""
    from rigkit.windows.install_dir import secure_install_script

    install = render_bundle(load_rig(WIN_RIG, TEST_CATALOG))["install.ps1"]
    steps = secure_install_script().split("\n", 1)[1]
    assert steps in install
    at = install.index(steps)
    assert install.index("IsInRole") < at < install.index("Copy-Item") < install.index("Register-ScheduledTask")
    assert findings(install) == []
