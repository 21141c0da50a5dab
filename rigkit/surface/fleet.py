"""Each rig's surface plan for a deploy, from the whole inventory: who fronts its models (the gateway's
plan) and at which address that gateway's rig reaches it. Checked for every rig before any rig is
touched, like the gateway's plan."""

from __future__ import annotations

import functools
import ipaddress
import socket

from rigkit.config.inventory import RigConfigError, gateway_views
from rigkit.config.schema import RigConfig
from rigkit.surface.plan import SurfaceError, SurfacePlan, surface_plan


def fleet_surfaces(inventory, rigs: dict[str, RigConfig], gateway) -> dict[str, SurfacePlan | None]:
    """{host: its plan}; `gateway`: the fleet's GatewayPlan or None. A rig whose models listen on every
    interface and which the gateway routes to from another rig lets that rig in at its inventory address
    (ssh_hostname, resolved here to IPv4 where it is a name, only for such rigs); a gateway reaching the
    rig from another address, or one whose name does not resolve here, goes in serve_clients."""
    views = {view.host: view for view in gateway_views(inventory, rigs)}
    plans = {}
    for name, view in views.items():
        rig = view.rig
        if rig.spec.os != "linux" or rig.spec.serve_address == "127.0.0.1" or not rig.models:
            plans[name] = None  # nothing listens beyond loopback: nothing to resolve or close
            continue
        runs_gateway = gateway is not None and gateway.host == name
        fronted = gateway is not None and not runs_gateway and bool(gateway.replicas_of(name))
        sources = ()
        if fronted:
            address = _ipv4(views[gateway.host].address)
            if address is None and not rig.spec.serve_clients:
                raise RigConfigError(
                    f"host {gateway.host}: its address {views[gateway.host].address!r} has no IPv4 address here, so "
                    f"rig {name} ({rig.file}) cannot let its gateway in; give host {gateway.host} an IPv4 "
                    f"ssh_hostname, or name the gateway's address in serve_clients of {rig.file}")
            sources = (address,) if address is not None else ()  # else serve_clients names the gateway
        try:
            plans[name] = surface_plan(name, rig, sources, runs_gateway=runs_gateway)
        except SurfaceError as exc:
            raise RigConfigError(str(exc)) from None
    return plans


@functools.cache
def _ipv4(address: str) -> str | None:
    """An inventory address as IPv4 (a name resolved here), or None where it has none. Once per deploy
    process: deploy.py plans the fleet's surface for each rig it runs on."""
    try:
        return str(ipaddress.IPv4Address(address))
    except ValueError:
        pass
    try:
        return socket.getaddrinfo(address, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except (OSError, IndexError, UnicodeError):
        return None
