"""Which replicas the gateway routes to and at which address it reaches each rig. Pure functions.

A rig's models listen on its `serve_address`: 127.0.0.1 (default) or every interface. The gateway
reaches the models of its own rig on 127.0.0.1; another rig's only where they listen on every
interface (at its inventory address, or `gateway_address` when the gateway sees it elsewhere).
An inventory may also set `gateway_address` for a loopback rig that shares the gateway's network
namespace (the simulated rigs do); rigkit cannot check that, so it is the inventory's word.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rigkit.config.inventory import RigConfigError, RigView, gateway_views  # noqa: F401 (RigView re-exported)
from rigkit.config.schema import GatewaySpec, ModelConfig
from rigkit.rigside.names import served_name

_ADDRESS = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")


class GatewayConfigError(Exception):
    """The inventory's gateway cannot be built as written; nothing was touched."""


@dataclass(frozen=True)
class Replica:
    rig: str  # inventory host name
    model: ModelConfig
    api_base: str  # http://host:port/v1
    key_env: str | None  # the name of this rig's API key in the gateway (rigkit.gateway.stack.backend_keys), or None

    @property
    def model_name(self) -> str:
        """What clients ask for: the served name, the same for every replica of a model."""
        return served_name(self.model)

    @property
    def deployment_id(self) -> str:
        """Stable id of this replica in LiteLLM (model_info.id): the drain removes it by this id."""
        return f"{self.rig}.{self.model.name}"


@dataclass(frozen=True)
class GatewayPlan:
    host: str  # the inventory host that runs it
    spec: GatewaySpec
    replicas: tuple[Replica, ...]
    keyed_rigs: tuple[tuple[str, str], ...]  # (host, key name) of every rig whose models need a key
    address: str = "127.0.0.1"  # the gateway rig's inventory address, where its clients reach it

    def replicas_of(self, host: str) -> list[Replica]:
        return [r for r in self.replicas if r.rig == host]


def key_env_name(host: str) -> str:
    """A name for the host's key: anything but A-Z, 0-9 and _ becomes _, so that two hosts' keys are told
    apart by a name safe anywhere (two hosts that give one name are refused)."""
    return "RIGKIT_KEY_" + re.sub(r"[^A-Z0-9_]", "_", host.upper())


def plan(views: list[RigView]) -> GatewayPlan | None:
    """The gateway of an inventory, or None when no host has a `gateway` entry."""
    runners = [v for v in views if v.gateway is not None]
    if not runners:
        return None
    if len(runners) > 1:
        raise GatewayConfigError(f"`gateway` is set on {', '.join(v.host for v in runners)}; "
                                 "one host runs the gateway: remove it from the others")
    runner = runners[0]
    if runner.rig.spec.os != "linux":
        raise GatewayConfigError(f"host {runner.host}: the gateway runs on Linux rigs only ({runner.rig.file} "
                                 f"has os: {runner.rig.spec.os})")
    envs: dict[str, str] = {}
    replicas, keyed = [], []
    for view in views:
        if not view.rig.models:
            continue
        env = key_env_name(view.host)
        if env in envs:
            raise GatewayConfigError(f"hosts {envs[env]} and {view.host} give the same key variable {env}; "
                                     "rename one of them")
        envs[env] = view.host
        host = backend_host(view, runner)
        has_key = bool(view.rig.spec.api_key_file) and view.rig.spec.os == "linux"
        if has_key:
            keyed.append((view.host, env))
        for model in view.rig.models:
            if model.on_demand:
                _check_on_demand(runner.gateway, view, model)
            replicas.append(Replica(view.host, model, f"http://{host}:{model.spec.port}/v1", env if has_key else None))
    if not replicas:
        raise GatewayConfigError(f"host {runner.host} runs the gateway, but no rig of the inventory serves a model "
                                 f"(every rig file's `models` is empty): the gateway would route nothing; list "
                                 "models in a rig file, or remove `gateway` from the inventory")
    _check_distinct(replicas)
    _check_fallbacks(replicas)
    return GatewayPlan(runner.host, runner.gateway, tuple(replicas), tuple(keyed), runner.address)


