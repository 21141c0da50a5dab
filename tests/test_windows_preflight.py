"""The Windows preflight's decisions (rigkit.windows.preflight), without a rig: each refusal from
facts as the preflight's read returns them, the .wslconfig it writes, and the rig settings'
validation. Simulates nothing: the facts are built here, in the form Docker Desktop's `docker version`
/ `docker info --format '{{json .}}'` (docs.docker.com reference/cli/docker/version, system/info) and
nvidia-smi's `--format=csv,noheader` give them. The deploy against Docker Desktop's stand-in is in
tests/test_windows_deploy.py."""

from __future__ import annotations

import base64
import json

import pytest

from rigkit.config.errors import ConfigError
from rigkit.config.loader import load_rig
from rigkit.windows.preflight import (
    GIB,
    Answer,
    PreflightFacts,
    needed_memory_bytes,
    parse_preflight,
    preflight_problems,
    serving_models,
    vm_applied,
    wslconfig_text,
)
from tests.conftest import DATA, TEST_CATALOG, copy_catalog

WIN_RIG = DATA / "rigs" / "windows.yml"
IMAGE = "rigkit-vllm-standin:sim"
REQUIRES = '\nimage_requires: {driver_min: "570.26", cuda: "12.8", archs: [sm_80, sm_86, sm_89, sm_90]}\n'
WSL2 = "5.15.167.4-microsoft-standard-WSL2"


def win_rig(tmp_path, extra: str = "", requires: str = REQUIRES, weight_bytes: int | None = None):
    model = "gpus: [0]" + requires + (f"weight_bytes: {weight_bytes}\n" if weight_bytes else "")
    catalog = copy_catalog(tmp_path, win_alpha=[("gpus: [0]", model)])
    rig_file = tmp_path / "win.yml"
    rig_file.write_text(WIN_RIG.read_text() + extra)
    return load_rig(rig_file, catalog)


def facts(**changes) -> PreflightFacts:
    """A healthy Docker Desktop 4.37.1 on WSL2 with a 16 GiB VM on a 32 GiB machine, two RTX 4090s
    visible in a container with driver 580.88, 500 GB free, nothing serving."""
    version = {"Client": {"Os": "windows"}, "Server": {"Platform": {"Name": "Docker Desktop 4.37.1 (178610)"},
                                                      "KernelVersion": WSL2, "Os": "linux"}}
    info = {"OperatingSystem": "Docker Desktop", "KernelVersion": WSL2, "MemTotal": int(16 * GIB * 0.96)}
    values = dict(  # docker.exe's stderr follows its stdout in the fact's output
        version=Answer(0, json.dumps(version)), info=Answer(0, json.dumps(info) + "\nWARNING: a warning on stderr"), compose=Answer(0, "2.31.0"),
        gpu=Answer(0, "0, NVIDIA GeForce RTX 4090, 580.88, 8.9\n1, NVIDIA GeForce RTX 4090, 580.88, 8.9"),
        serving=Answer(0, ""), volumes=Answer(0, ""), user_profile="C:\\Users\\you", host_memory_bytes=32 * GIB,
        disk_dir="C:\\Users\\you\\AppData\\Local\\Docker\\wsl", disk_free_bytes=500 * 10 ** 9, wslconfig=None,
        source_bytes={"win-alpha": 10 ** 9})
    values.update(changes)
    return PreflightFacts(**values)


def only(problems: list[str], *words: str) -> str:
    assert len(problems) == 1, problems
    assert "\n" not in problems[0]
    for word in words:
        assert word in problems[0], problems[0]
    return problems[0]


def test_a_healthy_docker_desktop_passes(tmp_path):
    assert preflight_problems(win_rig(tmp_path), facts(), IMAGE, False) == []


def test_refused_when_docker_desktops_engine_does_not_answer(tmp_path):
    late = facts(version=Answer(-1, "", timed_out=True), info=Answer(-1, "", timed_out=True))
    only(preflight_problems(win_rig(tmp_path), late, IMAGE, False), "did not answer", "start Docker Desktop")
    down = facts(version=Answer(1, "error during connect: ... open //./pipe/dockerDesktopLinuxEngine: The system "
                                   "cannot find the file specified."))
    only(preflight_problems(win_rig(tmp_path), down, IMAGE, False), "dockerDesktopLinuxEngine", "start Docker Desktop")


def test_refused_when_docker_exe_reaches_another_engine(tmp_path):
    other = facts(version=Answer(0, json.dumps({"Server": {"Platform": {"Name": "Docker Engine - Community"},
                                                           "KernelVersion": WSL2}})))
    only(preflight_problems(win_rig(tmp_path), other, IMAGE, False), "'Docker Engine - Community'",
         "docker context use desktop-linux")


