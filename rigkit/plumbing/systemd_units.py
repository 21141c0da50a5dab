"""systemd units on a Linux rig, with the converged case decided from one read.

pyinfra's `systemd.service` reads two facts (`SystemdStatus`, `SystemdEnabled`) when it runs,
each a command and a round trip, for every unit it manages, also when nothing is to change.
`service` reads the state of all of a role's units in one `systemctl show` while the deploy
is planned (`UnitStates`, asked once per run: rigkit.plumbing.facts_once) and reports "already so"
when the unit is as wanted and nothing it depends on changes in this run. In every other
case (a unit file about to change, a state the read does not settle) it hands over to
`systemd.service`, which decides on the rig at run time as before.
"""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import FactBase
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus
from pyinfra.operations import systemd

from rigkit.plumbing.facts_once import read_once


class UnitStates(FactBase):
    """{unit: {"running": bool, "enabled": bool}} for each unit, in one process. "Running" and
    "enabled" mean what they mean to pyinfra's own facts (the same SubState and UnitFileState
    values), so a unit found settled here is one `systemd.service` would leave alone too."""

    # Read ahead, the roles' unit lists are read as one (rigkit.plumbing.facts_once), each answered with the
    # units it named: so units are named in full ("x.service"), as systemd's Id answers them.
    merged_over = "units"

    @staticmethod
    def default() -> dict:
        return {}  # pyinfra answers an empty output with default(): nothing found

    def command(self, units: tuple[str, ...]) -> str:
        names = " ".join(shlex.quote(u) for u in units)
        return f"systemctl show --property=Id,SubState,UnitFileState -- {names} 2>/dev/null; exit 0"

    def process(self, output) -> dict:
        states, current = {}, {}
        for line in [*output, ""]:
            if not line.strip():
                if "Id" in current:
                    states[current["Id"]] = {
                        "running": current.get("SubState") in SystemdStatus.state_values,
                        "enabled": current.get("UnitFileState") in SystemdEnabled.state_values,
                    }
                current = {}
                continue
            key, _, value = line.partition("=")
            current[key] = value.strip()
        return states


def _settled(state: dict | None, running: bool | None, enabled: bool | None) -> bool:
    return (state is not None and (running is None or state["running"] == running)
            and (enabled is None or state["enabled"] == enabled))


def service(name: str, unit: str, batch: tuple[str, ...], *, running: bool | None = True,
            enabled: bool | None = None, after: tuple = ()):
    """Make `unit` running/enabled as asked (None: left as it is; running by default, as
    systemd.service). `batch`: every unit the role
    manages (the same tuple each call), read in one command; `after`: this run's operations
    whose change can change the unit (its unit file, a daemon-reload); while any of them will
    change, the decision is left to the rig at run time."""
    state = read_once(UnitStates, units=batch).get(unit)
    if not any(op.will_change for op in after) and _settled(state, running, enabled):
        host.noop(f"{unit} is already {'running' if running else 'stopped' if running is False else 'as wanted'}"
                  f"{', enabled' if enabled else ', disabled' if enabled is False else ''}")
        return None
    return systemd.service(name=name, service=unit, running=running, enabled=enabled)
