"""The serving role's operations for on-demand models (docs/on-demand.md): rigkit-ondemand's files and unit,
and the order that keeps two models that cannot be loaded together from ever being so during a deploy.

The order, in roles/serving.py: rigkit-ondemand's settings are put first; where they change, the program is
stopped before any model rolls out (a model leaving on-demand takes its port back). The on-demand models' files
are put; where any of them will roll out, the program is stopped and every on-demand model parked (its container
stopped); each then rolls out alone (rigkit-stack proves it on its engine port) and is parked again. Last the
program is (re)started, and takes every model as parked.
"""

from __future__ import annotations

import shlex

from pyinfra.operations import server, systemd

from rigkit.config.schema import RigConfig
from rigkit.ondemand.plan import front_config, on_demand, service_unit
from rigkit.plumbing import systemd_units as units
from rigkit.plumbing.files import FileStates, put
from rigkit.plumbing.render import template_text
from rigkit.plumbing.systemd_units import UnitStates
from rigkit.rigside.names import (
    ONDEMAND_CONFIG_PATH,
    ONDEMAND_PATH,
    ONDEMAND_SERVICE,
    UNIT_DIR,
    project_name,
)

UNIT_PATH = f"{UNIT_DIR}/{ONDEMAND_SERVICE}"
FILES = (ONDEMAND_PATH, ONDEMAND_CONFIG_PATH, UNIT_PATH)  # read in one command


def reads() -> list:
    return [(FileStates, {"paths": FILES}), (UnitStates, {"units": (ONDEMAND_SERVICE,)})]


def installed() -> bool:
    from rigkit.plumbing.facts_once import read_once

    return UNIT_PATH in read_once(FileStates, paths=FILES)


def settings_first(rig: RigConfig, with_key: bool):
    """rigkit-ondemand's settings, put before any model rolls out; the program stopped where they change.
    Returns the settings' operation, or None on a rig with no on-demand model and no program."""
    if not on_demand(rig):
        if installed():
            server.shell(name="Stop and remove rigkit-ondemand (no model is served on demand)", commands=[
                f"systemctl disable --now {ONDEMAND_SERVICE}",
                f"rm -f {' '.join(shlex.quote(p) for p in FILES)}", "systemctl daemon-reload"])
        return None
    config = put(name="rigkit-ondemand settings", data=front_config(rig, with_key), dest=ONDEMAND_CONFIG_PATH,
                 mode="644", batch=FILES)
    server.shell(name="Stop rigkit-ondemand: its models change", commands=[f"systemctl stop {ONDEMAND_SERVICE}"],
                 _if=lambda: config.did_change() and installed())
    return config


def park_all(rig: RigConfig, will_roll_out):
    """Stop rigkit-ondemand and park every on-demand model where `will_roll_out()` says one rolls out."""
    return server.shell(
        name="Park every on-demand model and stop rigkit-ondemand while they roll out",
        commands=[f"systemctl stop {ONDEMAND_SERVICE} 2>/dev/null || true",
                  *(f"docker compose --project-name {shlex.quote(project_name(m))} stop" for m in on_demand(rig))],
        _if=will_roll_out)


def park(model, after: list):
    """Park `model` once it rolled out (rigkit-ondemand loads it when a request comes)."""
    return server.shell(name=f"Park {model.name} (on demand) after its rollout",
                        commands=[f"docker compose --project-name {shlex.quote(project_name(model))} stop"],
                        _if=lambda: any(op.did_change() for op in after))


def program(rig: RigConfig, config, changed: list) -> None:
    """rigkit-ondemand's script and unit, and the program running: restarted where anything it reads changed."""
    if config is None:
        return
    script = put(name="Install rigkit-ondemand", data=template_text("ondemand/rigkit-ondemand"), dest=ONDEMAND_PATH,
                 mode="755", batch=FILES)
    unit = put(name="rigkit-ondemand service unit", data=service_unit(rig), dest=UNIT_PATH, mode="644", batch=FILES)
    systemd.daemon_reload(name="Reload systemd units (rigkit-ondemand)", _if=unit.did_change)
    files_changed = (config, script, unit)
    systemd.service(name="Restart rigkit-ondemand", service=ONDEMAND_SERVICE, running=True, enabled=True,
                    restarted=True, _if=lambda: any(op.did_change() for op in (*files_changed, *changed)))
    units.service(name="rigkit-ondemand running", unit=ONDEMAND_SERVICE, batch=(ONDEMAND_SERVICE,), running=True,
                  enabled=True, after=files_changed)
