"""Parsing `rigkit tune`'s options into a grid of cells. Pure; every error is one line that
names the option and the value, for the person typing the command."""

from __future__ import annotations

import itertools
import re

from rigkit.config.errors import shown
from rigkit.tune.cells import OBJECTIVES, Cell, Workload

MAX_VALUES_PER_OPTION = 40
MAX_CELLS = 200  # each cell costs minutes of loaded GPU time per repeat
UNLOCKED = ("none", "unlocked")


class GridError(ValueError):
    """A bad option value; str() is the whole message."""


def parse_values(option: str, text: str, *, allow_negative: bool = False, allow_unlocked: bool = False) -> tuple:
    """`200:350:25` (start:stop:step, stop included when on a step) or `200,250,300`; for
    --clock-locks also `none` (unlocked)."""
    text = text.strip()
    if not text:
        raise GridError(f"{option}: empty value; give a list (200,250) or start:stop:step (200:350:25)")
    if ":" in text:
        parts = text.split(":")
        if len(parts) != 3:
            raise GridError(f"{option} {shown(text)}: a range is start:stop:step, e.g. 200:350:25")
        start, stop, step = (_integer(option, text, p) for p in parts)
        if step <= 0:
            raise GridError(f"{option} {shown(text)}: the step must be positive, got {step}")
        if start > stop:
            raise GridError(f"{option} {shown(text)}: start {start} is above stop {stop}")
        count = len(range(start, stop + 1, step))  # counted before any list is built
        if count > MAX_VALUES_PER_OPTION:
            raise GridError(f"{option} {shown(text)}: {count} values; at most {MAX_VALUES_PER_OPTION}, use a coarser step")
        values: list = list(range(start, stop + 1, step))
    else:
        values = []
        for part in text.split(","):
            part = part.strip()
            if allow_unlocked and part.lower() in UNLOCKED:
                values.append(None)
            else:
                values.append(_integer(option, text, part))
    numbers = [v for v in values if v is not None]
    if not allow_negative and any(v <= 0 for v in numbers):
        raise GridError(f"{option} {shown(text)}: values must be positive, got {min(numbers)}")
    if len(values) > MAX_VALUES_PER_OPTION:
        raise GridError(f"{option} {shown(text)}: {len(values)} values; at most {MAX_VALUES_PER_OPTION}, use a coarser step")
    if len(set(values)) != len(values):
        raise GridError(f"{option} {shown(text)}: a value is listed twice")
    return tuple(values)


def _integer(option: str, text: str, part: str) -> int:
    # ASCII digits only: int() also reads '٣' (Arabic-Indic three), which nobody means here.
    if not re.fullmatch(r"-?[0-9]{1,30}", part.strip()):
        raise GridError(f"{option} {shown(text)}: {shown(part.strip())} is not a whole number (ASCII digits)")
    return int(part.strip())


def parse_repeats(text: str) -> int:
    """Measurements per cell. The ABBA order measures in mirrored pairs, so an odd count is rounded up."""
    value = _integer("--repeats", text, text)
    if not 1 <= value <= 50:
        raise GridError(f"--repeats {shown(text)}: give 1-50 measurements per cell (2 or more for an interval)")
    return value + value % 2


def parse_objective(text: str) -> str:
    if text not in OBJECTIVES:
        raise GridError(f"--objective {shown(text)}: choose one of {', '.join(OBJECTIVES)}")
    return text


def parse_threshold(text: str) -> float:
    """--keep: the share of the best decode `efficiency` must keep, `0.95` or `95%`."""
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise GridError(f"--keep {shown(text)}: give a share such as 0.95 or 95%") from None
    if not 0.5 <= value <= 1.0:
        raise GridError(f"--keep {shown(text)}: the share must be between 50% and 100%")
    return value


def parse_workload(text: str) -> Workload:
    """`8000/640`: input tokens / output tokens per request."""
    parts = text.split("/")
    if len(parts) != 2:
        raise GridError(f"--workload {shown(text)}: give input/output tokens per request, e.g. 8000/640")
    input_tokens, output_tokens = (_integer("--workload", text, p) for p in parts)
    if input_tokens < 0 or output_tokens <= 0:
        raise GridError(f"--workload {shown(text)}: input tokens must be >= 0 and output tokens > 0")
    return Workload(input_tokens, output_tokens)


def build_grid(start: Cell, power_limits_w=(), clock_locks_mhz=(), mem_offsets_mhz=(), core_offsets_mhz=()) -> tuple[Cell, ...]:
    """Every combination; an option not given keeps the starting setting's value."""
    combinations = itertools.product(
        power_limits_w or (start.power_limit_w,),
        clock_locks_mhz or (start.clock_lock_mhz,),
        mem_offsets_mhz or (start.mem_offset_mhz,),
        core_offsets_mhz or (start.core_offset_mhz,),
    )
    cells = tuple(sorted((Cell(*values) for values in combinations), key=Cell.aggressiveness))
    if len(cells) > MAX_CELLS:
        raise GridError(f"the grid has {len(cells)} cells; at most {MAX_CELLS}: sweep one lever at a time, "
                        "then combine the shortlisted values")
    return cells
