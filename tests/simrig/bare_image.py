"""The bare variant of the simulated rig's image, for SimRig(bare=True). TEST INFRASTRUCTURE.

The rig image (image.py) with the docker CLI, Debian's Docker packages and the Compose plugin
removed and no apt source: a bare OS with only the (simulated) NVIDIA driver, for the base role
to install onto. Docker's units are unmasked and nvidia-persistenced is disabled, as on a fresh
install. Built FROM the rig image (no registry, no debootstrap run of its own) and tagged with a
hash of this recipe and the rig image's tag, so an unchanged recipe reuses it. It lives apart
from image.py because that image's tag hashes image.py itself.
"""

from __future__ import annotations

import hashlib
import io
import tarfile

import docker

from tests.simrig.image import ensure_image

BARE_IMAGE_REPO = "rigkit-simrig-bare"

BARE_RECIPE = """\
FROM {base}
RUN set -eu; \\
    dpkg --purge docker.io >/dev/null; \\
    for p in containerd runc tini; do dpkg --purge "$p" >/dev/null 2>&1 || true; done; \\
    rm -rf /usr/libexec/docker /etc/docker; \\
    rm -f /etc/systemd/system/docker.service /etc/systemd/system/docker.socket \\
          /etc/systemd/system/containerd.service /etc/apt/sources.list; \\
    systemctl disable nvidia-persistenced.service >/dev/null 2>&1; \\
    ! command -v docker
"""


def ensure_bare_image(client: docker.DockerClient | None = None, log=print) -> str:
    """Return the tag of the bare rig image, building it first if this recipe has none yet."""
    client = client or docker.from_env()
    base = ensure_image(client, log=log)
    recipe = BARE_RECIPE.format(base=base)
    tag = f"{BARE_IMAGE_REPO}:{hashlib.sha256(recipe.encode()).hexdigest()[:16]}"
    try:
        client.images.get(tag)
        return tag
    except docker.errors.ImageNotFound:
        pass
    log(f"building {tag} (the rig image without Docker)")
    data = recipe.encode()
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    context.seek(0)
    client.images.build(fileobj=context, custom_context=True, tag=tag, rm=True, pull=False)
    for old in client.images.list(name=BARE_IMAGE_REPO):
        if tag not in old.tags:
            client.images.remove(old.id, force=True)
    log(f"built {tag}")
    return tag
