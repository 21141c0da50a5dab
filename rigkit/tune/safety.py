"""The screen every cell passes before anything is applied: the driver's own ranges and the
rig's PSU budget (`rigkit.gpu.policy.psu_budget`), with the arithmetic in every refusal.

`psu_budget_override` in a rig file accepts the risk of the caps written there; it does not
extend to cells a sweep explores, so an over-budget cell is refused either way.
"""

from __future__ import annotations

from dataclasses import dataclass

from rigkit.config.schema import RigSpec
from rigkit.gpu.nvsmi import GpuReport
from rigkit.gpu.policy import psu_budget
from rigkit.tune.cells import Cell


@dataclass(frozen=True)
class OffsetRange:
    """The clock-offset range the driver reports for one GPU and domain (nvmlDeviceGetClockOffsets'
    min/max); an accepted offset still proves nothing about the clock reached under load."""

    index: int
    domain: str  # "memory" or "graphics"
    min_mhz: int
    max_mhz: int


@dataclass(frozen=True)
class Refusal:
    cell: Cell
    reasons: tuple[str, ...]


def cell_problems(cell: Cell, spec: RigSpec, report: GpuReport, gpu_indices: tuple[int, ...],
                  offset_ranges: tuple[OffsetRange, ...] = ()) -> list[str]:
    """Why `cell` must not be applied to the GPUs `gpu_indices` of this rig; [] when it may."""
    reported = {g.index: g for g in report.gpus}
    problems = []
    for index in gpu_indices:
        gpu = reported.get(index)
        if gpu is None:
            problems.append(f"GPU {index}: not in the driver's report; nothing is applied to a GPU it does not list")
            continue
        if not gpu.power_min_w <= cell.power_limit_w <= gpu.power_max_w:
            problems.append(f"GPU {index}: {cell.power_limit_w} W is outside {gpu.power_min_w:.0f}-"
                            f"{gpu.power_max_w:.0f} W, the range this {gpu.name} reports")
        if cell.clock_lock_mhz is not None and cell.clock_lock_mhz > gpu.clocks_max_graphics_mhz:
            problems.append(f"GPU {index}: lock ceiling {cell.clock_lock_mhz} MHz is above the card's maximum "
                            f"{gpu.clocks_max_graphics_mhz} MHz, so it would limit nothing")
        for domain, offset in (("memory", cell.mem_offset_mhz), ("graphics", cell.core_offset_mhz)):
            problems.extend(_offset_problem(index, domain, offset, offset_ranges))
    budget = psu_budget(_with_caps(spec, gpu_indices, cell.power_limit_w),
                        {g.index: g.power_default_w for g in report.gpus})
    if not budget.ok:
        problems.append(f"PSU budget: {budget.arithmetic()}")
    return problems


def _offset_problem(index: int, domain: str, offset_mhz: int, ranges: tuple[OffsetRange, ...]) -> list[str]:
    if offset_mhz == 0:
        return []
    found = [r for r in ranges if r.index == index and r.domain == domain]
    if not found:
        return [f"GPU {index}: {domain} offset {offset_mhz:+d} MHz asked for, but the driver reported no "
                f"{domain} offset range for this GPU"]
    allowed = found[0]
    if not allowed.min_mhz <= offset_mhz <= allowed.max_mhz:
        return [f"GPU {index}: {domain} offset {offset_mhz:+d} MHz is outside {allowed.min_mhz:+d}.."
                f"{allowed.max_mhz:+d} MHz, the range the driver reports"]
    return []


def _with_caps(spec: RigSpec, gpu_indices: tuple[int, ...], power_limit_w: int) -> RigSpec:
    """The rig as it would be during the cell: the swept GPUs at the cell's cap, the others as the rig file says."""
    gpus = [g.model_copy(update={"power_limit_w": power_limit_w}) if g.index in gpu_indices else g for g in spec.gpus]
    return spec.model_copy(update={"gpus": gpus})


def screen(cells: tuple[Cell, ...], spec: RigSpec, report: GpuReport, gpu_indices: tuple[int, ...],
           offset_ranges: tuple[OffsetRange, ...] = ()) -> tuple[tuple[Cell, ...], tuple[Refusal, ...]]:
    """(cells that may be applied, refused cells with their reasons)."""
    allowed, refused = [], []
    for cell in cells:
        if problems := cell_problems(cell, spec, report, gpu_indices, offset_ranges):
            refused.append(Refusal(cell, tuple(problems)))
        else:
            allowed.append(cell)
    return tuple(allowed), tuple(refused)
