"""The preflight's checks and the base role's decisions, without a rig (pure functions, the
facts' parsers on captured output, and `rigkit check`). Simulates nothing."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from pydantic import ValidationError

from rigkit.base.packages import (
    BaseError,
    Distro,
    docker_list,
    docker_packages,
    driver_packages,
    engine_conflict,
    has_nvidia_runtime,
    nvidia_list,
)
from rigkit.cli import main
from rigkit.config.loader import load_rig
from rigkit.config.schema import AptRepoSpec, BaseSpec
from rigkit.preflight.checks import (
    DriverState,
    GpuArch,
    WeightsNeed,
    arch_problems,
    arch_runs_on,
    disk_problems,
    driver_problems,
    offline_findings,
)
from rigkit.gpu.facts import DriverAndGpus, NvidiaDriverAndGpus, NvidiaGpus
from rigkit.preflight.facts import DockerDiskFree, NvidiaDriver
from tests.conftest import SERVING_RIG, copy_catalog

REQUIRES = '\nimage_requires: {driver_min: "570.26", cuda: "12.8", archs: [sm_80, sm_86, sm_89, sm_90]}\n'


def rig_with(tmp_path, gpu_model="RTX 4090", requires=REQUIRES, extra=""):
    catalog = copy_catalog(tmp_path, test_alpha=[("gpus: [0]", "gpus: [0]" + requires)])
    text = SERVING_RIG.read_text().replace("model: RTX 4090", f"model: {gpu_model}")
    text = text.replace("power_limit_w: 330", "power_limit_w: 450").replace("psu_w: 1200", "psu_w: 2000")
    if extra:
        text = text.replace("base: {install: false}\n", extra)
    rig_file = tmp_path / "rig.yml"
    rig_file.write_text(text)
    return rig_file, catalog


@pytest.mark.parametrize("arch, cc, runs", [
    ("sm_80", (8, 6), True), ("sm_80", (8, 9), True), ("sm_86", (8, 0), False),
    ("sm_90", (12, 0), False), ("sm_100", (12, 0), False), ("sm_120", (12, 0), True),
    ("sm_90a", (9, 0), True), ("sm_90a", (10, 0), False), ("compute_90", (12, 0), True),
    ("compute_90", (8, 9), False),
])
def test_cuda_binary_compatibility(arch, cc, runs):
    assert arch_runs_on(arch, cc) is runs


def test_driver_not_installed(tmp_path):
    rig = load_rig(*rig_with(tmp_path))
    [problem] = driver_problems(rig, DriverState(installed=False))
    assert "the NVIDIA driver is not installed" in problem and "rigkit does not install the driver" in problem


@pytest.mark.parametrize("state", [
    DriverState(True, "580.95", None, (), 18, "Failed to initialize NVML: Driver/library version mismatch"),
    DriverState(True, "580.95.05", "570.133.07", (GpuArch(0, "NVIDIA GeForce RTX 4090", (8, 9)),)),
], ids=["nvml-error", "versions-differ"])
def test_module_and_library_mismatch_asks_for_a_reboot(tmp_path, state):
    rig = load_rig(*rig_with(tmp_path))
    [problem] = driver_problems(rig, state)
    assert "reboot to finish the driver upgrade" in problem
    assert state.library_version in problem


def test_driver_older_than_the_image_needs(tmp_path):
    rig = load_rig(*rig_with(tmp_path))
    state = DriverState(True, "550.54.15", "550.54.15", (GpuArch(0, "NVIDIA GeForce RTX 4090", (8, 9)),))
    [problem] = driver_problems(rig, state)
    assert "driver 550.54.15 is older than 570.26, the minimum for image rigkit-vllm-standin:sim (CUDA 12.8)" in problem
    assert "GPU 0 (NVIDIA GeForce RTX 4090)" in problem and "upgrade the driver to 570.26 or newer" in problem
    assert driver_problems(rig, DriverState(True, "580.95.05", "580.95.05")) == []


def test_blackwell_needs_sm_120(tmp_path):
    rig = load_rig(*rig_with(tmp_path, "RTX 5090"))
    [problem] = arch_problems(rig, [GpuArch(0, "NVIDIA GeForce RTX 5090", (12, 0))], "as the rig reports it")
    assert "GPU 0 (NVIDIA GeForce RTX 5090, compute capability 12.0" in problem
    assert "needs sm_120" in problem and "built for sm_80, sm_86, sm_89, sm_90 only" in problem
    assert "no kernel image is available" in problem


def test_disk_arithmetic():
    needs = [WeightsNeed("a", "/m/a", 30_000_000_000, 10_000_000_000), WeightsNeed("b", "/m/b", 5_000_000_000, 0)]
    [problem] = disk_problems(needs, 20_000_000_000, "/var/lib/docker/volumes")
    assert "a 20.0 GB + b 5.0 GB = 25.0 GB to copy, but /var/lib/docker/volumes has 20.0 GB free" in problem
    assert "free 5.0 GB there" in problem
    assert disk_problems(needs, 25_000_000_000, "/d") == []


def test_driver_fact_parses_what_nvidia_smi_and_the_kernel_say():
    ok = NvidiaDriver().process([
        "module-sys=", "module-proc=NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build",
        "gpu-cc=0, NVIDIA GeForce RTX 5090, 580.95.05, 12.0", "gpu-cc=1, NVIDIA GeForce RTX 4090, 580.95.05, 8.9",
        "rigkit-exit=0",
    ])
    assert ok.module_version == "580.95.05" and ok.library_version == "580.95.05"
    assert [g.compute_capability for g in ok.gpus] == [(12, 0), (8, 9)]
    assert [g.name for g in ok.gpus] == ["NVIDIA GeForce RTX 5090", "NVIDIA GeForce RTX 4090"]
    # A driver from before compute_cap refuses the one query; the second has no capability column.
    old = NvidiaDriver().process([
        "module-sys=470.256.02", "module-proc=", "0, NVIDIA GeForce RTX 3090, 470.256.02", "rigkit-exit=0",
    ])
    assert [(g.index, g.compute_capability) for g in old.gpus] == [(0, None)] and old.library_version == "470.256.02"
    # A warning nvidia-smi prints among the rows is reported whole, as before, not cut at a comma.
    warned = NvidiaDriver().process(["module-sys=580.95.05", "gpu-cc=WARNING: infoROM is corrupted at gpu 0000:01:00.0",
                                     "gpu-cc=0, NVIDIA GeForce RTX 4090, 580.95.05, 8.9", "rigkit-exit=0"])
    assert warned.error == "unexpected nvidia-smi line: 'WARNING: infoROM is corrupted at gpu 0000:01:00.0'"
    broken = NvidiaDriver().process([
        "module-sys=570.133.07", "module-proc=",
        "Failed to initialize NVML: Driver/library version mismatch", "NVML library version: 580.95", "rigkit-exit=18",
    ])
    assert (broken.exit_code, broken.library_version, broken.module_version) == (18, "580.95", "570.133.07")
    assert NvidiaDriver().process(["rigkit-no-nvidia-smi"]).installed is False
    disk = DockerDiskFree().process(["dir=/var/lib/docker", "/dev/sda1 100 40 60 40% /"])
    assert disk == {"dir": "/var/lib/docker", "free_bytes": 60}


def test_rigkit_check_refuses_an_image_without_the_gpus_arch(tmp_path, capsys):
    rig_file, catalog = rig_with(tmp_path, "RTX 5090")
    assert main(["check", str(rig_file), "--catalog", str(catalog)]) == 2
    err = capsys.readouterr().err
    assert "GPU 0 (RTX 5090, compute capability 12.0 for this model) needs sm_120" in err


def test_rigkit_check_refuses_a_driver_too_old_and_notes_the_minimum(tmp_path, capsys):
    rig_file, catalog = rig_with(tmp_path, extra='base: {install: false, driver_version: "550.54.15"}\n')
    assert main(["check", str(rig_file), "--catalog", str(catalog)]) == 2
    assert "driver 550.54.15 is older than 570.26" in capsys.readouterr().err
    rig_file, catalog = rig_with(tmp_path)
    assert main(["check", str(rig_file), "--catalog", str(catalog)]) == 0
    assert "driver 570.26 or newer is needed by this rig's images" in capsys.readouterr().err


def test_offline_findings_pass_a_supported_rig(tmp_path):
    problems, _ = offline_findings(load_rig(*rig_with(tmp_path, extra='base: {install: false, driver_version: "580.95.05"}\n')))
    assert problems == []


# ----- the base role's decisions ----------------------------------------------

@pytest.mark.parametrize("distro, source, packages", [
    (Distro("ubuntu", 24, "noble"), "distro", ("docker.io", "docker-compose-v2")),
    (Distro("debian", 13, "trixie"), "distro", ("docker.io", "docker-compose")),
    (Distro("debian", 12, "bookworm"), "docker", ("docker-ce", "docker-ce-cli", "containerd.io", "docker-compose-plugin")),
])
def test_docker_packages(distro, source, packages):
    assert docker_packages(distro, source) == packages


def test_debian_12_has_no_compose_v2_and_says_what_to_do():
    with pytest.raises(BaseError, match="set base.docker_source: docker"):
        docker_packages(Distro("debian", 12, "bookworm"), "distro")
    with pytest.raises(BaseError, match="Debian and Ubuntu"):
        docker_packages(Distro("fedora", 41, ""), "distro")


def test_an_engine_from_the_other_source_is_not_replaced():
    assert "set base.docker_source: docker to keep it" in engine_conflict({"docker-ce", "curl"}, "distro")
    assert engine_conflict({"docker.io"}, "distro") is None


def test_driver_packages_leave_the_container_toolkit_alone():
    installed = {"nvidia-driver", "nvidia-kernel-dkms", "libnvidia-ml1", "nvidia-driver-570-open", "libcuda1",
                 "libnvidia-container1", "libnvidia-container-tools", "nvidia-container-toolkit",
                 "nvidia-container-toolkit-base", "curl", "nvidia-persistenced", "firmware-nvidia-gsp"}
    assert driver_packages(installed) == ["firmware-nvidia-gsp", "libcuda1", "libnvidia-ml1", "nvidia-driver",
                                          "nvidia-driver-570-open", "nvidia-kernel-dkms", "nvidia-persistenced"]


def test_source_lines_and_daemon_json():
    spec = BaseSpec()
    assert nvidia_list(spec.nvidia_repo) == (
        "deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.asc] "
        "https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /\n")
    repo = AptRepoSpec(url="https://download.docker.com/linux/debian", key_url="https://download.docker.com/linux/debian/gpg")
    assert docker_list(repo, "amd64", "bookworm") == (
        "deb [arch=amd64 signed-by=/etc/apt/keyrings/docker.asc] https://download.docker.com/linux/debian bookworm stable\n")
    with pytest.raises(BaseError):
        docker_list(repo, "amd64; rm -rf /", "bookworm")
    assert has_nvidia_runtime('{"runtimes": {"nvidia": {"path": "nvidia-container-runtime"}}}')
    assert not has_nvidia_runtime('{"log-driver": "local"}') and not has_nvidia_runtime(None)
    assert not has_nvidia_runtime("{not json")


@pytest.mark.parametrize("url", ["http://x/a b", "http://x/'; reboot'", "ftp://x/", "http://x/$(id)", "http://x/\n"])
def test_repository_urls_are_refused_unless_plain(url):
    with pytest.raises(ValidationError):
        AptRepoSpec(url=url, key_url="http://x/gpgkey")


def test_driver_fact_command_asks_again_without_compute_cap(tmp_path):
    """Runs the fact's shell command with /bin/sh against a simulated nvidia-smi of a driver
    from before compute_cap (it refuses any query naming that field, as real ones do)."""
    fake = tmp_path / "nvidia-smi"
    fake.write_text('#!/bin/sh\ncase "$*" in *compute_cap*) echo \'Field "compute_cap" is not a valid field to query.\' >&2; '
                    'exit 2;; esac\necho "0, NVIDIA GeForce RTX 3090, 470.256.02"\n')
    fake.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    out = subprocess.run(["sh", "-c", NvidiaDriver().command()], env=env, capture_output=True, text=True, timeout=30)
    state = NvidiaDriver().process(out.stdout.splitlines())
    assert (state.exit_code, state.library_version) == (0, "470.256.02")
    assert [(g.index, g.name, g.compute_capability) for g in state.gpus] == [(0, "NVIDIA GeForce RTX 3090", None)]
    calls = tmp_path / "calls"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {calls}\necho "0, NVIDIA GeForce RTX 4090, 580.95.05, 8.9"\n')
    out = subprocess.run(["sh", "-c", NvidiaDriver().command()], env=env, capture_output=True, text=True, timeout=30)
    assert [g.compute_capability for g in NvidiaDriver().process(out.stdout.splitlines()).gpus] == [(8, 9)]
    assert len(calls.read_text().splitlines()) == 1  # a current driver is asked once


# What a simulated nvidia-smi prints for each query below (shell stand-ins, written per test).
_ROWS = {
    "both": "0, NVIDIA GeForce RTX 4090, 580.95.05, 8.9, GPU-4090-0, 450.00, 450.00, 450.00, 150.00, 600.00, Enabled, 3120, 24564",
    "report": "0, NVIDIA GeForce RTX 4090, GPU-4090-0, 450.00, 450.00, 450.00, 150.00, 600.00, Enabled, 3120, 24564",
    "driver": "0, NVIDIA GeForce RTX 4090, 580.95.05, 8.9",
    "old-driver": "0, NVIDIA GeForce RTX 3090, 470.256.02",
}


@pytest.mark.parametrize("kind", ["current", "before-compute-cap", "nvml-mismatch", "warning-row", "stderr-warning",
                                  "absent"])
def test_one_nvidia_smi_start_answers_as_the_driver_and_gpu_facts_alone(tmp_path, kind):
    """NvidiaDriverAndGpus, run with /bin/sh against shell stand-ins of nvidia-smi (a current
    driver; one from before compute_cap, which refuses any query naming it; one whose NVML
    refuses to start, exit 18; one printing a warning among its rows; none installed), answers
    what NvidiaDriver and NvidiaGpus answer alone, with one nvidia-smi start where the driver allows."""
    calls = tmp_path / "calls"
    rows = {"current": 'case "$*" in *compute_cap*uuid*) echo "%(both)s";; *uuid*) echo "%(report)s";; '
                       '*) echo "%(driver)s";; esac',
            "before-compute-cap": 'case "$*" in *compute_cap*) echo \'Field "compute_cap" is not a valid field to query.\' >&2; '
                                  'exit 2;; *uuid*) echo "%(report)s";; *) echo "%(old-driver)s";; esac',
            "nvml-mismatch": 'echo "Failed to initialize NVML: Driver/library version mismatch"; echo "NVML library version: 580.95"; exit 18',
            "warning-row": 'echo "WARNING: infoROM is corrupted at gpu 0000:01:00.0"; '
                           'case "$*" in *compute_cap*uuid*) echo "%(both)s";; *uuid*) echo "%(report)s";; *) echo "%(driver)s";; esac',
            "stderr-warning": 'echo "WARNING: infoROM is corrupted at gpu 0000:01:00.0" >&2; '
                              'case "$*" in *compute_cap*uuid*) echo "%(both)s";; *uuid*) echo "%(report)s";; *) echo "%(driver)s";; esac'}
    if kind != "absent":
        fake = tmp_path / "nvidia-smi"
        fake.write_text(f'#!/bin/sh\necho "$*" >> {calls}\n' + rows[kind] % _ROWS + "\n")
        fake.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}

    def answer(fact):
        command = fact.command()
        needs = fact.requires_command  # a name, or FactBase's method answering None
        if needs if isinstance(needs, str) else needs():  # as pyinfra wraps it
            command = f"if command -v nvidia-smi >/dev/null 2>&1; then ( {command} ); else echo '##PYINFRA_NOCMD##'; fi"
        out = subprocess.run(["sh", "-c", command], env=env, capture_output=True, text=True, timeout=30)
        lines = out.stdout.splitlines()
        return None if lines == ["##PYINFRA_NOCMD##"] else fact.process(lines)

    both = answer(NvidiaDriverAndGpus())
    started_for_both = len(calls.read_text().splitlines()) if calls.exists() else 0
    alone = DriverAndGpus(answer(NvidiaDriver()), answer(NvidiaGpus()))
    if kind == "stderr-warning":
        # Alone, the driver check did not see stderr and the GPU report failed on it (after the
        # base role); now the preflight fails on it too, before anything changes.
        assert both.gpus == alone.gpus and both.gpus.error.startswith("unexpected nvidia-smi line: 'WARNING")
        assert alone.driver.error is None and both.driver.error.startswith("unexpected nvidia-smi line: 'WARNING")
    else:
        assert both == alone
    # Refused, the one query costs a start more than the two facts alone (2 + 1).
    assert started_for_both == {"current": 1, "warning-row": 1, "stderr-warning": 1, "absent": 0}.get(kind, 4)
    if kind == "current":
        assert both.driver.gpus[0].compute_capability == (8, 9) and both.gpus.gpus[0].power_max_w == 600.0


def test_one_nvidia_smi_start_answers_as_the_two_facts_on_a_real_h200():
    """Not simulated: tests/data/nvidia-smi/h200-*.out are what each fact's command printed on
    a real H200 (driver 580.159.04, read-only queries, 2026-11-30): NvidiaDriverAndGpus's one
    start, and NvidiaDriver's and NvidiaGpus's commands alone."""
    def printed(name):
        return (Path(__file__).parent / "data/nvidia-smi" / f"h200-{name}.out").read_text().splitlines()

    both = NvidiaDriverAndGpus().process(printed("both"))
    assert both == DriverAndGpus(NvidiaDriver().process(printed("driver")), NvidiaGpus().process(printed("gpus")))
    assert both.driver.gpus[0].compute_capability == (9, 0) and both.gpus.gpus[0].power_max_w == 700.0
