"""Docker volumes holding a tiny stand-in checkpoint. TEST INFRASTRUCTURE.

The vLLM stand-in only needs its model path to be a directory; a config.json
makes it look like a checkpoint to a person listing it.
"""

from __future__ import annotations

import docker

from tests.simrig.image import ensure_image


def ensure_weights_volume(name: str, client: docker.DockerClient | None = None) -> None:
    client = client or docker.from_env()
    try:
        client.volumes.get(name)
        return
    except docker.errors.NotFound:
        pass
    client.volumes.create(name, labels={"rigkit.test": "1"})
    client.containers.run(
        ensure_image(client), ["/bin/sh", "-c", 'echo \'{"model_type": "standin"}\' > /w/config.json'],
        volumes={name: {"bind": "/w", "mode": "rw"}}, remove=True, entrypoint=[],
    )
