"""The pyinfra fact that reads a Linux rig's GPU topology in one command. Read-only, POSIX shell.

Every tool is bounded with `timeout` (nvidia-smi can hang on a wedged GPU; lspci -vvv reads
every device's config space). Parsing lives in rigkit/topology/report.py, pure.
"""

from __future__ import annotations

from pyinfra.api import FactBase

from rigkit.topology.report import BEGIN, RC

PCIE_QUERY = "index,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max"
TOOL_TIMEOUT_S = 20

_READS = (
    ("uid", "id -u"),
    ("topo-m", f"timeout {TOOL_TIMEOUT_S} nvidia-smi topo -m"),
    ("p2p-r", f"timeout {TOOL_TIMEOUT_S} nvidia-smi topo -p2p r"),
    ("pcie", f"timeout {TOOL_TIMEOUT_S} nvidia-smi --query-gpu={PCIE_QUERY} --format=csv,noheader"),
    ("cmdline", "cat /proc/cmdline"),
    ("iommu", "ls /sys/class/iommu 2>/dev/null; true"),
    ("iommu-types", "cat /sys/kernel/iommu_groups/*/type 2>/dev/null; true"),
    # nvidia-smi's bus id 00000000:01:00.0 -> sysfs 0000:01:00.0; the chain of bridges above each GPU
    ("pci-paths", f"timeout {TOOL_TIMEOUT_S} nvidia-smi --query-gpu=index,pci.bus_id --format=csv,noheader | "
                  "while IFS=', ' read -r i b; do b=$(printf %s \"$b\" | tr A-F a-f); "
                  "echo \"$i $(readlink -f /sys/bus/pci/devices/${b#????})\"; done"),
    ("lspci", f"command -v lspci >/dev/null || {{ echo 'lspci not installed (pciutils)'; exit 127; }}; timeout {TOOL_TIMEOUT_S} lspci -D -vvv"),
)


class GpuTopology(FactBase):
    """Raw sections of the rig's topology; turn them into a RigTopology with
    rigkit.topology.report.read_report (which also says what could not be read)."""

    def command(self) -> str:
        return "; ".join(f"echo '{BEGIN}{name}'; ( {cmd} ) 2>&1; echo \"{RC}$?\"" for name, cmd in _READS) + "; exit 0"

    def process(self, output) -> list[str]:
        return [line.rstrip("\n") for line in output]
