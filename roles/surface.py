"""Role surface (Linux): the models' ports closed to every host but the rig, its gateway's rig and
`serve_clients`, by the rig's own kernel (nftables), at boot and now (docs/security.md).

Only where the models listen on every interface (`serve_address: 0.0.0.0`); the plan is the fleet's
(rigkit/surface/fleet.py, checked before any rig is touched). Installs nftables where it is missing,
the ruleset (/etc/rigkit/surface.nft: rigkit's one table, replaced whole) and a oneshot unit that
loads it before Docker starts the models; applies it now when it changed or is not loaded. A rig back
on loopback, or without models, has the table, the unit and the file removed.
"""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.operations import apt, files, server, systemd

from rigkit.config.schema import RigConfig
from rigkit.plumbing import systemd_units as units
from rigkit.plumbing.facts_once import Read, read_once
from rigkit.plumbing.files import FileStates, put
from rigkit.plumbing.render import render
from rigkit.plumbing.systemd_units import UnitStates
from rigkit.rigside.names import SURFACE_RULES_PATH, SURFACE_TABLE, SURFACE_UNIT, SURFACE_UNIT_PATH
from rigkit.surface.facts import SurfaceState
from rigkit.surface.plan import SurfacePlan, open_paths_warning
from rigkit.surface.rules import ruleset

FILES = (SURFACE_RULES_PATH, SURFACE_UNIT_PATH)  # read in one command
UNITS = (SURFACE_UNIT,)
APT_TIMEOUT_S = 600


def surface_reads(rig: RigConfig) -> list[Read]:
    """What the role asks the rig while planning (deploy.py reads them ahead, all at once). A rig serving on
    loopback is asked only whether the firewall's files are there (merged with the other roles' files)."""
    if rig.spec.serve_address == "127.0.0.1":
        return [(FileStates, {"paths": FILES})]
    return [(SurfaceState, {}), (FileStates, {"paths": FILES}), (UnitStates, {"units": UNITS})]


@deploy("Network surface")
def surface(rig: RigConfig, plan: SurfacePlan | None) -> list:
    """Returns the operations that changed the firewall."""
    if plan is None or not plan.ports:
        return _remove(rig)
    state = read_once(SurfaceState)
    if warning := open_paths_warning(host.name, plan):
        logger.warning(f"{host.print_prefix}{warning}")
    if not state["nft"]:
        apt.packages(name="Install nftables (the firewall's command)", packages=["nftables"], update=True,
                     _timeout=APT_TIMEOUT_S)
    rules = put(name="Write the models' firewall", data=ruleset(rig, plan), dest=SURFACE_RULES_PATH, mode="644",
                batch=FILES)
    unit = put(name="Install the firewall's boot unit",
               data=render("surface/rigkit-surface.service.j2", rules_path=SURFACE_RULES_PATH, table=SURFACE_TABLE),
               dest=SURFACE_UNIT_PATH, mode="644", batch=FILES)
    systemd.daemon_reload(name="Reload systemd units", _if=unit.did_change)
    # A unit that was not running is started here, which loads the file as it is now; one that was
    # running (enabled or not) is restarted below when the file, the unit or the kernel's table differ.
    was_running = bool((read_once(UnitStates, units=UNITS).get(SURFACE_UNIT) or {}).get("running"))
    started = units.service(name="Load the firewall at boot", unit=SURFACE_UNIT, batch=UNITS, enabled=True,
                            after=(unit,))
    applied = server.shell(
        name="Load the firewall now", commands=[f"systemctl restart {SURFACE_UNIT}"],
        _if=lambda: was_running and (rules.did_change() or unit.did_change() or not state["table"]))
    return [op for op in (rules, started, applied) if op is not None]


def _remove(rig: RigConfig) -> list:
    """The firewall's files are what says it was installed (a loopback rig reads only them, for speed)."""
    present = read_once(FileStates, paths=FILES)
    if not any(present.get(path) for path in FILES):
        host.noop("the models' firewall is not installed (nothing to close: "
                  f"{'they listen on loopback only' if rig.spec.serve_address == '127.0.0.1' else 'no models'})")
        return []
    systemd.service(name="Stop and disable the firewall's unit", service=SURFACE_UNIT, running=False, enabled=False)
    removed = server.shell(name="Remove the models' firewall from the kernel",
                           commands=[f"nft delete table inet {SURFACE_TABLE} 2>/dev/null || true"])
    for path in FILES:
        files.file(name=f"Remove {path}", path=path, present=False)
    systemd.daemon_reload(name="Reload systemd units")
    return [removed]