def test_refused_on_the_hyper_v_backend(tmp_path):
    version = {"Server": {"Platform": {"Name": "Docker Desktop 4.37.1 (178610)"}, "KernelVersion": "6.10.14-linuxkit"}}
    only(preflight_problems(win_rig(tmp_path), facts(version=Answer(0, json.dumps(version))), IMAGE, False),
         "6.10.14-linuxkit", "Use the WSL 2 based engine")


def test_an_old_compose_is_refused_only_where_the_key_file_needs_it(tmp_path):
    old = facts(compose=Answer(0, "2.29.7"))
    assert preflight_problems(win_rig(tmp_path), old, IMAGE, False) == []
    key = tmp_path / "key"
    key.write_text("sk-test\n")
    key.chmod(0o600)
    keyed = win_rig(tmp_path, f"api_key_file: {key}\n")
    only(preflight_problems(keyed, old, IMAGE, False), "Compose 2.29.7", "2.30.0", "Software updates")


def test_refused_when_no_gpu_is_visible_inside_a_container(tmp_path):
    error = 'docker: Error response from daemon: could not select device driver "" with capabilities: [[gpu]].'
    only(preflight_problems(win_rig(tmp_path), facts(gpu=Answer(125, error)), IMAGE, False),
         "could not select device driver", "wsl --update")
    one = facts(gpu=Answer(0, "1, NVIDIA GeForce RTX 4090, 580.88, 8.9"))
    only(preflight_problems(win_rig(tmp_path), one, IMAGE, False), "GPU 0 of the rig's models is not visible")


def test_an_image_not_pulled_yet_is_not_a_refusal(tmp_path):
    missing = facts(gpu=Answer(125, f"docker: Error response from daemon: No such image: {IMAGE}."))
    assert preflight_problems(win_rig(tmp_path), missing, IMAGE, False) == []


def test_refused_for_a_driver_older_than_the_image_and_an_architecture_it_lacks(tmp_path):
    """The Linux checks (rigkit.preflight.checks), on what nvidia-smi printed inside the container."""
    old = facts(gpu=Answer(0, "0, NVIDIA GeForce RTX 4090, 566.36, 8.9\n1, NVIDIA GeForce RTX 4090, 566.36, 8.9"))
    only(preflight_problems(win_rig(tmp_path), old, IMAGE, False), "driver 566.36 is older than 570.26",
         "upgrade the driver")
    blackwell = facts(gpu=Answer(0, "0, NVIDIA GeForce RTX 5090, 580.88, 12.0\n1, NVIDIA GeForce RTX 4090, 580.88, 8.9"))
    only(preflight_problems(win_rig(tmp_path), blackwell, IMAGE, False), "GPU 0", "sm_120",
         "inside a container", "no kernel image")


def test_refused_when_the_wsl2_vm_is_smaller_than_the_models_need(tmp_path):
    rig = win_rig(tmp_path, weight_bytes=20 * GIB)
    need, unknown = needed_memory_bytes(rig)
    assert need == (2 + 20 + 4) * GIB and unknown == []
    why = only(preflight_problems(rig, facts(), IMAGE, False), "15.4 GB, docker info", "26.0 GB",
               "VM 2 GB + win-alpha 20.0 GB weights + 4 GB x 1 GPU", "set wsl_memory_gb: 26")
    assert str(rig.file) in why


def test_wsl_memory_gb_too_small_too_large_or_not_applicable_while_serving(tmp_path):
    small = win_rig(tmp_path, "wsl_memory_gb: 24\n", weight_bytes=20 * GIB)
    only(preflight_problems(small, facts(), IMAGE, True), "wsl_memory_gb 24 GB", "raise wsl_memory_gb", "to 26")
    big = win_rig(tmp_path, "wsl_memory_gb: 64\n")
    only(preflight_problems(big, facts(), IMAGE, True), "wsl_memory_gb in", "64 GB, more than the 32.0 GB Windows has")
    fits = win_rig(tmp_path, "wsl_memory_gb: 28\n", weight_bytes=20 * GIB)
    assert preflight_problems(fits, facts(), IMAGE, True) == []
    # Serving: WSL is not restarted, so the VM as it runs now (16 GiB) counts.
    only(preflight_problems(fits, facts(), IMAGE, False), "stop the models")


def test_refused_when_the_weights_do_not_fit_on_docker_desktops_drive(tmp_path):
    rig = win_rig(tmp_path)
    tight = facts(source_bytes={"win-alpha": 60 * 10 ** 9}, disk_free_bytes=50 * 10 ** 9)
    only(preflight_problems(rig, tight, IMAGE, False), "not enough disk", "60.0 GB to copy",
         "Docker Desktop's disk image (C:\\Users\\you\\AppData\\Local\\Docker\\wsl)", "50.0 GB free")
    copied = facts(source_bytes={"win-alpha": 60 * 10 ** 9}, disk_free_bytes=50 * 10 ** 9,
                   volumes=Answer(0, "rigkit-weights-win-alpha\nother"))
    assert preflight_problems(rig, copied, IMAGE, False) == []  # its volume exists: the copy resumes or is done


