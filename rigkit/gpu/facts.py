"""pyinfra facts about a Linux rig's GPUs."""

from __future__ import annotations

from pyinfra.api import FactBase

from rigkit.gpu.nvsmi import GpuReport, parse_query, query_command


class NvidiaGpus(FactBase):
    """Each GPU's name, power limits and persistence mode, as nvidia-smi reports them.

    Returns None where nvidia-smi is not installed; a GpuReport with `error` set
    where it is installed but failed (driver not loaded, no permission).
    """

    requires_command = "nvidia-smi"

    def command(self) -> str:
        return query_command()

    def process(self, output) -> GpuReport:
        return parse_query(list(output))
