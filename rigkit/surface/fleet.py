"""Each rig's surface plan for a deploy, from the whole inventory: who fronts its models (the gateway's
plan) and at which address that gateway's rig reaches it. Checked for every rig before any rig is
touched, like the gateway's plan."""

from __future__ import annotations

import ipaddress
import socket

from rigkit.config.inventory import RigConfigError, gateway_views
from rigkit.config.schema import RigConfig
from rigkit.surface.plan import SurfaceError, SurfacePlan, surface_plan


def fleet_surfaces(inventory, rigs: dict[str, RigConfig], gateway) -> dict[str, SurfacePlan | None]:
    """{host: its plan}; `gateway`: the fleet's GatewayPlan or None. A rig whose models the gateway routes
    to from another rig lets that rig in at its inventory address (ssh_hostname, resolved here to IPv4
    where it is a name); a gateway reaching the rig from another address needs it in serve_clients."""
    views = {view.host: view for view in gateway_views(inventory, rigs)}
    plans = {}
    for name, view in views.items():
        fronted = gateway is not None and gateway.host != name and bool(gateway.replicas_of(name))
        sources = (_ipv4(views[gateway.host].address, gateway.host),) if fronted else ()
        try:
            plans[name] = surface_plan(name, view.rig, sources)
        except SurfaceError as exc:
            raise RigConfigError(str(exc)) from None
    return plans


def _ipv4(address: str, host: str) -> str:
    try:
        return str(ipaddress.IPv4Address(address))
    except ValueError:
        pass
    try:
        return socket.getaddrinfo(address, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except (OSError, IndexError):
        raise RigConfigError(f"host {host}: its address {address!r} has no IPv4 address here, so the rigs it "
                             "fronts cannot let its gateway in; give ssh_hostname as an IPv4 address, or name "
                             "the gateway's address in those rigs' serve_clients") from None
