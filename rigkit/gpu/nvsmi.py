"""nvidia-smi's query interface: the command line and the parser for what it prints.

Pure functions; the pyinfra fact in `rigkit.gpu.facts` runs the command on the rig.
Note what is *not* here: a clock lock cannot be read back through nvidia-smi
or NVML (`clocks.max.graphics` is the hardware ceiling, locked or not).
"""

from __future__ import annotations

from dataclasses import dataclass

from rigkit.plumbing.rig_reads import NVIDIA_SMI_S, TIMED_OUT_CODES, bounded, no_answer

QUERY_FIELDS = (
    "index",
    "name",
    "uuid",
    "power.limit",
    "enforced.power.limit",
    "power.default_limit",
    "power.min_limit",
    "power.max_limit",
    "persistence_mode",
    "clocks.max.graphics",
    "memory.total",
)

# The exit status rides on the last line so a failure is reported, not mistaken for "no GPUs".
EXIT_MARK = "rigkit-nvidia-smi-exit="
EXIT_NO_PERMISSION = 4  # nvidia-smi's "Insufficient Permissions"


def query_arguments() -> list[str]:
    return [f"--query-gpu={','.join(QUERY_FIELDS)}", "--format=csv,noheader,nounits"]


def query_command() -> str:
    return f'{bounded("nvidia-smi", NVIDIA_SMI_S)} {" ".join(query_arguments())} 2>&1; echo "{EXIT_MARK}$?"'


def timed_out(exit_code: int) -> bool:
    """nvidia-smi ran out of time (`rigkit.plumbing.rig_reads.bounded`): a wedged GPU or driver, not an error it printed."""
    return exit_code in TIMED_OUT_CODES


@dataclass(frozen=True)
class GpuStatus:
    index: int
    name: str
    uuid: str
    power_limit_w: float
    enforced_power_limit_w: float
    power_default_w: float
    power_min_w: float
    power_max_w: float
    persistence_mode: bool
    clocks_max_graphics_mhz: int
    memory_total_mib: int


@dataclass(frozen=True)
class GpuReport:
    gpus: tuple[GpuStatus, ...]
    error: str | None = None  # nvidia-smi's own words when it failed
    exit_code: int = 0


def _number(text: str) -> float:
    return float(text) if text not in ("[N/A]", "N/A", "[Not Supported]") else float("nan")


def parse_query(lines: list[str]) -> GpuReport:
    exit_code = 0
    body = []
    for line in lines:
        if line.startswith(EXIT_MARK):
            exit_code = int(line[len(EXIT_MARK):])
        elif line.strip():
            body.append(line)
    if timed_out(exit_code):
        return GpuReport((), no_answer("nvidia-smi", NVIDIA_SMI_S) + " (a wedged GPU or driver)", exit_code)
    if exit_code != 0:
        return GpuReport((), " ".join(body) or f"nvidia-smi exited {exit_code}", exit_code)
    gpus = []
    for line in body:
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(QUERY_FIELDS):
            return GpuReport((), f"unexpected nvidia-smi line: {line!r}", exit_code)
        gpus.append(
            GpuStatus(
                index=int(cells[0]),
                name=cells[1],
                uuid=cells[2],
                power_limit_w=_number(cells[3]),
                enforced_power_limit_w=_number(cells[4]),
                power_default_w=_number(cells[5]),
                power_min_w=_number(cells[6]),
                power_max_w=_number(cells[7]),
                persistence_mode=cells[8] == "Enabled",
                clocks_max_graphics_mhz=int(_number(cells[9])),
                memory_total_mib=int(_number(cells[10])),
            )
        )
    return GpuReport(tuple(gpus))