def gateway_plan(inventory, rigs=None) -> GatewayPlan | None:
    """The inventory's gateway, or None when no host runs one (hosts read by rigkit.config.inventory);
    a gateway that cannot be built is a RigConfigError, like any other bad inventory entry."""
    try:
        return plan(gateway_views(inventory, rigs))
    except GatewayConfigError as exc:
        raise RigConfigError(str(exc)) from None


def backend_host(view: RigView, runner: RigView) -> str:
    """Where the gateway (and the fleet's Prometheus, rigkit.monitoring.fleet) reaches a rig."""
    if view.gateway_address is not None:
        if not _ADDRESS.fullmatch(view.gateway_address):
            raise GatewayConfigError(f"host {view.host}: gateway_address {view.gateway_address!r} is not a host "
                                     "name or IP address (letters, digits, '.', '-')")
        return view.gateway_address
    if view.host == runner.host:
        return "127.0.0.1"
    if view.rig.spec.serve_address == "0.0.0.0":
        if not _ADDRESS.fullmatch(view.address):
            raise GatewayConfigError(f"host {view.host}: its address {view.address!r} cannot be used in a URL; "
                                     "set gateway_address in its inventory data")
        return view.address
    raise GatewayConfigError(
        f"{view.rig.file}: serve_address: '127.0.0.1': the models of rig {view.host} listen on its loopback only, "
        f"so the gateway on {runner.host} cannot reach them. Set serve_address: 0.0.0.0 (with api_key_file) "
        f"in {view.rig.file}, or give host {view.host} a gateway_address in the inventory"
    )


def _check_on_demand(spec: GatewaySpec, view: RigView, model) -> None:
    """A model served on demand (docs/on-demand.md) behind the gateway: LiteLLM's background health checks would
    load it every interval, so it would never be parked; a request held while it loads must not be cut by the
    gateway's own timeout first."""
    if spec.health_check_interval_s:
        raise GatewayConfigError(
            f"host {view.host}: {model.name} is served on demand ({view.rig.file}: on_demand), and the gateway's "
            f"background health checks (health_check_interval_s: {spec.health_check_interval_s}) would load it every "
            f"{spec.health_check_interval_s} s, so it would never be parked: set health_check_interval_s: 0 in the "
            "gateway's inventory data")
    hold_s = view.rig.spec.on_demand.hold_s
    if spec.request_timeout_s <= hold_s:
        raise GatewayConfigError(
            f"host {view.host}: {model.name} is served on demand, and its rig holds a request up to {hold_s} s "
            f"(on_demand.hold_s) while the model loads, but the gateway gives up on a request after "
            f"request_timeout_s: {spec.request_timeout_s}: raise request_timeout_s above {hold_s}, or lower hold_s")


def _check_distinct(replicas: list[Replica]) -> None:
    """Two deployments at one address would be one server counted twice (and drained with the wrong rig)."""
    seen: dict[str, Replica] = {}
    for replica in replicas:
        if other := seen.get(replica.api_base):
            raise GatewayConfigError(
                f"{replica.model.file}: port: {replica.model.spec.port}: the gateway would reach {replica.model.name} "
                f"on {replica.rig} and {other.model.name} on {other.rig} at the same address {replica.api_base}; "
                "give replicas that share a network distinct ports")
        seen[replica.api_base] = replica


def _check_fallbacks(replicas: list[Replica]) -> None:
    names = {r.model_name for r in replicas}
    for replica in replicas:
        for position, name in enumerate(replica.model.spec.gateway_fallbacks):
            if name not in names:
                raise GatewayConfigError(
                    f"{replica.model.file}: gateway_fallbacks[{position}]: {name!r}: no rig of this inventory serves "
                    f"a model of that name; served here: {', '.join(sorted(names))}")
            if name == replica.model_name:
                raise GatewayConfigError(f"{replica.model.file}: gateway_fallbacks[{position}]: {name!r} is this "
                                         "model itself; its replicas already back each other up")
