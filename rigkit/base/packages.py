"""What the base role installs and holds, and the apt source lines it writes. Pure functions."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from rigkit.config.schema import AptRepoSpec, BaseSpec

# Where the signing keys go. apt reads ASCII-armored keys named *.asc, so no gpg is needed on the rig.
NVIDIA_KEYRING = "/usr/share/keyrings/nvidia-container-toolkit-keyring.asc"
NVIDIA_LIST = "/etc/apt/sources.list.d/nvidia-container-toolkit.list"
DOCKER_KEYRING = "/etc/apt/keyrings/docker.asc"
DOCKER_LIST = "/etc/apt/sources.list.d/docker.list"
DAEMON_JSON = "/etc/docker/daemon.json"

TOOLKIT_PACKAGES = ("nvidia-container-toolkit",)
PREREQUISITES = ("ca-certificates", "curl")  # to fetch the repositories' keys
DISTRO_ENGINES = ("docker.io",)
DOCKER_CE_ENGINES = ("docker-ce",)


class BaseError(Exception):
    """This rig's base cannot be installed as its rig file says; nothing was changed."""


@dataclass(frozen=True)
class Distro:
    id: str  # os-release ID: debian, ubuntu
    major: int | None
    codename: str


def docker_packages(distro: Distro, source: str) -> tuple[str, ...]:
    """Docker Engine and the Compose v2 plugin for this distribution, from `source`."""
    if distro.id not in ("debian", "ubuntu"):
        raise BaseError(f"the base role installs on Debian and Ubuntu; this rig runs {distro.id!r}: install Docker "
                        "Engine, Compose v2 and the NVIDIA Container Toolkit yourself and set base.install: false")
    if source == "docker":
        return ("docker-ce", "docker-ce-cli", "containerd.io", "docker-compose-plugin")
    if distro.id == "ubuntu":
        return ("docker.io", "docker-compose-v2")
    if distro.major is not None and distro.major >= 13:
        return ("docker.io", "docker-compose")  # Debian's docker-compose is Compose v2 from trixie on
    raise BaseError(
        f"Debian {distro.major or distro.codename} has no Compose v2 package (its docker-compose is the old v1): "
        "set base.docker_source: docker to install Docker Engine and Compose v2 from Docker's apt repository"
    )


def engine_conflict(installed: set[str], source: str) -> str | None:
    """Docker Engine already installed from the other source: installing ours would replace it."""
    other = DOCKER_CE_ENGINES if source == "distro" else DISTRO_ENGINES
    found = sorted(installed & set(other))
    if not found:
        return None
    wanted = "docker" if source == "distro" else "distro"
    return (f"Docker Engine is installed from {'Docker' if source == 'distro' else 'the distribution'} "
            f"(package {', '.join(found)}), but the rig file says base.docker_source: {source}: set "
            f"base.docker_source: {wanted} to keep it, or remove it first")


def docker_repo(spec: BaseSpec, distro: Distro) -> AptRepoSpec:
    if spec.docker_repo is not None:
        return spec.docker_repo
    url = f"https://download.docker.com/linux/{distro.id}"
    return AptRepoSpec(url=url, key_url=f"{url}/gpg")


def docker_list(repo: AptRepoSpec, arch: str, codename: str) -> str:
    """Docker's documented source line (https://docs.docker.com/engine/install/debian/)."""
    _check_word("architecture", arch)
    _check_word("codename", codename)
    return f"deb [arch={arch} signed-by={DOCKER_KEYRING}] {repo.url} {codename} stable\n"


def nvidia_list(repo: AptRepoSpec) -> str:
    """NVIDIA's documented source line: a flat repository whose URL apt completes with $(ARCH)."""
    return f"deb [signed-by={NVIDIA_KEYRING}] {repo.url} /\n"


def _check_word(what: str, value: str) -> None:
    if not re.fullmatch(r"[a-z0-9][a-z0-9.+-]*", value or ""):
        raise BaseError(f"unexpected {what} {value!r} reported by the rig")


# The driver's own packages, as Debian, Ubuntu and NVIDIA's CUDA repository name them; the
# container toolkit's libnvidia-container* and nvidia-container-* are not the driver.
_DRIVER = re.compile(
    r"(nvidia-(driver|dkms|kernel|utils|compute-utils|open|firmware|modprobe|persistenced|smi|alternative|"
    r"settings|vdpau-driver|egl-icd|vulkan-icd|opencl-icd|fabricmanager|headless|cuda-mps|suspend-common)"
    r"|libnvidia-|libcuda1|libnvcuvid|libnvoptix|cuda-drivers|firmware-nvidia|linux-(modules|objects|signatures)-nvidia|"
    r"xserver-xorg-video-nvidia|libxnvctrl).*"
)
_NOT_DRIVER = re.compile(r"(libnvidia-container|nvidia-container-).*")


def driver_packages(installed: set[str]) -> list[str]:
    """The installed packages that make up the NVIDIA driver (what `apt-mark hold` holds)."""
    return sorted(p for p in installed if _DRIVER.fullmatch(p) and not _NOT_DRIVER.fullmatch(p))


def has_nvidia_runtime(daemon_json: str | None) -> bool:
    """Whether Docker's daemon.json already names the nvidia runtime (`nvidia-ctk runtime configure` adds it)."""
    if not daemon_json or not daemon_json.strip():
        return False
    try:
        config = json.loads(daemon_json)
    except ValueError:
        return False
    runtimes = config.get("runtimes") if isinstance(config, dict) else None
    return isinstance(runtimes, dict) and "nvidia" in runtimes
