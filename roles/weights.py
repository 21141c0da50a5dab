"""Role weights: copy each model's weights onto its Docker volume, verified and resumable.

For models with `weights.storage: volume` (the default). Talks to the rig's Docker
Engine with the docker SDK through the deploy's SSH connection (`docker system
dial-stdio`, as the docker CLI does over ssh://). The check before copying reads
only metadata, so an unchanged model costs one short helper run and no change.
`verify` (`rigkit deploy --verify-weights`) re-hashes every volume against its
manifest first; files that differ are copied again.
"""

from __future__ import annotations

import docker
from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.api.exceptions import OperationError
from pyinfra.operations import python

from rigkit.config.schema import ModelConfig, RigConfig
from rigkit.sshforward import forward_docker
from rigkit.weights.volumes import WeightsError, copy, needs_copy


@deploy("Weights")
def weights(rig: RigConfig, verify: bool = False) -> dict:
    """Returns {model name: the copy operation}, so serving can restart a model whose weights changed.
    `verify`: re-hash every volume against its manifest first (`rigkit deploy --verify-weights`)."""
    on_volumes = [m for m in rig.models if m.spec.weights.storage == "volume"]
    # Weights left on a bind mount are warned about by the serving checks (rig.warnings).
    if not on_volumes:
        return {}
    with _docker() as client:
        pending = {m.name for m in on_volumes if verify or needs_copy(client, m)}
    ops = {}
    for model in on_volumes:
        ops[model.name] = python.call(
            name=f"Weights of {model.name} onto volume",
            function=_copy, model=model, verify=verify,
            _if=lambda name=model.name: name in pending,
        )
    return ops


class _docker:
    """The rig's Docker Engine through the deploy's SSH connection."""

    def __enter__(self) -> docker.DockerClient:
        self._forward = forward_docker(host.connector.client.get_transport())
        port = self._forward.__enter__()
        self._client = docker.DockerClient(base_url=f"tcp://127.0.0.1:{port}", timeout=60)
        return self._client

    def __exit__(self, *exc) -> None:
        self._client.close()
        self._forward.__exit__(*exc)


def _copy(model: ModelConfig, verify: bool) -> None:
    with _docker() as client:
        try:
            reports = copy(client, model, verify=verify)
        except WeightsError as exc:
            raise OperationError(str(exc)) from None
    for report in reports:
        logger.info(f"{host.print_prefix}{report.line()}")
