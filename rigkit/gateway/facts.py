"""pyinfra facts about the gateway on its rig."""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase


class GatewayRunning(FactBase):
    """How many containers of the gateway's compose project run (0 when none or no Docker)."""

    def command(self, project: str) -> str:
        return f"timeout 30 docker compose -p {shlex.quote(project)} ps --status running -q 2>/dev/null | wc -l"

    def process(self, output) -> int:
        return int(output[0]) if output else 0
