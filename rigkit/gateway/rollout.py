"""`rigkit rollout INVENTORY`: the whole deploy, one rig at a time, stopping at the first rig that fails.

Each rig gets the whole deploy (and its rollback) before the next starts; the first is the canary: a
failure stops the rollout before the next rig. With a gateway in the inventory, each rig's replicas
are drained from it first (rigkit/gateway/drain.py: a bounded wait for their in-flight requests) and
put back once the rig deployed. A rig that fails stays out, unless all that failed was the rollout
gate refusing new configs, each rolled back to its last proven config and that verified (the
deploy's outcome file says so, written last by roles/verify.py): the rig then serves what it served
before, proven, and is put back. Without a gateway it is the same rollout, with nothing to drain.

It lives with the gateway because a rollout is one rig at a time so that the gateway keeps serving
from the others, and what it decides beyond "stop" is the rig's place in the gateway
(docs/gateway.md, "Drain during a rollout"; the gate: docs/serving.md, "Across rigs").
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rigkit.config.errors import CONFIG_ERROR
from rigkit.config.inventory import RigConfigError, accept_slower_data, load_inventory
from rigkit.gateway.drain import NOT_INSTALLED, gateway_helper
from rigkit.gateway.plan import GatewayPlan, gateway_plan
from rigkit.plumbing.pyinfra_command import PYINFRA


def rollout(inventory: str, names: list[str], deploy_file: str, accept_slower: list[str] | None,
            pyinfra_flags: list[str]) -> int:
    """Roll the deploy `deploy_file` out to the rigs `names` of `inventory` (checked offline before), in
    that order, each rig's deploy given pyinfra's pass-through flags; the command's exit code."""
    try:
        plan = gateway_plan(list(load_inventory(inventory)))
    except RigConfigError as exc:
        print(f"rigkit rollout: {exc}", file=sys.stderr)
        return CONFIG_ERROR
    run = Rollout(inventory, deploy_file, names, accept_slower_data(accept_slower), pyinfra_flags)
    with tempfile.TemporaryDirectory(prefix="rigkit-rollout-") as outcomes:
        return _roll(run, plan, Path(outcomes))


@dataclass(frozen=True)
class Rollout:
    """What every rig's deploy of one rollout is given."""

    inventory: str
    deploy_file: str
    names: list[str]  # the rigs, in the order they are deployed
    accepted: list[str]  # pyinfra's `--data rigkit_accept_slower=...`, or nothing
    pyinfra_flags: list[str]  # --diff, -v..., --serial, --parallel N: passed to each rig's deploy

    def deploy_command(self, name: str, outcome: Path) -> list[str]:
        """One rig's whole deploy; its last gate step writes `outcome` when the rollout gate refused."""
        return [*PYINFRA, "-y", *self.accepted, "--data", f"rigkit_rollout_outcome={outcome}", *self.pyinfra_flags,
                "--limit", name, self.inventory, self.deploy_file]


def _roll(run: Rollout, plan: GatewayPlan | None, outcomes: Path) -> int:
    names = run.names
    for position, name in enumerate(names, 1):
        print(f"rigkit rollout: rig {position}/{len(names)}: {name}", flush=True)
        drained = False
        if plan is not None and plan.replicas_of(name):
            code = gateway_helper(run.inventory, plan, "drain", name)
            if code not in (0, NOT_INSTALLED):
                print(f"rigkit rollout: STOPPED before {name}: the gateway could not drain it (nothing changed on "
                      f"{name}); rigs not started: {', '.join(names[position - 1:])}", file=sys.stderr)
                return 1
            drained = code == 0
        outcome = outcomes / f"{position}.json"
        if subprocess.run(run.deploy_command(name, outcome)).returncode != 0:
            untouched = ", ".join(names[position:]) or "none"
            refused = refused_and_proven(outcome, name)
            if refused is None:
                out = f"; {name} stays out of the gateway" if drained else ""
                print(f"rigkit rollout: STOPPED: {name} failed{out}; rigs not started: {untouched}", file=sys.stderr)
                return 1
            back = ""
            if drained:
                back = ("; it is back in the gateway" if gateway_helper(run.inventory, plan, "undrain", name) == 0
                        else "; the gateway did NOT take it back (see above)")
            print(f"rigkit rollout: STOPPED: the rollout gate refused {refused} on {name}, rolled back to the last "
                  f"proven config and verified{back}; rigs not started: {untouched}", file=sys.stderr)
            return 1
        if drained and gateway_helper(run.inventory, plan, "undrain", name) != 0:
            print(f"rigkit rollout: STOPPED: {name} deployed, but the gateway did not take it back", file=sys.stderr)
            return 1
    print(f"rigkit rollout: all {len(names)} rigs deployed")
    return 0


def refused_and_proven(outcome: Path, name: str) -> str | None:
    """The models the rollout gate refused on rig `name`, when its deploy's outcome file says every one was
    rolled back and verified and nothing else failed (roles/verify.py writes it last); else None."""
    try:
        said = json.loads(outcome.read_text())
    except (OSError, ValueError):
        return None  # not written: the deploy failed before or apart from the gate's refusals
    if not isinstance(said, dict) or said.get("rig") != name or said.get("serving_proven") is not True:
        return None
    return ", ".join(str(r.get("model")) for r in said.get("refused") or []) or None
