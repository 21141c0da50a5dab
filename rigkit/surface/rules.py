"""The rig's firewall for its models' ports, as nftables reads it (templates/surface/surface.nft.j2).

One table of rigkit's own (SURFACE_TABLE), replaced whole by `nft -f`: Docker's tables and the user's
are never touched. Its input chain, for the models' ports only: the rig itself (whatever arrives on
`lo`: 127.0.0.1, ::1, 127.0.1.1 and its own LAN addresses alike; nothing from outside arrives there),
then the plan's hosts, are accepted; every other host gets a TCP reset, as from a closed port. Models
use host networking on a Linux rig, so their traffic passes the input hook.
"""

from __future__ import annotations

from rigkit.config.schema import RigConfig
from rigkit.plumbing.render import render
from rigkit.rigside.names import SURFACE_TABLE
from rigkit.surface.plan import SurfacePlan


def ruleset(rig: RigConfig, plan: SurfacePlan) -> str:
    return render("surface/surface.nft.j2", rig_file=rig.file, table=SURFACE_TABLE, ports=plan.ports,
                  allowed=plan.allowed)
