"""What a Prometheus scrapes, pure: the rig's own exporter and models, or, on the gateway's rig, the
whole fleet's (every rig of the inventory: its exporter where its rig file turns monitoring on, and
every model's vLLM /metrics).

The fleet's Prometheus reaches each rig where the gateway reaches its models
(rigkit.gateway.plan.backend_host): its own rig on 127.0.0.1, another rig at its inventory
address when it serves on every interface, or at its `gateway_address`. A rig that serves on every
interface does so with an API key (rigkit.config.loader); its exporter then listens there too and
wants that key, which Prometheus sends from a file only it can read (one per rig, under
PROMETHEUS_KEYS_DIR). vLLM checks the key on /v1 paths only: its /metrics answers without one, and
gets the key all the same.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rigkit.config.inventory import RigConfigError, RigView, gateway_views
from rigkit.config.schema import RigConfig
from rigkit.gateway.plan import GatewayConfigError, backend_host
from rigkit.rigside.names import PROMETHEUS_KEYS_DIR

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class ScrapedRig:
    label: str  # the `rig` label of its series: the rig's name, or in a fleet its inventory host name
    address: str  # where Prometheus reaches it
    exporter_port: int | None  # None: the rig runs no exporter
    models: tuple[tuple[str, int], ...]  # (model, port) of each model it serves
    key_file: str | None  # the file Prometheus reads the rig's API key from, or None for a rig without one
    gpu_budget_w: float  # what its GPUs may draw together within its PSU budget


def gpu_budget_w(rig: RigConfig) -> float:
    """What the GPUs may draw together within the PSU budget (rigkit.gpu.policy's arithmetic)."""
    spec = rig.spec
    return spec.psu_w * (1 - spec.psu_headroom_share) - spec.system_w


def exporter_on_lan(rig: RigConfig) -> bool:
    """The exporter listens on every interface, wanting the models' key, when the models do (a rig
    serving on every interface has a key: rigkit.config.loader refuses one without)."""
    return rig.spec.serve_address == "0.0.0.0" and bool(rig.spec.api_key_file)


def key_file_path(label: str) -> str:
    return f"{PROMETHEUS_KEYS_DIR}/{re.sub(r'[^A-Za-z0-9_.-]', '_', label)}.key"


def _scraped(label: str, address: str, rig: RigConfig) -> ScrapedRig:
    keyed = bool(rig.spec.api_key_file) and rig.spec.os == "linux"  # Windows rigs' models want no key
    monitoring = rig.spec.monitoring
    return ScrapedRig(label=label, address=address,
                      exporter_port=monitoring.exporter_port if monitoring.enabled else None,
                      models=tuple((m.name, m.spec.port) for m in rig.models),
                      key_file=key_file_path(label) if keyed else None, gpu_budget_w=gpu_budget_w(rig))


def own_rig(rig: RigConfig) -> list[ScrapedRig]:
    """A rig's Prometheus, outside a fleet: its own exporter and models, on 127.0.0.1."""
    return [_scraped(rig.name, LOOPBACK, rig)]


def fleet(views: list[RigView], gateway_host: str) -> list[ScrapedRig]:
    """The gateway rig's Prometheus: every rig of the inventory with something to scrape, labelled
    by inventory host name. A rig it cannot reach is refused in one line, before any rig is touched."""
    runner = next(v for v in views if v.host == gateway_host)
    scraped, files = [], {}
    for view in views:
        if not view.rig.models and not view.rig.spec.monitoring.enabled:
            continue
        if view.rig.models or view.host == runner.host or view.gateway_address or exporter_on_lan(view.rig):
            try:
                address = backend_host(view, runner)
            except GatewayConfigError as exc:
                raise RigConfigError(f"the fleet's Prometheus on {runner.host}: {exc}") from None
        else:
            raise RigConfigError(
                f"{view.rig.file}: monitoring: the fleet's Prometheus on {runner.host} cannot reach the exporter of "
                f"rig {view.host}, which listens on its 127.0.0.1: set serve_address: 0.0.0.0 (with api_key_file) in "
                f"{view.rig.file}, or give host {view.host} a gateway_address in the inventory")
        rig = _scraped(view.host, address, view.rig)
        if rig.key_file and (other := files.get(rig.key_file)):
            raise RigConfigError(f"hosts {other} and {view.host} would share the key file {rig.key_file} of the "
                                 "fleet's Prometheus; rename one of them")
        files[rig.key_file] = view.host
        scraped.append(rig)
    return scraped


def fleet_of(inventory, rigs: dict[str, RigConfig], plan) -> list[ScrapedRig] | None:
    """What the gateway rig's Prometheus scrapes, or None where there is none: no gateway, or the
    gateway's rig file does not turn monitoring (with Prometheus) on. `plan`: the inventory's
    GatewayPlan (rigkit.gateway.plan.gateway_plan)."""
    if plan is None:
        return None
    views = gateway_views(inventory, rigs)
    monitoring = next(v for v in views if v.host == plan.host).rig.spec.monitoring
    if not (monitoring.enabled and monitoring.prometheus):
        return None
    return fleet(views, plan.host)
