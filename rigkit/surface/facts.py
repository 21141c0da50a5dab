"""pyinfra fact: the firewall's state on the rig (read-only)."""

from __future__ import annotations

from pyinfra.api import FactBase

from rigkit.rigside.names import SURFACE_TABLE


class SurfaceState(FactBase):
    """{"nft": the nft command is installed, "table": rigkit's table is loaded in the kernel now}. A table
    missing while its file is in place (a reboot before the unit ran, `nft flush ruleset` by hand, another
    firewall tool) is re-applied by the next deploy."""

    requires_command = None

    @staticmethod
    def default() -> dict:
        return {"nft": False, "table": False}

    def command(self) -> str:
        return (f"command -v nft >/dev/null 2>&1 && echo nft; "
                f"nft list table inet {SURFACE_TABLE} >/dev/null 2>&1 && echo table; exit 0")

    def process(self, output) -> dict:
        lines = {line.strip() for line in output}
        return {"nft": "nft" in lines, "table": "table" in lines}
