"""Did the cell's setting take effect? Verdicts from what the driver reports and what the GPUs
did under load; a cell that fails is reported, never measured as if it had its setting.

The checks of `rigkit.verify.checks` do the comparisons (enforced limit, draw under load, clock
ceiling). One more is needed here: a card can report the requested limit as enforced and still
be held lower by another firmware limit (the seed's "requested 106 W, drew 70 W"); its tell is
the power-cap throttle reason set while the draw sits well below the requested cap.
"""

from __future__ import annotations

from rigkit.tune.cells import Cell, Enforced, Figures, GpuTelemetry
from rigkit.verify.checks import (
    GpuLoad,
    check_clock_ceiling,
    check_enforced_limit,
    check_power_under_load,
)

HELD_BELOW_SHARE = 0.10  # draw this far below the cap while power-capped: another limit holds the card
CAPPED_MOST_OF_THE_TIME = 0.5  # share of samples with the SW power cap reason


def _load(index: int, enforced_w: float | None = None, telemetry: GpuTelemetry | None = None) -> GpuLoad:
    return GpuLoad(index=index, samples=0, samples_per_s=0.0,
                   max_sm_mhz=telemetry.max_sm_mhz if telemetry else None,
                   mean_power_under_load_w=telemetry.mean_power_under_load_w if telemetry else None,
                   enforced_limit_w=enforced_w, energy_counter_j=None, integrated_energy_j=None, duration_s=0.0)


def enforced_problems(cell: Cell, enforced: tuple[Enforced, ...]) -> list[str]:
    """After applying, before measuring: the limit and offsets the driver reports."""
    problems = []
    for gpu in enforced:
        check = check_enforced_limit(_load(gpu.index, gpu.power_limit_w), float(cell.power_limit_w))
        if not check.passed:
            problems.append(f"GPU {gpu.index}: {check.message}")
        for domain, wanted, read in (("memory", cell.mem_offset_mhz, gpu.mem_offset_mhz),
                                     ("graphics", cell.core_offset_mhz, gpu.core_offset_mhz)):
            if read is not None and read != wanted:
                problems.append(f"GPU {gpu.index}: {domain} offset reads {read:+d} MHz, requested {wanted:+d} MHz")
    return problems


def load_problems(cell: Cell, figures: Figures) -> list[str]:
    """After measuring: the draw and the SM clock under load against the cap and the lock."""
    problems = []
    for gpu in figures.gpus:
        load = _load(gpu.index, telemetry=gpu)
        for check in (check_power_under_load(load, float(cell.power_limit_w)),
                      check_clock_ceiling(load, cell.clock_lock_mhz)):
            if not check.passed:
                problems.append(f"GPU {gpu.index}: {check.message}")
        if held := _held_below(gpu, cell.power_limit_w):
            problems.append(f"GPU {gpu.index}: {held}")
    return problems


def _held_below(gpu: GpuTelemetry, cap_w: int) -> str | None:
    if gpu.mean_power_under_load_w is None or gpu.power_capped_share is None:
        return None  # without the throttle reason, a low draw may simply be a memory-bound load
    if gpu.power_capped_share >= CAPPED_MOST_OF_THE_TIME and gpu.mean_power_under_load_w < cap_w * (1 - HELD_BELOW_SHARE):
        return (f"requested {cap_w} W, drew {gpu.mean_power_under_load_w:.0f} W under load while power-capped in "
                f"{gpu.power_capped_share:.0%} of samples: another limit (firmware policy) holds the card, "
                "the requested cap is not in effect")
    return None
