"""Deploying a Windows rig over SSH: `pyinfra tests/data/windows-rig.py deploy.py`.

Real: pyinfra's CLI and deploy.py choosing the Windows role from the rig file's OS; rigkit's
`@winssh` connector over real SSH to the simulated rig's sshd on 127.0.0.1; SFTP (files land
in the rig's /C:/ tree, where Win32-OpenSSH's SFTP form of `C:\\...` paths points); rigkit's
Windows facts, operations and role; the simulated nvidia-smi's answers.

Simulated: Windows. powershell.exe on the rig is tests/simrig/powershell.exe. It runs no
PowerShell: it fakes the answers of Get-FileHash, Get-Content, Test-Path, Export-/Register-
ScheduledTask (re-serialising the XML as Task Scheduler's export does), Start-ScheduledTask
(recording the run; a test can make it fail), nvidia-smi.exe, and the removal's effects
(uninstall.ps1: GPUs reset with the simulated nvidia-smi, tasks unregistered, folder removed)
from the rig's files. So these tests show the deploy's decisions and plumbing, not that the
PowerShell does what it says on Windows; every script rigkit sent is parsed with a real
PowerShell grammar (tree-sitter-powershell) and checked by the Windows PowerShell 5.1 rules
(tests/ps51_rules.py).
"""

from __future__ import annotations

import base64
import json
import xml.etree.ElementTree as ET

import pytest

from rigkit.config.loader import load_rig
from rigkit.windows.bundle import installed_files, render_bundle
from rigkit.windows.names import TASK_BOOTSTRAP, TASK_POWER, TASK_WATCHDOG
from rigkit.windows.timing import bootstrap_budget
from rigkit.windows.upload import temporary_name
from tests.conftest import DATA, POLICY_RIG, TEST_CATALOG, copy_catalog, run_deploy
from tests.ps51_rules import findings
from tests.test_windows import parse_errors

WIN_RIG = DATA / "rigs" / "windows.yml"
INVENTORY = "tests/data/windows-rig.py"
STORE = "/var/lib/rigkit-winsim"
NS = {"t": "http://schemas.microsoft.com/windows/2004/02/mit/task"}

pytestmark = pytest.mark.simrig


@pytest.fixture(scope="module")
def rig(windows_rig):
    return windows_rig


def deploy(rig, rig_file=WIN_RIG):
    # No verification: the fake tasks start no model (tests/test_windows_verify.py verifies one).
    return run_deploy(rig, rig_file, inventory=INVENTORY, verify=False)


def on_rig(rig, command: str) -> str:
    code, out = rig.exec(command)
    assert code == 0, out
    return out


def runs(rig) -> list[str]:
    return rig.exec(f"cat {STORE}/runs.log")[1].split()


def sent_scripts(rig) -> list[str]:
    names = on_rig(rig, "ls /var/log/rigkit-winsim").split()
    return [rig.exec(f"cat /var/log/rigkit-winsim/{name}")[1] for name in names]


