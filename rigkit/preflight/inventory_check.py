"""What every inventory command (`rigkit deploy`, `verify`, `status`, `rollout`) checks offline, before
pyinfra connects to any rig: the inventory loads, `--limit` selects a rig, each selected rig's files are
valid (and, for a deploy or a verification, every rig's, which the gateway's config reads), and each
`--accept-slower` model is served by a rig the command reaches; for the whole fleet, the gateway's plan
and who may reach each rig's models (rigkit/surface). Bad input is one line per problem on
stderr and exit 2, no rig reached (docs/configuration.md, "Bad input")."""

from __future__ import annotations

import sys

from rigkit.config.errors import CONFIG_ERROR, shown
from rigkit.config.inventory import RigConfigError, load_inventory, select_hosts, ssh_target, validate_host
from rigkit.gateway.plan import gateway_plan
from rigkit.surface.fleet import fleet_surfaces


def reached_rigs(command: str, inventory: str, limit: str | None, whole_fleet: bool,
                 accept_slower: list[str] | None = None) -> list[str] | int:
    """The names of the rigs `rigkit COMMAND` reaches once all of the above holds, or CONFIG_ERROR after
    one line per problem on stderr."""
    try:
        loaded = load_inventory(inventory)
        selected = select_hosts(loaded, inventory, limit)
        rigs = {host.name: validate_host(host) for host in selected}
        for host in selected:
            ssh_target(host)  # the port and key file pyinfra would use
        if whole_fleet:
            fleet_surfaces(list(loaded), rigs, gateway_plan(list(loaded), rigs))
    except RigConfigError as exc:
        print(f"rigkit {command}: {exc}", file=sys.stderr)
        return CONFIG_ERROR
    served = sorted({m.name for rig in rigs.values() for m in rig.models})
    unknown = [name for name in accept_slower or () if name not in served]
    for name in unknown:
        print(f"rigkit {command}: --accept-slower {shown(name)}: no rig this {command} reaches serves a model of "
              f"that name; models served: {', '.join(served) or 'none'}", file=sys.stderr)
    if unknown:
        return CONFIG_ERROR
    return [host.name for host in selected]
