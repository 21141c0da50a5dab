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
from rigkit.rigside.names import volume_name


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


def download_on_rig(models: list[ModelConfig], token: str | None) -> None:
    from rigkit.weights.hub import HubError, download  # imports the docker SDK

    with rig_engine(host.connector.client.get_transport(), dial_command(host.connector)) as client:
        for model in models:
            try:
                report = download(client, model, token)
            except HubError as exc:
                host.log_styled(f"weights: {exc}", fg="red", log_func=logger.error)
                raise CopyFailed(str(exc)) from None
            logger.info(f"{host.print_prefix}{model.name}: {model.spec.weights.hub} in the rig's cache: "
                        f"{report['files']} files, {report['bytes'] / 1e9:.2f} GB, {report['seconds']:.1f} s "
                        "(proven by the copy that follows)")


# The copier's check's words (templates/weights/copier/check.py) for a snapshot the download mends: no folder yet
# (the client makes it before its first blob), no file in it yet, a link to a blob not there.
HUB_MENDS = ("does not exist", "has no files", "the download is incomplete")


def hub_pending(state: dict) -> bool:
    """A hub model whose snapshot is not whole in the rig's cache yet: the copier's check says its folder is missing,
    empty, or has a link to a blob not there (a download cut, a blob removed as a refused copy says to): what
    the download, before the copy, mends."""
    return state.get("status") == "error" and any(words in str(state.get("error")) for words in HUB_MENDS)


def download_operations(models: list[ModelConfig], states: dict[str, dict], token: str | None) -> None:
    """Before the copies, one operation on every rig that keeps weights on volumes: the downloads of its models
    from the hub into its cache, where a volume is not its snapshot's complete copy (a converged rig asks the hub
    nothing). One operation everywhere, skipped where there is nothing to download: pyinfra orders operations
    across rigs by each rig's own sequence, so a rig's copy from another rig's volume must follow the same
    operation as that rig's download, or it may run before it (it did: the relay found no marker)."""
    wanted = [m for m in models if states[m.name].get("status") != "unchanged"]  # --verify-weights asks no hub
    python.call(
        name="Download weights from the hub",  # one name on every rig: which models, each download's line says
        function=rig_call(download_on_rig), models=wanted, token=token if wanted else None,
        _if=lambda needed=bool(wanted): needed,
    )


def copy_operations(models: list[ModelConfig], states: dict[str, dict], verify: bool) -> dict:
    """{model name: its copy operation}, from each volume's state (the Linux or the Windows fact):
    a source error stops the deploy before anything changes; a copy runs only where the volume is
    not the source's complete copy, or when `verify` asks every volume to be re-hashed."""
    ops = {}
    for model in models:
        state = states[model.name]
        if state["status"] == "error" and not (model.spec.weights.hub and hub_pending(state)):
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


def own_copies_first() -> None:
    """An operation on every rig with volumes, between its own copies and its copies from other rigs, that does
    nothing: pyinfra orders operations across rigs by each rig's own sequence (a topological sort, ties by line),
    so a rig's relay could otherwise run before another rig's second copy of its own (a rig with two models to
    copy where the receiver has one): this one waits for every rig's copies before any relay."""
    python.call(name="Every rig's own copies done", function=rig_call(_nothing), _if=lambda: False)


def _nothing() -> None:
    pass


def relay_operations(models: list[ModelConfig], states: dict[str, dict], verify: bool, chunk_bytes: int) -> dict:
    """{model name: its copy from another rig}; whether it runs is decided when it would run, after the
    source rig's own copy in the same deploy, against that rig's manifest."""
    return {model.name: python.call(
        name=f"Weights of {model.name} from rig {model.spec.weights.from_rig.rig}",
        function=rig_call(relay_on_rig), model=model, verify=verify, chunk_bytes=chunk_bytes,
        _if=lambda m=model, s=states[model.name]: relay_needed(m, s, verify),
    ) for model in models}


def source_model(other, model: ModelConfig) -> ModelConfig | None:
    """The source rig's model whose weights volume this model copies (rigkit.config.rig_sources checked it is there)."""
    from rigkit.config.inventory import rig_config
    from rigkit.weights.relay import source_volume

    kept = {volume_name(m): m for m in rig_config(other).models if m.spec.weights.storage == "volume"}
    return kept.get(source_volume(model))