def test_first_deploy_installs_registers_and_runs_both_tasks(rig):
    run = deploy(rig)
    assert run.returncode == 0, run.output
    assert "NVIDIA GeForce RTX 4090" in run.output  # GPU facts came through nvidia-smi.exe's query

    installed = installed_files(render_bundle(load_rig(WIN_RIG, TEST_CATALOG)))
    for path, data in installed.items():
        on_rig_path = "/" + path.replace("\\", "/")
        assert rig.exec(f"base64 -w0 '{on_rig_path}'")[1].strip() == base64.b64encode(data).decode(), path
    # Each file arrived under its temporary name and was moved into place (the stand-in's record of
    # each Move-IntoPlace), none written where a task runs it; nothing temporary is left behind.
    moves = [json.loads(line) for line in on_rig(rig, f"cat {STORE}/moves.log").splitlines()]
    assert {m["to"] for m in moves} >= set(installed)
    assert all(m["from"] == temporary_name(m["to"]) for m in moves)
    assert on_rig(rig, "find /C: -name '*.rigkit-upload'").strip() == ""
    assert on_rig(rig, "ls -A ~/.rigkit-commands 2>/dev/null || true").strip() == ""  # scripts sent as files: removed
    tasks = on_rig(rig, f"ls {STORE}/tasks").split()
    assert sorted(tasks) == sorted([f"{TASK_POWER}.xml", f"{TASK_BOOTSTRAP}.xml", f"{TASK_WATCHDOG}.xml"])
    assert runs(rig) == [TASK_POWER, TASK_BOOTSTRAP]  # the watchdog runs on its own trigger, not now
    # The watchdog is registered as SYSTEM, as rendered; the logon tasks for the connecting user.
    users = {t: ET.fromstring(on_rig(rig, f"cat {STORE}/tasks/{t}.xml").split("?>", 1)[1]).find(".//t:UserId", NS).text
             for t in (TASK_POWER, TASK_WATCHDOG)}
    assert users == {TASK_POWER: "SIMRIG\\root", TASK_WATCHDOG: "S-1-5-18"}
    # The fake ran no policy script: set the limits GPU-PowerPolicy would have set.
    on_rig(rig, "nvidia-smi -pl 330")


def test_second_deploy_changes_nothing(rig):
    run = deploy(rig)
    assert run.returncode == 0, run.output
    assert run.changed_operations() == 0, run.output
    assert runs(rig) == [TASK_POWER, TASK_BOOTSTRAP]


def test_every_script_sent_parses_as_powershell(rig):
    scripts = sent_scripts(rig)
    kinds = {line.split()[2] for s in scripts for line in s.splitlines() if line.startswith("# rigkit: ")}
    assert kinds == {"nvidia-smi", "file-sha256", "export-task", "register-task", "read-text", "run-task",
                     "weights-check", "install-dir-state", "secure-install-dir", "place-file", "windows-preflight"}
    for script in scripts:
        assert parse_errors(script) == [], script
        assert findings(script) == [], "\n".join(map(str, findings(script))) + "\n" + script


def test_an_edited_task_is_re_registered_and_drift_re_runs_the_policy(rig):
    # Someone raised the bootstrap's time limit in Task Scheduler, and a GPU lost its cap.
    limit = bootstrap_budget(load_rig(WIN_RIG, TEST_CATALOG)).task_duration()  # 180 + 30 + 180 s: PT7M
    on_rig(rig, f"sed -i 's|<ExecutionTimeLimit>{limit}<|<ExecutionTimeLimit>PT72H<|' {STORE}/tasks/{TASK_BOOTSTRAP}.xml")
    assert "PT72H" in on_rig(rig, f"cat {STORE}/tasks/{TASK_BOOTSTRAP}.xml")
    on_rig(rig, "nvidia-smi -i 1 -pl 450")
    run = deploy(rig)
    assert run.returncode == 0, run.output
    assert "drift: GPU 1: power limit is 450 W, policy says 330 W" in run.output
    assert f"<ExecutionTimeLimit>{limit}<" in on_rig(rig, f"cat {STORE}/tasks/{TASK_BOOTSTRAP}.xml")
    assert runs(rig)[2:] == [TASK_POWER, TASK_BOOTSTRAP]
    # The fake does not run the policy script, so the limit is restored by hand: the next deploy is clean.
    on_rig(rig, "nvidia-smi -i 1 -pl 330")
    assert deploy(rig).changed_operations() == 0


