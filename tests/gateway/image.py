"""The LiteLLM proxy as a local image for the simulated rig. TEST INFRASTRUCTURE.

No registry but PyPI is reachable here, so the official image cannot be pulled: this builds
FROM the simulated rig's image (Debian bookworm, python3.11) with the real `litellm[proxy]`
release rigkit pins (LITELLM_VERSION), copied from the test venv (tests/gateway/venv.py).
Its entrypoint is LiteLLM's own CLI, as the official image's is, so the rendered compose file's
command reaches it unchanged. Tagged with a hash of the recipe, the base image and the version.
"""

from __future__ import annotations

import hashlib

import docker

from rigkit.gateway import LITELLM_VERSION
from tests.gateway.venv import EXTRA, VENV, litellm_python
from tests.simrig.image import ensure_image

REPO = "rigkit-litellm"
DOCKERFILE = """\
FROM {base}
COPY lib/python3.11/site-packages /opt/litellm
ENV PYTHONPATH=/opt/litellm PYTHONUNBUFFERED=1
ENTRYPOINT ["python3", "-m", "litellm.proxy.proxy_cli"]
CMD []
"""
IGNORE = "bin\ninclude\nlib64\nshare\n**/__pycache__\n"


def ensure_litellm_image(client: docker.DockerClient | None = None, log=print) -> str:
    client = client or docker.from_env()
    base = ensure_image(client, log=log)
    litellm_python()
    recipe = DOCKERFILE.format(base=base)
    stamp = ",".join([LITELLM_VERSION, *EXTRA])
    tag = f"{REPO}:{hashlib.sha256((recipe + IGNORE + stamp).encode()).hexdigest()[:16]}"
    try:
        client.images.get(tag)
        return tag
    except docker.errors.ImageNotFound:
        pass
    log(f"building {tag} (litellm[proxy]=={LITELLM_VERSION})")
    (VENV / "Dockerfile.rigkit").write_text(recipe)
    (VENV / ".dockerignore").write_text(IGNORE)
    client.images.build(path=str(VENV), dockerfile="Dockerfile.rigkit", tag=tag, rm=True, pull=False)
    return tag
