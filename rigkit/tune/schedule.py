"""The order of measurements: mirrored passes (ABBA generalised to many cells) with the starting
setting repeated as a control.

A forward pass followed by the same pass reversed puts every cell's mean position at the
schedule's centre, so a linear drift (a card heating up, a neighbour's job starting) shifts
every cell's mean by the same amount and cannot reorder them. The controls, spread over the
whole run, measure that drift; a naive ascending sweep confounds it with the setting.
"""

from __future__ import annotations

from dataclasses import dataclass

from rigkit.tune.cells import Cell


@dataclass(frozen=True)
class Slot:
    position: int  # 0-based order of measurement: the time axis of the drift fit
    cell: Cell
    control: bool = False  # the starting setting, measured to follow drift


def abba_schedule(cells: tuple[Cell, ...], start: Cell, repeats: int, control_every: int = 4) -> tuple[Slot, ...]:
    """`repeats` (rounded up to even) measurements per cell in mirrored passes; a control opens
    each pass, follows every `control_every` cells and closes it."""
    if not cells:
        return ()
    forward: list[tuple[Cell, bool]] = [(start, True)]
    for n, cell in enumerate(cells, 1):
        forward.append((cell, False))
        if n % control_every == 0 or n == len(cells):
            forward.append((start, True))
    mirrored = forward + forward[::-1][1:]  # a palindrome; the shared middle control is measured once
    order = list(mirrored)
    for _ in range((repeats + 1) // 2 - 1):
        order += mirrored[1:]  # each pair starts and ends with a control: measure the joint once
    return tuple(Slot(i, cell, control) for i, (cell, control) in enumerate(order))


def in_a_row_schedule(cells: tuple[Cell, ...], repeats: int) -> tuple[Slot, ...]:
    """The naive order (each cell `repeats` times, ascending, no controls), kept to show what it gets wrong."""
    return tuple(Slot(i, cell) for i, cell in enumerate(c for c in cells for _ in range(repeats)))