def test_a_failed_task_fails_the_deploy_and_is_run_again_by_the_next(rig, tmp_path):
    changed = tmp_path / "rig.yml"
    changed.write_text(WIN_RIG.read_text().replace("[0, 2200]", "[0, 2100]"))
    on_rig(rig, f"echo 2147942401 > {STORE}/task-result-{TASK_BOOTSTRAP}")
    failed = deploy(rig, changed)
    assert failed.returncode != 0
    assert f"{TASK_BOOTSTRAP} failed with result" in failed.output

    on_rig(rig, f"rm {STORE}/task-result-{TASK_BOOTSTRAP}")
    before = len(runs(rig))
    retried = deploy(rig, changed)  # every file is already in place; only the failed run is left
    assert retried.returncode == 0, retried.output
    assert runs(rig)[before:] == [TASK_BOOTSTRAP]
    assert deploy(rig, changed).changed_operations() == 0


def test_a_resume_from_sleep_runs_the_power_policy_again(rig):
    """Windows loses power limits over sleep (mVolt#32): the System log's resume event starts
    GPU-PowerPolicy. The stand-in matches the event against each registered task's own exported
    event query and plays the power script's table with the simulated nvidia-smi."""
    on_rig(rig, "nvidia-smi -pl 450 && nvidia-smi -rgc")  # what sleep left: defaults, clocks unlocked
    before = len(runs(rig))
    on_rig(rig, "powershell.exe --standin-event System Microsoft-Windows-Kernel-Power 42")  # entering sleep
    assert len(runs(rig)) == before
    on_rig(rig, "powershell.exe --standin-event System Microsoft-Windows-Kernel-Power 107")  # resumed
    assert runs(rig)[before:] == [TASK_POWER]
    assert [g["power_limit_w"] for g in rig.gpu_state()] == [330, 330]
    assert all(g["clock_lock"] for g in rig.gpu_state()), rig.gpu_state()
    on_rig(rig, "nvidia-smi -pl 450")
    on_rig(rig, "powershell.exe --standin-event System Microsoft-Windows-Power-Troubleshooter 1")
    assert runs(rig)[before:] == [TASK_POWER, TASK_POWER]
    assert [g["power_limit_w"] for g in rig.gpu_state()] == [330, 330]


def changes_on_rig(rig) -> tuple[str, str, str]:
    """What a deploy that changes something leaves: task runs, moves into place, icacls calls."""
    return tuple(rig.exec(f"cat {STORE}/{name} 2>/dev/null")[1] for name in ("runs.log", "moves.log", "icacls.log"))


def desktop(rig, **settings) -> None:
    """Docker Desktop's simulated settings (tests/simrig/docker.exe); none: its defaults."""
    on_rig(rig, f"echo '{json.dumps(settings)}' > {STORE}/docker-desktop.json" if settings else
           f"rm -f {STORE}/docker-desktop.json")


def test_the_preflight_refuses_docker_desktop_as_it_cannot_serve_and_changes_nothing(rig, tmp_path):
    """Docker Desktop's stand-in on the Hyper-V backend with no GPU support in containers, then a
    driver older than the image needs: each refused in one line before anything on the rig changed."""
    before = changes_on_rig(rig)
    desktop(rig, backend="hyperv", gpu_in_containers=False)
    run = deploy(rig)
    desktop(rig)
    assert run.returncode != 0
    assert "nothing was changed" in run.output and "Use the WSL 2 based engine" in run.output
    assert 'could not select device driver "" with capabilities: [[gpu]]' in run.output  # docker's own words
    catalog = copy_catalog(tmp_path, win_alpha=[("gpus: [0]", 'gpus: [0]\nimage_requires: {driver_min: "999.1"}')])
    old_driver = run_deploy(rig, WIN_RIG, catalog=catalog, inventory=INVENTORY, verify=False)
    assert old_driver.returncode != 0
    assert "is older than 999.1, the minimum for image rigkit-vllm-standin:sim" in old_driver.output
    assert changes_on_rig(rig) == before


