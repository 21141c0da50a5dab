"""Roles preflight and base end to end on a bare simulated rig: real pyinfra over SSH, real apt
against real (local, signed) repositories, systemd in the rig.

Simulated: the GPUs and the driver behind nvidia-smi (tests/simrig/nvidia-smi: versions, a
module/library mismatch, compute capabilities), the packages' contents (tests/simrig/aptrepo.py:
stand-in driver packages, Docker's packages carrying the host's docker CLI, the real Compose
binary and a stand-in dockerd, the toolkit with a stand-in nvidia-ctk). Every assertion reads
the rig directly (dpkg-query, apt-mark, systemctl, the files), not through rigkit. The rig file
serves no models: the bare rig's stacks would be containers of the host's Docker beside the
test rig's, so serving is tested on the other rig (tests/test_serving.py).
"""

from __future__ import annotations

import json
import sys

import pytest

from tests.conftest import OPERATIONS_STARTED, POLICY_RIG, copy_catalog, run_deploy
from tests.simrig.aptrepo import AptRepos
from tests.simrig.rig import SimGpu, SimRig

pytestmark = pytest.mark.simrig

BARE_RIG_PORT = 2224  # the demo rig uses 2222, the test rig 2223
REQUIRES = '\nimage_requires: {driver_min: "570.26", cuda: "12.8", archs: [sm_80, sm_86, sm_89, sm_90]}\n'
# What the tests compare before and after a refused deploy: packages, holds, apt sources and keys,
# Docker's config, units, GPU settings.
RIG_STATE = (
    "dpkg-query -W -f '${Package} ${Version} ${Status}\\n' | sort; echo holds:; apt-mark showhold; "
    "ls -A /etc/apt/sources.list.d /etc/apt/keyrings /usr/share/keyrings /etc/docker /etc/rigkit "
    "/etc/systemd/system 2>&1; systemctl is-enabled nvidia-persistenced docker 2>&1; "
    "cat /run/nvidia-sim/calls.log 2>&1; true"
)
TOOLKIT_LIST = "/etc/apt/sources.list.d/nvidia-container-toolkit.list"


@pytest.fixture(scope="module")
def repos():
    with AptRepos() as served:
        yield served


@pytest.fixture(scope="module")
def bare(repos):
    rig = SimRig(name="rigkit-bare", ssh_port=BARE_RIG_PORT, bare=True, apt_sources=repos.distro_sources())
    rig.start(log=lambda m: print(m, file=sys.stderr))
    # Before rigkit: the rig's owner installed the NVIDIA driver from the distribution.
    code, out = rig.exec("apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q nvidia-driver")
    assert code == 0, out
    yield rig
    rig.remove()


def rig_file(tmp_path, repos, base_extra="", gpu_text=None, models=""):
    text = gpu_text or POLICY_RIG.read_text()
    text = text.replace("base: {install: false}\n", repos.rig_file_base() + base_extra) + models
    path = tmp_path / "bare.yml"
    path.write_text(text)
    return path


def reset_gpus(rig):
    rig.gpus, rig.driver_version, rig.module_version = [SimGpu(), SimGpu()], "580.95.05", None
    rig.write_gpu_config()


BLACKWELL = SimGpu(name="NVIDIA GeForce RTX 5090", min_w=400, max_w=600, default_w=575, compute_cap="12.0")


