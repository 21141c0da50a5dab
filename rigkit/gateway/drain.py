"""A rig drained from the gateway and put back, from the control machine: the rig-side helper
(templates/gateway/rigkit-gateway, `drain RIG` / `undrain RIG`) run on the gateway's rig through
`pyinfra exec`, its own lines repeated for the person. Used by `rigkit rollout`
(rigkit/gateway/rollout.py; docs/gateway.md, "Drain during a rollout")."""

from __future__ import annotations

import shlex
import subprocess
import sys

from rigkit.gateway.plan import GatewayPlan
from rigkit.plumbing.pyinfra_command import PYINFRA
from rigkit.rigside.names import GATEWAY_HELPER_PATH

NOT_INSTALLED = 9  # the gateway helper is not on its rig yet (a first rollout) or not running: nothing to drain


def gateway_helper(inventory: str, plan: GatewayPlan, *action: str) -> int:
    """Run the rig-side gateway helper on the gateway's rig (pyinfra exec); its exit code, or
    NOT_INSTALLED."""
    helper = " ".join(shlex.quote(part) for part in (GATEWAY_HELPER_PATH, *action))
    command = (f"if [ -x {GATEWAY_HELPER_PATH} ]; then {helper}; else echo 'rigkit-gateway: not installed yet; "
               f"nothing to drain'; exit {NOT_INSTALLED}; fi")
    run = subprocess.run([*PYINFRA, "-y", "--limit", plan.host, inventory, "exec", "--",
                          command], capture_output=True, text=True)
    said = [line.split("rigkit-gateway:", 1)[1].strip() for line in (run.stdout + run.stderr).splitlines()
            if "rigkit-gateway:" in line]
    for line in said:
        print(f"rigkit rollout: gateway on {plan.host}: {line}", flush=True)
    if run.returncode != 0 and not said:
        print(f"rigkit rollout: gateway on {plan.host}: `{' '.join(action)}` failed:\n"
              f"{(run.stdout + run.stderr)[-2000:]}", file=sys.stderr)
    # Not installed yet, or its container stopped: nothing is routed through it, so there is
    # nothing to drain (a stopped gateway must not block the rollout that may bring it back).
    if run.returncode != 0 and any("not installed yet" in line or "container is not running" in line
                                   for line in said):
        return NOT_INSTALLED
    return run.returncode or 0
