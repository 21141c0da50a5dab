"""From readings to a table, the drift, a ranking and the chosen cell per objective. Pure.

Each reading is first moved to the schedule's centre with the drift fitted to the controls
(only when that drift is beyond the noise); in a mirrored schedule this leaves every cell's mean
where it was and only removes the spread the drift added. Cells whose setting did not take
effect, and the controls, are not in the table.
"""

from __future__ import annotations

from dataclasses import dataclass

from rigkit.tune.cells import Cell, Figures, Workload
from rigkit.tune.schedule import Slot
from rigkit.tune.stats import Drift, Summary, compare, detrend, fit_drift, summarise


@dataclass(frozen=True)
class Reading:
    slot: Slot
    figures: Figures | None  # None: not measured, the setting was not in effect
    problems: tuple[str, ...] = ()  # why the setting was not in effect


@dataclass(frozen=True)
class CellResult:
    cell: Cell
    decode_tok_s: Summary
    prefill_tok_s: Summary
    response_time_s: Summary | None  # estimated for the workload, when one was given
    power_w: Summary | None  # measured draw under load, summed over the GPUs

    @property
    def decode_tok_s_per_w(self) -> float | None:
        return self.decode_tok_s.mean / self.power_w.mean if self.power_w and self.power_w.mean else None


@dataclass(frozen=True)
class Choice:
    objective: str
    cell: Cell
    reason: str
    tied_with: tuple[Cell, ...] = ()


def drifts(readings: list[Reading], centre: float) -> tuple[Drift, Drift]:
    controls = [r for r in readings if r.slot.control and r.figures is not None and not r.problems]
    return (fit_drift("decode tok/s", [(r.slot.position, r.figures.decode_tok_s) for r in controls], centre),
            fit_drift("prefill tok/s", [(r.slot.position, r.figures.prefill_tok_s) for r in controls], centre))


def table(readings: list[Reading], excluded: set[Cell], decode: Drift, prefill: Drift, centre: float,
          workload: Workload | None) -> tuple[CellResult, ...]:
    per_cell: dict[Cell, list[tuple[float, float, float | None]]] = {}
    for r in readings:
        if r.slot.control or r.figures is None or r.slot.cell in excluded:
            continue
        per_cell.setdefault(r.slot.cell, []).append((
            detrend(r.figures.decode_tok_s, r.slot.position, decode, centre),
            detrend(r.figures.prefill_tok_s, r.slot.position, prefill, centre),
            r.figures.mean_power_w,
        ))
    rows = []
    for cell, values in sorted(per_cell.items(), key=lambda item: item[0].aggressiveness()):
        watts = [w for _, _, w in values if w is not None]
        rows.append(CellResult(
            cell,
            summarise([d for d, _, _ in values]),
            summarise([p for _, p, _ in values]),
            summarise([workload.response_time_s(p, d) for d, p, _ in values]) if workload else None,
            summarise(watts) if len(watts) == len(values) else None,
        ))
    return tuple(rows)


def _metric(row: CellResult, objective: str) -> Summary:
    return row.response_time_s if objective == "response-time" else row.decode_tok_s


def ranking(rows: tuple[CellResult, ...], objective: str) -> list[tuple[CellResult, str]]:
    """Best first, each with its verdict against the best: "best", "tie" (inside the noise) or "worse"."""
    higher = objective != "response-time"
    ordered = sorted(rows, key=lambda r: _metric(r, objective).mean, reverse=higher)
    if not ordered:
        return []
    best = _metric(ordered[0], objective)
    return [(r, "best" if i == 0 else compare(_metric(r, objective), best, higher))
            for i, r in enumerate(ordered)]


def choose(rows: tuple[CellResult, ...], objective: str, keep_share: float = 0.95) -> Choice | None:
    """decode / response-time: the best cell, or the least aggressive of those tied with it.
    efficiency: the least aggressive cell (lowest power first) keeping `keep_share` of the best decode."""
    if not rows or (objective == "response-time" and rows[0].response_time_s is None):
        return None
    if objective == "efficiency":
        best = max(rows, key=lambda r: r.decode_tok_s.mean)
        floor = keep_share * best.decode_tok_s.mean
        pick = min((r for r in rows if r.decode_tok_s.mean >= floor), key=lambda r: r.cell.aggressiveness())
        share = pick.decode_tok_s.mean / best.decode_tok_s.mean
        return Choice(objective, pick.cell,
                      f"{pick.decode_tok_s.mean:.2f} tok/s decode, {share:.1%} of the best "
                      f"({best.decode_tok_s.mean:.2f} at {best.cell.label()}): the lowest setting keeping "
                      f">= {keep_share:.0%}")
    ranked = ranking(rows, objective)
    contenders = [r for r, verdict in ranked if verdict != "worse"]
    pick = min(contenders, key=lambda r: r.cell.aggressiveness())
    value = _metric(pick, objective)
    unit = "s estimated response time" if objective == "response-time" else "tok/s decode"
    others = tuple(r.cell for r in contenders if r is not pick)
    reason = f"{value.mean:.2f} {unit} (95% CI {value.low:.2f}-{value.high:.2f}, n={value.n})"
    if others:
        reason += f"; tied within the noise with {len(others)} other cell(s), so the least aggressive is chosen"
    return Choice(objective, pick.cell, reason, others)