def test_serving_and_applied_are_read_from_docker(tmp_path):
    rig = win_rig(tmp_path, "wsl_memory_gb: 16\n")
    assert serving_models(rig, facts(serving=Answer(0, "rigkit-win-alpha\nrigkit-win-alpha\nsomething"))) == ["win-alpha"]
    assert serving_models(rig, facts()) == []
    assert vm_applied(rig, facts())  # 96% of 16 GiB: the VM runs with memory=16GB
    assert not vm_applied(rig, facts(info=Answer(0, json.dumps({"MemTotal": 8 * GIB}))))


def test_parse_reads_each_section():
    lines = ["rigkit-section=version", "rigkit-exit=0 timed-out=False", '{"Server": {}}',
             "rigkit-section=info", "rigkit-exit=-1 timed-out=True",
             "rigkit-section=compose", "rigkit-exit=0 timed-out=False", "2.31.0",
             "rigkit-section=host", "profile=C:\\Users\\you", "memory=34359738368", "disk-dir=C:\\x", "disk-free=123",
             "rigkit-section=wslconfig", "rigkit-absent",
             "rigkit-section=source win-alpha", "1000", "rigkit-section=source gone", "rigkit-absent"]
    parsed = parse_preflight(lines)
    assert parsed.version == Answer(0, '{"Server": {}}') and parsed.info.timed_out and parsed.compose.output == "2.31.0"
    assert parsed.gpu is None and parsed.serving.exit_code == -1
    assert (parsed.user_profile, parsed.host_memory_bytes, parsed.disk_free_bytes) == ("C:\\Users\\you", 32 * GIB, 123)
    assert parsed.wslconfig is None and parsed.source_bytes == {"win-alpha": 1000, "gone": None}
    for data in (b"[wsl2]\r\nmemory=8GB\r\n", b"\xef\xbb\xbf[wsl2]\r\nmemory=8GB\r\n",
                 "[wsl2]\r\nmemory=8GB\r\n".encode("utf-16")):  # as written by hand, with a BOM, by Out-File
        read = parse_preflight(["rigkit-section=wslconfig", base64.b64encode(data).decode()]).wslconfig
        assert read == "[wsl2]\r\nmemory=8GB\r\n"


def test_wslconfig_sets_memory_and_swap_and_keeps_everything_else():
    """Keys as Microsoft documents them (learn.microsoft.com/windows/wsl/wsl-config: [wsl2] memory=,
    swap=, sizes with a unit, swap=0 for none)."""
    assert wslconfig_text(None, None, None) is None
    assert wslconfig_text(None, 48, None) == "[wsl2]\r\nmemory=48GB\r\n"
    assert wslconfig_text(None, 48, 0) == "[wsl2]\r\nmemory=48GB\r\nswap=0\r\n"
    mine = "[wsl2]\nprocessors=8\nMemory = 8GB\n\n[experimental]\nsparseVhd=true\n"
    assert wslconfig_text(mine, 48, 16) == ("[wsl2]\nprocessors=8\nmemory=48GB\n\nswap=16GB\n[experimental]\n"
                                            "sparseVhd=true\n")
    other = "[experimental]\nautoMemoryReclaim=dropcache\n"
    assert wslconfig_text(other, 48, None) == other + "\n[wsl2]\nmemory=48GB\n"
    once = wslconfig_text(mine, 48, 16)
    assert wslconfig_text(once, 48, 16) == once  # a second deploy changes nothing


@pytest.mark.parametrize("extra, words", [
    ("wsl_memory_gb: 1\n", ["wsl_memory_gb", "greater than or equal to 2"]),
    ("wsl_memory_gb: '48'\n", ["wsl_memory_gb", "integer"]),
    ("wsl_swap_gb: -1\n", ["wsl_swap_gb", "greater than or equal to 0"]),
    ("wsl_swap_gb: 5000\n", ["wsl_swap_gb", "less than or equal to 4096"]),
])
def test_wsl_settings_are_validated(tmp_path, extra, words):
    rig_file = tmp_path / "win.yml"
    rig_file.write_text(WIN_RIG.read_text() + extra)
    with pytest.raises(ConfigError) as caught:
        load_rig(rig_file, TEST_CATALOG)
    text = str(caught.value)
    for word in words:
        assert word in text, text


def test_wsl_settings_belong_to_windows_rigs(tmp_path):
    rig_file = tmp_path / "linux.yml"
    rig_file.write_text((DATA / "rigs" / "serving.yml").read_text() + "wsl_memory_gb: 48\n")
    with pytest.raises(ConfigError) as caught:
        load_rig(rig_file, TEST_CATALOG)
    assert "sizes the WSL2 VM of a Windows rig" in str(caught.value)
