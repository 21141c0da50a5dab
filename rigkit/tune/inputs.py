"""What `rigkit tune`'s command and session share: the input error, the starting cell, the grid,
and where results go."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from pathlib import Path

from rigkit.tune.cells import Cell
from rigkit.tune.grid import GridError, build_grid
from rigkit.verify.history import write_document


class TuneInputError(Exception):
    """Bad input: one message, exit 2, nothing touched."""


def default_json(results_dir: Path, rig: str, model: str, hold: bool) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return results_dir / rig / model / f"tune-{'hold-' if hold else ''}{stamp}.json"


def write_json(path: Path, document: dict) -> None:
    """The tune document, atomically, saying its kind and time: it lies beside the verification
    results, and their readers pick by those two (rigkit.verify.history), never by file name."""
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    write_document(path, {"kind": "tune", "time": stamp, **document})


def elapsed(started: float) -> float:
    return round(time.monotonic() - started, 2)


def start_cell(rig, gpus: tuple[int, ...], reading: dict) -> Cell:
    """The setting in force: the enforced limit and offsets read now, the lock the rig file declares
    (a lock cannot be read back). The GPUs must agree: a cell is applied alike to all of them."""
    cells = set()
    for g in reading["gpus"]:
        spec = next((s for s in rig.spec.gpus if s.index == g["index"]), None)
        lock = spec.clock_lock_mhz.ceiling_mhz if spec and spec.clock_lock_mhz else None
        offsets = {d: (o or {}).get("now", 0) for d, o in g["offsets"].items()}
        cells.add(Cell(int(round(g["enforced_w"])), lock, offsets["memory"], offsets["graphics"]))
    if len(cells) != 1:
        raise TuneInputError(f"the model's GPUs {list(gpus)} are not at one setting now "
                             f"({'; '.join(c.label() for c in sorted(cells))}); deploy the rig's policy first")
    return cells.pop()


def grid_for(options, start: Cell) -> tuple[Cell, ...]:
    try:
        return build_grid(start, options.power_limits, options.clock_locks, options.mem_offsets, options.core_offsets)
    except GridError as exc:
        raise TuneInputError(str(exc)) from None
