"""The sweep driver: screen, order, apply, check, measure, restore. Pure: the rig is any object
that follows `Rig` (`rigkit.tune.remote.SshTuneRig` over SSH, with its dead man's switch on the
rig; tests/tune_sim.py's simulated one in the pure tests).

The original settings are restored whatever happens: at the end, on an error, and on Ctrl-C
(KeyboardInterrupt inside a measurement), before the exception travels on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from rigkit.config.schema import RigSpec
from rigkit.gpu.nvsmi import GpuReport
from rigkit.tune.analysis import CellResult, Choice, Reading, choose, drifts, table
from rigkit.tune.cells import OBJECTIVES, Cell, Enforced, Figures, Workload
from rigkit.tune.effect import enforced_problems, load_problems
from rigkit.tune.safety import OffsetRange, Refusal, cell_problems, screen
from rigkit.tune.schedule import Slot, abba_schedule
from rigkit.tune.stats import Drift


class Rig(Protocol):
    def apply(self, cell: Cell) -> None: ...  # set the cell on every GPU the sweep concerns
    def read_enforced(self) -> tuple[Enforced, ...]: ...  # what the driver reports now
    def measure(self, cell: Cell) -> Figures: ...  # one benchmark run under the applied cell
    def restore(self) -> None: ...  # back to the settings found before the sweep


class TuneError(Exception):
    """The sweep cannot start; str() is the whole message."""


@dataclass(frozen=True)
class SweepPlan:
    start: Cell  # the settings found on the rig: the control
    cells: tuple[Cell, ...]  # cells that passed the screen
    refused: tuple[Refusal, ...]
    schedule: tuple[Slot, ...]
    gpu_indices: tuple[int, ...]


def plan_sweep(grid: tuple[Cell, ...], start: Cell, spec: RigSpec, report: GpuReport, gpu_indices: tuple[int, ...],
               repeats: int, offset_ranges: tuple[OffsetRange, ...] = (), control_every: int = 4) -> SweepPlan:
    """Screen every cell (and the starting setting) before anything is applied, then order them."""
    if problems := cell_problems(start, spec, report, gpu_indices, offset_ranges):
        raise TuneError("the starting setting, measured as the control, is itself refused: " + "; ".join(problems))
    cells, refused = screen(grid, spec, report, gpu_indices, offset_ranges)
    return SweepPlan(start, cells, refused, abba_schedule(cells, start, repeats, control_every), gpu_indices)


@dataclass(frozen=True)
class NotInEffect:
    cell: Cell
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class SweepResult:
    table: tuple[CellResult, ...]
    choices: dict[str, Choice]  # objective -> chosen cell; an objective missing had nothing to choose from
    drift: tuple[Drift, ...]
    refused: tuple[Refusal, ...]
    not_in_effect: tuple[NotInEffect, ...]
    readings: tuple[Reading, ...]


def run_sweep(rig: Rig, plan: SweepPlan, workload: Workload | None = None, keep_share: float = 0.95) -> SweepResult:
    readings: list[Reading] = []
    failed: dict[Cell, tuple[str, ...]] = {}
    try:
        for slot in plan.schedule:
            if slot.cell in failed and not slot.control:
                continue  # known not to take effect: measuring it again would measure another setting
            readings.append(_one(rig, slot))
            if readings[-1].problems:
                failed.setdefault(slot.cell, readings[-1].problems)
    finally:
        rig.restore()
    return analyse(plan, readings, failed, workload, keep_share)


def _one(rig: Rig, slot: Slot) -> Reading:
    rig.apply(slot.cell)
    if problems := enforced_problems(slot.cell, rig.read_enforced()):
        return Reading(slot, None, tuple(problems))
    figures = rig.measure(slot.cell)
    return Reading(slot, figures, tuple(load_problems(slot.cell, figures)))


def analyse(plan: SweepPlan, readings: list[Reading], failed: dict[Cell, tuple[str, ...]],
            workload: Workload | None, keep_share: float) -> SweepResult:
    centre = (len(plan.schedule) - 1) / 2
    decode, prefill = drifts(readings, centre)
    rows = table(readings, set(failed), decode, prefill, centre, workload)
    choices = {o: c for o in OBJECTIVES if (c := choose(rows, o, keep_share)) is not None}
    return SweepResult(rows, choices, (decode, prefill), plan.refused,
                       tuple(NotInEffect(c, r) for c, r in failed.items()), tuple(readings))
