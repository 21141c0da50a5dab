"""pyinfra fact: the rig's state as `rigkit status` reads it, in one read-only command.

The probe (templates/status/rigkit-status-probe.py) is sent as `python3 -c` with its argument as
one shell-quoted JSON string: nothing is installed or written on the rig."""

from __future__ import annotations

import json
import shlex

from pyinfra.api import FactBase

from rigkit.plumbing.render import template_text

PROBE_TIMEOUT_S = 40


class RigStatusProbe(FactBase):
    """{"driver_version", "gpu_unit", "watchdog", "stacks", "volumes", "stacks_on_rig", "timed_out"} or
    {"error": ...} when the probe could not run (no python3, a bad answer, out of time).
    `timed_out`: {tool: "TOOL did not answer within N s"} for nvidia-smi or docker when hung."""

    def command(self, probe_args: str) -> str:
        script = shlex.quote(template_text("status/rigkit-status-probe.py"))
        # Its own calls are bounded; this bounds the whole probe too (a hung journal, a slow disk).
        return f"timeout -k 2 {PROBE_TIMEOUT_S} python3 -c {script} {shlex.quote(probe_args)} 2>&1"

    def process(self, output) -> dict:
        lines = [line for line in output if line.strip()]
        try:
            return json.loads(lines[-1])
        except (IndexError, ValueError):
            return {"error": "unreadable answer from the rig's status probe: " + " ".join(lines)[-400:]}


def probe_args(**values) -> str:
    return json.dumps(values, separators=(",", ":"))