def cache_needed(model: ModelConfig, plan: dict) -> bool:
    """At run time, after the weights' relay: does the source rig hold graphs its last start used that this rig's
    model may load and lacks? What it found goes into `plan` for the shipping. Why nothing is shipped is said; a
    rig that does not answer is a warning, never a failure (the model then compiles at its start)."""
    from rigkit.weights import compile_cache as cc

    plan.clear()
    rig = model.spec.weights.from_rig.rig
    try:
        other = source_host(rig)
        theirs_model = source_model(other, model)
        if theirs_model is None:
            return False
        code, out = cc.run_on(other.connector.client.get_transport(),
                              cc.identity_command(theirs_model.spec.image, theirs_model.name), cc.READ_TIMEOUT_S)
        if code != 0:
            raise RuntimeError(f"rig {rig} did not say what it runs (exit {code})")
        theirs = cc.parse_identity(out)
        paths = cc.shipped_paths(theirs["start"])
        if not paths:  # never started there, compiled nothing, or a table from before paths were kept
            return False
        transport = host.connector.client.get_transport()
        code, out = cc.run_on(transport, cc.identity_command(model.spec.image, None), cc.READ_TIMEOUT_S)
        if code != 0:
            raise RuntimeError(f"this rig did not say what it runs (exit {code})")
        ours = cc.parse_identity(out)
        why = cc.mismatch(list(theirs_model.spec.gpus), theirs, list(model.spec.gpus), ours, rig)
        if why is None and ours["image"]:  # with no image yet, it is pulled and compared before the shipping
            why = cc.image_mismatch(theirs, ours, rig)
        if why is not None:
            logger.info(f"{host.print_prefix}{model.name}: compiled graphs of rig {rig} not taken: {why}")
            return False
        has = cc.target_has(transport, model, paths)
        if has is None:
            raise RuntimeError("this rig did not say what its cache volume holds")
        if has:
            return False
    except Exception as exc:  # noqa: BLE001: a cache is never worth failing the deploy
        host.log_styled(f"{model.name}: compiled graphs of rig {rig} not taken: {exc}", fg="yellow",
                        log_func=logger.warning)
        return False
    plan.update(paths=paths, source_model=theirs_model, source_identity=theirs, pull=not ours["image"])
    return True


def ship_cache_on_rig(model: ModelConfig, plan: dict) -> None:
    from rigkit.weights import compile_cache as cc

    rig = model.spec.weights.from_rig.rig
    try:
        transport = host.connector.client.get_transport()
        if plan["pull"]:  # the serving step would pull it next: pulled now, to compare it with the source's
            code, out = cc.run_on(transport, cc.pull_command(model.spec.image), cc.PULL_TIMEOUT_S + 30)
            ours = cc.parse_identity(cc.run_on(transport, cc.identity_command(model.spec.image, None),
                                               cc.READ_TIMEOUT_S)[1])
            why = cc.image_mismatch(plan["source_identity"], ours, rig)
            if why is not None:
                pulled = "" if code == 0 else f"; pulling {model.spec.image} failed: {out.strip()[-200:] or code}"
                logger.info(f"{host.print_prefix}{model.name}: compiled graphs of rig {rig} not taken: {why}{pulled}")
                return
        other = source_host(rig)
        openssh = (openssh_command(ssh_target(other)), openssh_command(ssh_target(host)))
        if None in openssh:
            raise RuntimeError("OpenSSH cannot reach both rigs as the deploy does")
        report = cc.ship(model, plan["source_model"], plan["paths"], openssh, transport)
    except Exception as exc:  # noqa: BLE001: a cache is never worth failing the deploy
        host.log_styled(f"{model.name}: compiled graphs of rig {rig} not taken: {exc}; the model compiles them at "
                        "its start", fg="yellow", log_func=logger.warning)
        return
    keys = ", ".join(p.rpartition("/")[2][:12] for p in plan["paths"])
    logger.info(f"{host.print_prefix}{model.name}: compiled graphs {keys} taken from rig {rig}, "
                f"{size(report['kib'])} in {report['seconds']:.1f} s: its next start loads them")


def size(kib: int) -> str:
    return f"{kib} KiB" if kib < 1024 else f"{kib / 1024:.1f} MiB"


def cache_operations(models: list[ModelConfig]) -> None:
    """After the weights' relay, each model's compile cache from the same rig, where it fits (docs/serving.md,
    "Time to ready"); none for a model that compiles nothing (--enforce-eager)."""
    for model in models:
        if model.spec.vllm.enforce_eager:
            continue
        plan: dict = {}
        python.call(
            name=f"Compiled graphs of {model.name} from rig {model.spec.weights.from_rig.rig}",
            function=rig_call(ship_cache_on_rig), model=model, plan=plan,
            _if=lambda m=model, p=plan: cache_needed(m, p),
        )