@pytest.mark.parametrize("case, message", [
    ("old-driver", "driver 550.54.15 is older than 570.26, the minimum for image rigkit-vllm-standin:sim (CUDA 12.8)"),
    ("blackwell", "GPU 0 (NVIDIA GeForce RTX 5090, compute capability 12.0 as the rig reports it) needs sm_120"),
    ("mismatch", "and its library (580.95) disagree (NVML: Driver/library version mismatch"),
    ("debian12-distro", "Debian 12 has no Compose v2 package (its docker-compose is the old v1): set "
                        "base.docker_source: docker"),
], ids=["old-driver", "blackwell", "mismatch", "debian12-distro"])
def test_refused_before_anything_changes(bare, repos, tmp_path, case, message):
    catalog = copy_catalog(tmp_path, test_alpha=[("gpus: [0]", "gpus: [0]" + REQUIRES)])
    gpu_text, base_extra = None, ""
    if case == "old-driver":
        bare.driver_version = "550.54.15"
    elif case == "blackwell":
        bare.gpus = [BLACKWELL, BLACKWELL]
        gpu_text = (POLICY_RIG.read_text().replace("RTX 4090", "RTX 5090").replace("power_limit_w: 330", "power_limit_w: 450")
                    .replace("psu_w: 1200", "psu_w: 2000"))
    elif case == "mismatch":
        bare.module_version = "570.133.07"  # upgraded to 580.95.05, not rebooted
    bare.write_gpu_config()
    path = rig_file(tmp_path, repos, base_extra, gpu_text, models="models: [test-alpha]\n")
    if case == "debian12-distro":
        path.write_text(path.read_text().replace("  docker_source: docker\n", "  docker_source: distro\n"))
    before = bare.exec(RIG_STATE)[1]
    try:
        run = run_deploy(bare, path, catalog=catalog)
    finally:
        reset_gpus(bare)
    assert run.returncode != 0
    assert message in run.output, run.output[-3000:]
    assert "nothing was changed" in run.output
    assert OPERATIONS_STARTED not in run.output
    assert bare.exec(RIG_STATE)[1] == before


def test_first_deploy_installs_the_base_then_changes_nothing(bare, repos, tmp_path):
    path = rig_file(tmp_path, repos)
    first = run_deploy(bare, path)
    assert first.returncode == 0, first.output[-4000:]

    code, out = bare.exec("dpkg-query -W -f '${Package} ${Status}\\n' docker-ce docker-ce-cli containerd.io "
                          "docker-compose-plugin nvidia-container-toolkit")
    assert code == 0 and out.count("install ok installed") == 5, out
    code, out = bare.exec("docker compose version")
    assert code == 0 and "Docker Compose version" in out, out
    daemon = json.loads(bare.exec("cat /etc/docker/daemon.json")[1])
    assert daemon["runtimes"]["nvidia"]["path"] == "nvidia-container-runtime"
    starts = bare.exec("cat /var/log/rigkit-sim/dockerd-starts.log")[1].splitlines()
    assert '"nvidia"' in starts[-1], starts  # Docker was (re)started after its runtime was configured
    assert bare.exec("systemctl is-active docker nvidia-persistenced")[1].split() == ["active", "active"]
    assert bare.exec("systemctl is-enabled docker nvidia-persistenced")[1].split() == ["enabled", "enabled"]
    assert bare.exec("apt-mark showhold")[1].split() == ["nvidia-driver", "nvidia-kernel-dkms"]
    assert bare.exec(f"cat {TOOLKIT_LIST}")[1] == (
        "deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.asc] "
        f"{repos.url}/nvidia/stable/deb/$(ARCH) /\n")

    second = run_deploy(bare, path)
    assert second.returncode == 0, second.output[-4000:]
    assert second.changed_operations() == 0, second.output[-4000:]
    assert bare.exec("cat /var/log/rigkit-sim/dockerd-starts.log")[1].splitlines() == starts  # no restart


def test_hold_driver_false_unholds_the_driver(bare, repos, tmp_path):
    path = rig_file(tmp_path, repos, base_extra="  hold_driver: false\n")
    run = run_deploy(bare, path)
    assert run.returncode == 0, run.output[-4000:]
    assert "apt-mark unhold the NVIDIA driver: nvidia-driver, nvidia-kernel-dkms" in run.output
    assert bare.exec("apt-mark showhold")[1].split() == []
    assert run_deploy(bare, path).changed_operations() == 0