def test_wsl_memory_is_written_to_wslconfig_and_applied_once(rig, tmp_path):
    """wsl_memory_gb/wsl_swap_gb: .wslconfig in the SSH user's profile gets them, WSL is shut down
    (nothing serves: the fake tasks start no model) and the bootstrap brings Docker Desktop and the
    stacks back; Docker Desktop's stand-in then reports the VM's new memory. A second deploy changes
    nothing; a rig without the settings leaves the file alone."""
    sized = tmp_path / "windows.yml"  # the same stem: the same rendered files (scripts name the rig)
    sized.write_text(WIN_RIG.read_text() + "wsl_memory_gb: 24\nwsl_swap_gb: 8\n")
    on_rig(rig, "mkdir -p /C:/Users/root && printf '[wsl2]\\r\\nprocessors=8\\r\\n' > /C:/Users/root/.wslconfig")
    before = len(runs(rig))
    run = deploy(rig, sized)
    assert run.returncode == 0, run.output
    assert on_rig(rig, "cat /C:/Users/root/.wslconfig") == "[wsl2]\r\nprocessors=8\r\nmemory=24GB\r\nswap=8GB\r\n"
    # (GPU-PowerPolicy runs too where the test before left another clock lock: not this test's concern.)
    assert [r for r in runs(rig)[before:] if r != TASK_POWER] == ["wsl-shutdown", TASK_BOOTSTRAP]
    assert json.loads(on_rig(rig, f"cat {STORE}/docker-desktop.json"))["wsl_memory_mb"] == 24 * 1024
    assert deploy(rig, sized).changed_operations() == 0
    assert deploy(rig).changed_operations() == 0
    assert [r for r in runs(rig)[before:] if r != TASK_POWER] == ["wsl-shutdown", TASK_BOOTSTRAP]
    desktop(rig)
    on_rig(rig, "rm /C:/Users/root/.wslconfig")


def test_a_windows_rig_reached_as_linux_is_refused_before_any_change(rig):
    run = run_deploy(rig, WIN_RIG)  # inventory/sim.py: plain SSH
    assert run.returncode != 0
    assert "has os: windows, but its inventory entry uses the SSHConnector; name it @winssh/<address>" in run.output
    linux = run_deploy(rig, POLICY_RIG, inventory=INVENTORY)
    assert linux.returncode != 0
    assert "has os: linux, but its inventory entry uses the Windows connector" in linux.output
    assert rig.exec("ls /C:/ProgramData/rigkit/stacks")[1].split() == ["win-alpha"]  # nothing new was put


def test_gpu_policy_remove_resets_the_gpus_unregisters_the_tasks_and_removes_the_files(rig, tmp_path):
    removed = tmp_path / "removed.yml"
    removed.write_text(WIN_RIG.read_text() + "gpu_policy: remove\n")
    on_rig(rig, "nvidia-smi -lgc 0,2200")  # the fake ran no policy script: lock the clocks as it would have
    before = len(runs(rig))
    run = deploy(rig, removed)
    assert run.returncode == 0, run.output
    assert runs(rig)[before:] == ["uninstall"]
    state = rig.gpu_state()  # read past rigkit: the simulated driver's settings
    assert [g["power_limit_w"] for g in state] == [450, 450]  # the 4090s' default limit
    assert [g["clock_lock"] for g in state] == [None, None]
    assert on_rig(rig, f"ls {STORE}/tasks").split() == []  # the watchdog's task too
    assert rig.exec("test -e /C:/ProgramData/rigkit")[0] != 0

    again = deploy(rig, removed)  # nothing of rigkit's is left: nothing to do
    assert again.returncode == 0, again.output
    assert again.changed_operations() == 0, again.output
    assert runs(rig)[before:] == ["uninstall"]
    scripts = sent_scripts(rig)
    kinds = {line.split()[2] for s in scripts for line in s.splitlines() if line.startswith("# rigkit: ")}
    assert {"uninstall", "install-dir-state"} <= kinds
    for script in scripts:
        assert findings(script) == [], "\n".join(map(str, findings(script))) + "\n" + script
