"""The copy step of a deploy, the same for Linux and Windows rigs: run as a pyinfra
`python.call`, it opens the rig's Docker Engine through the deploy's own SSH connection
(the connector says how: `dial_command`) and copies one model's weights onto its volume."""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api.exceptions import ConnectError, DeployError, NestedOperationError
from pyinfra.operations import python

from rigkit.config.inventory import ssh_target
from rigkit.config.schema import ModelConfig
from rigkit.weights.engine import dial_command, rig_engine
from rigkit.plumbing.ssh import openssh_command, rig_call


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


def source_host(name: str):
    """The inventory host a model's weights come from, connected (a rollout limited to this rig
    leaves it unconnected)."""
    other = host.state.inventory.get_host(name)
    if not other.connected:
        other.connect(reason="weights source", show_errors=False, raise_exceptions=True)
    return other


def relay_on_rig(model: ModelConfig, verify: bool, chunk_bytes: int) -> None:
    from rigkit.weights.relay import RelayError, relay, verify_volume

    source = model.spec.weights.from_rig
    try:
        target = host.connector.client.get_transport()
        if verify:
            logger.info(f"{host.print_prefix}{verify_volume(target, model)}")
        other = source_host(source.rig)
        # Both reachable: rigkit.config.rig_sources refused a source where either is not, before any rig.
        openssh = (openssh_command(ssh_target(other)), openssh_command(ssh_target(host)))
        report = relay(other.connector.client.get_transport(), model, source.rig, chunk_bytes, openssh)
    except (RelayError, ConnectError) as exc:
        host.log_styled(f"weights: {exc}", fg="red", log_func=logger.error)
        raise CopyFailed(str(exc)) from None
    rate = report["received_bytes"] / 1e6 / report["seconds"] if report["seconds"] > 0 else 0
    logger.info(f"{host.print_prefix}{model.name}: copied {report['received_bytes'] / 1e9:.2f} of "
                f"{report['bytes'] / 1e9:.2f} GB from rig {source.rig} in {report['seconds']:.1f} s ({rate:.0f} MB/s), "
                f"{report['files']} files; resumed at {report['rehashed_bytes']} bytes (re-hashed here), "
                f"{report['resent_bytes']} bytes sent again; {where(report.get('sent_from'))} to "
                f"{where(report.get('volume_path'))}")


def where(path: str | None) -> str:
    """Where a side of the relay ran: on the volume's folder from the rig's shell, or in a helper container."""
    return "a helper container" if path in (None, "", "/v") else path


def relay_needed(model: ModelConfig, state: dict, verify: bool) -> bool:
    """At run time (after the source rig's own copy): is this volume other than the source rig's?
    Any trouble reading the source says yes: the copy then reports it in one line."""
    from rigkit.weights.relay import manifest_digest, read_manifest

    if verify or state.get("status") != "unchanged" or not state.get("digest"):
        return True
    source = model.spec.weights.from_rig
    try:
        files = read_manifest(source_host(source.rig).connector.client.get_transport(), model, source.rig)["files"]
    except Exception:  # noqa: BLE001: the copy that follows reports it
        return True
    return manifest_digest(files) != state["digest"]


def relay_operations(models: list[ModelConfig], states: dict[str, dict], verify: bool, chunk_bytes: int) -> dict:
    """{model name: its copy from another rig}; whether it runs is decided when it would run, after the
    source rig's own copy in the same deploy, against that rig's manifest."""
    return {model.name: python.call(
        name=f"Weights of {model.name} from rig {model.spec.weights.from_rig.rig}",
        function=rig_call(relay_on_rig), model=model, verify=verify, chunk_bytes=chunk_bytes,
        _if=lambda m=model, s=states[model.name]: relay_needed(m, s, verify),
    ) for model in models}
