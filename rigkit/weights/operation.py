"""The copy step of a deploy, the same for Linux and Windows rigs: run as a pyinfra
`python.call`, it opens the rig's Docker Engine through the deploy's own SSH connection
(the connector says how: `dial_command`) and copies one model's weights onto its volume."""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api.exceptions import DeployError, NestedOperationError
from pyinfra.operations import python

from rigkit.config.schema import ModelConfig
from rigkit.weights.engine import dial_command, rig_engine
from rigkit.ssh import rig_call


class CopyFailed(NestedOperationError):
    """The copy failed and said why, in one red line. pyinfra prints a Python traceback for any other
    exception out of a `python.call` (pyinfra/api/operations.py, "Unexpected error in Python callback");
    this one it reports as a failed operation without one."""


def copy_on_rig(model: ModelConfig, verify: bool) -> None:
    from rigkit.weights.volumes import WeightsError, copy  # imports the docker SDK

    with rig_engine(host.connector.client.get_transport(), dial_command(host.connector)) as client:
        try:
            reports = copy(client, model, verify=verify)
        except WeightsError as exc:
            host.log_styled(f"weights: {exc}", fg="red", log_func=logger.error)
            raise CopyFailed(str(exc)) from None
    for report in reports:
        logger.info(f"{host.print_prefix}{report.line()}")


def copy_operations(models: list[ModelConfig], states: dict[str, dict], verify: bool) -> dict:
    """{model name: its copy operation}, from each volume's state (the Linux or the Windows fact):
    a source error stops the deploy before anything changes; a copy runs only where the volume is
    not the source's complete copy, or when `verify` asks every volume to be re-hashed."""
    ops = {}
    for model in models:
        state = states[model.name]
        if state["status"] == "error":
            raise DeployError(f"{model.name} ({model.file}): weights.source {model.spec.weights.source}: "
                              f"{state['error']}")
        ops[model.name] = python.call(
            name=f"Weights of {model.name} onto volume",
            function=rig_call(copy_on_rig), model=model, verify=verify,
            _if=lambda needed=verify or state["status"] != "unchanged": needed,
        )
    return ops
