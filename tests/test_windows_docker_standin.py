"""Docker Desktop's stand-in (tests/simrig/docker.exe) refuses what Docker Desktop's settings do not
allow: a container on the host network while "Enable host networking" is off (its default), and a
container asking for more memory than the WSL2 VM has. And the compose files rigkit renders for a
Windows rig pass it, while a Linux one (host networking) does not.

Simulates Docker Desktop's settings with a JSON file (RIGKIT_SIM_DOCKER_DESKTOP); the CLI path runs
the stand-in as a process with a `docker` on PATH that only says it ran. No Docker engine is used.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from rigkit.config.loader import load_rig
from rigkit.serving.compose import render_compose
from rigkit.windows.bundle import render_bundle
from tests.conftest import DATA, REPO, TEST_CATALOG

STANDIN = REPO / "tests" / "simrig" / "docker.exe"


@pytest.fixture
def desktop(tmp_path, monkeypatch):
    """The stand-in as a module, with its settings file in tmp_path; returns (module, write settings)."""
    settings = tmp_path / "docker-desktop.json"
    monkeypatch.setenv("RIGKIT_SIM_DOCKER_DESKTOP", str(settings))
    loader = importlib.machinery.SourceFileLoader("docker_exe_standin", str(STANDIN))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module, lambda **values: settings.write_text(json.dumps(values))


def test_host_networking_is_refused_until_the_setting_is_on(desktop):
    module, write = desktop
    why = module.refusal("host", None)
    assert why and "Enable host networking" in why and "docs.docker.com/engine/network/drivers/host" in why
    assert module.create_refusal(json.dumps({"HostConfig": {"NetworkMode": "host"}}).encode()) == why
    assert module.refusal("bridge", None) is None and module.refusal(None, None) is None
    write(host_networking=True)
    assert module.refusal("host", None) is None


def test_a_memory_request_above_the_wsl2_vm_is_refused(desktop):
    module, write = desktop
    assert module.memory_bytes("16g") == 16 * 1024 ** 3 and module.memory_bytes("512m") == 512 * 1024 ** 2
    assert module.memory_bytes("1073741824") == 1024 ** 3 and module.memory_bytes("2gb") == 2 * 1024 ** 3
    assert module.refusal(None, 16 * 1024 ** 3) is None  # the default VM: 16384 MiB
    why = module.refusal(None, 16 * 1024 ** 3 + 1)
    assert why and "WSL2 VM's 16384 MiB" in why
    write(wsl_memory_mb=8192)
    assert "8192 MiB" in module.create_refusal(json.dumps({"HostConfig": {"Memory": 9 * 1024 ** 3}}).encode())
    assert module.create_refusal(json.dumps({"HostConfig": {"Memory": 0}}).encode()) is None  # 0: no limit


def test_the_cli_refuses_with_exit_125_and_runs_what_it_allows(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text("#!/bin/sh\necho ran \"$@\"\n")
    (bin_dir / "docker").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "RIGKIT_SIM_DOCKER_DESKTOP": str(tmp_path / "docker-desktop.json")}

    def docker_exe(*args):
        return subprocess.run([sys.executable, str(STANDIN), *args], capture_output=True, text=True, env=env, timeout=60)

    for refused in (["run", "--network", "host", "img"], ["run", "--net=host", "img"], ["run", "-m", "64g", "img"],
                    ["create", "--memory=20g", "img"]):
        done = docker_exe(*refused)
        assert done.returncode == 125 and done.stderr.startswith("docker: Error response from daemon: "), refused
    done = docker_exe("run", "--memory", "8g", "img")
    assert done.returncode == 0 and done.stdout.strip() == "ran run --memory 8g img"


def test_rigkits_windows_compose_files_pass_and_a_host_network_one_does_not(desktop, tmp_path):
    module, _ = desktop
    rig = load_rig(DATA / "rigs" / "windows.yml", TEST_CATALOG)
    composes = {name: text for name, text in render_bundle(rig).items() if name.endswith("compose.yml")}
    assert composes
    for name, text in composes.items():
        path = tmp_path / name.replace("/", "_")
        path.write_text(text)
        assert module.cli_refusal(["compose", "-f", str(path), "up", "-d"]) is None, name
    linux = tmp_path / "linux.yml"
    linux.write_text(render_compose(rig.models[0], with_api_key=False, env_file="x", host="127.0.0.1", publish=False))
    assert "network_mode: host" in linux.read_text()
    assert "Enable host networking" in module.cli_refusal(["compose", "-f", str(linux), "up", "-d"])
