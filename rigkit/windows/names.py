"""Names and paths on a Windows rig, declared once: the install folder and what rigkit puts in it
(scripts, settings, logs, the rollout lock, the API key's env file, the records of task runs), the
scheduled tasks, and the few paths of Windows and Docker Desktop that rigkit reads or starts.
Imported by the bundle, the role, its operations, facts and status; the rendered scripts receive
them as variables. The Linux rig's names are rigkit.rigside.names'; the model rules (Compose
project, volume, served name) are the same on both and stay there. tests/test_layout.py fails when
one of these is spelled in rigkit's code anywhere else.
"""

from __future__ import annotations

from pathlib import PureWindowsPath

# Everything rigkit puts on a Windows rig (secured before anything goes there: rigkit.windows.install_dir)
INSTALL_DIR = PureWindowsPath(r"C:\ProgramData\rigkit")

# The scheduled tasks: two at logon as the logged-in user, the watchdog as SYSTEM
TASK_POWER = "GPU-PowerPolicy"
TASK_BOOTSTRAP = "LocalLLM-Bootstrap"
TASK_WATCHDOG = "LocalLLM-Watchdog"
TASKS = (TASK_POWER, TASK_BOOTSTRAP, TASK_WATCHDOG)

# The scripts the tasks run and the watchdog's settings, right in INSTALL_DIR
POWER_SCRIPT = INSTALL_DIR / "gpu-power-policy.ps1"
BOOTSTRAP_SCRIPT = INSTALL_DIR / "llm-bootstrap.ps1"
WATCHDOG_SCRIPT = INSTALL_DIR / "rigkit-watchdog.ps1"
WATCHDOG_CONFIG = INSTALL_DIR / "watchdog.json"

# Its folders, each made and secured with INSTALL_DIR (SUBFOLDERS; tests/test_windows_install_dir.py
# checks that each path rigkit uses is in one of them)
SECRETS_DIR = INSTALL_DIR / "secrets"
WATCHDOG_STATE_DIR = INSTALL_DIR / "watchdog"  # one JSON file per model, <model>.json (the watchdog's script)
LOCKS_DIR = INSTALL_DIR / "locks"
LOGS_DIR = INSTALL_DIR / "logs"
STACKS_DIR = INSTALL_DIR / "stacks"  # <model>\compose.yml
TASKS_DIR = INSTALL_DIR / "tasks"  # <task>.xml, as registered
APPLIED_DIR = INSTALL_DIR / "applied"  # <task>.txt: the digest of the inputs of its last successful run
WEIGHTS_DIR = INSTALL_DIR / "weights"
# <model>.txt: the deploy copied the model's weights again; the bootstrap's next `docker compose up`
# recreates that stack (a running container still serves the old ones), then removes it.
RECREATE_DIR = INSTALL_DIR / "recreate"
SUBFOLDERS = tuple(folder.name for folder in (SECRETS_DIR, WATCHDOG_STATE_DIR, LOCKS_DIR, LOGS_DIR, STACKS_DIR,
                                              TASKS_DIR, APPLIED_DIR, WEIGHTS_DIR, RECREATE_DIR))

# The API key's env file (Compose reads it raw, as on Linux); SYSTEM and Administrators only
# (rigkit.windows.acl_file). Not in the offline bundle: a deploy puts it, install.ps1 requires it.
API_KEY_FILE = SECRETS_DIR / "vllm-api-key.env"
# Held by LocalLLM-Bootstrap for its whole run (a rollout); the watchdog never restarts meanwhile.
ROLLOUT_LOCK = LOCKS_DIR / "rollout.lock"
LOG_PATH = LOGS_DIR / "rigkit.log"  # GPU-PowerPolicy's and LocalLLM-Bootstrap's lines
WATCHDOG_LOG_PATH = LOGS_DIR / "watchdog.log"
COPIER = WEIGHTS_DIR / "rigkit-copy.py"  # the weights copier's read-only check runs this copy

# Outside INSTALL_DIR: Docker Desktop as its installer puts it; the WSL2 VM's settings in the user's
# profile folder; where a script too long for a command line is uploaded, in the SSH account's home
DOCKER_DESKTOP = PureWindowsPath(r"C:\Program Files\Docker\Docker\Docker Desktop.exe")
DOCKER_DESKTOP_DISK_DIR = r"Docker\wsl"  # under %LOCALAPPDATA%: the WSL2 VM's disks
WSLCONFIG_NAME = ".wslconfig"  # under %UserProfile%
COMMAND_FILE_DIR = ".rigkit-commands"  # SFTP's form, relative to the account's home


def compose_path(model_name: str) -> str:
    """A model's Compose file."""
    return str(STACKS_DIR / model_name / "compose.yml")


def task_xml_path(task_name: str) -> str:
    """Where a task's XML is put before it is registered."""
    return str(TASKS_DIR / f"{task_name}.xml")


def applied_path(task_name: str) -> str:
    """The record of a task's last successful run (the digest of its inputs)."""
    return str(APPLIED_DIR / f"{task_name}.txt")


def recreate_marker(model_name: str) -> str:
    """Present: the bootstrap recreates this model's stack on its new weights (RECREATE_DIR)."""
    return str(RECREATE_DIR / f"{model_name}.txt")
