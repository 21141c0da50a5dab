"""The copy step of a deploy, the same for Linux and Windows rigs: run as a pyinfra
`python.call`, it opens the rig's Docker Engine through the deploy's own SSH connection
(the connector says how: `dial_command`) and copies one model's weights onto its volume."""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api.exceptions import OperationError

from rigkit.config.schema import ModelConfig
from rigkit.weights.engine import dial_command, rig_engine


def copy_on_rig(model: ModelConfig, verify: bool) -> None:
    from rigkit.weights.volumes import WeightsError, copy  # imports the docker SDK

    with rig_engine(host.connector.client.get_transport(), dial_command(host.connector)) as client:
        try:
            reports = copy(client, model, verify=verify)
        except WeightsError as exc:
            raise OperationError(str(exc)) from None
    for report in reports:
        logger.info(f"{host.print_prefix}{report.line()}")
