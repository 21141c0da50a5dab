"""Idle energy: what a rig's GPUs draw while they do no work, per GPU, over the last day. A resident CUDA
context or a clock lock keeps an idle GPU's draw up (docs/on-demand.md); this is the figure that shows
what that costs, and what parking saves. Standard library only (it runs in the GPU keeper on the rig).

The GPU keeper's watch (templates/gpu_policy/rigkit-gpu-keeper.py, every 1.5 s) samples each GPU's energy
counter, power and utilization and hands them to a Ledger. An interval between two samples is idle when
NVML's utilization read 0 at both its ends (the share of its last sample period, 1/6 to 1 s, in which a
kernel ran): a request between two samples that both read 0 is missed, so the figure is a close upper
bound, not a meter. Its energy is the energy counter's difference (NVML's, in mJ since the driver loaded),
or the mean of the two power readings times the interval where the counter is missing or went back (a
driver reload). An interval longer than MAX_GAP_S (the keeper stopped, NVML did not answer) is not
measured: the figures say how long was measured.

The ledger file (names.IDLE_ENERGY_PATH, JSON, written atomically every SAVE_S) keeps per GPU and hour
[idle J, idle s, all J, measured s] for KEPT_HOURS, and the same since it began ("totals", which only
grow: the exporter's counters). `rigkit status` and the exporter read it with last_day.
"""

from __future__ import annotations

import json
import math
import os
import time

from . import atomic

HOUR_S = 3600
DAY_S = 24 * HOUR_S
KEPT_HOURS = 48
SAVE_S = 15.0
MAX_GAP_S = 10.0  # a longer interval between two samples is not measured
MAX_PLAUSIBLE_W = 3000.0  # an energy counter step above this over the interval is not believed (a counter reset)
J_PER_KWH = 3.6e6
IDLE_J, IDLE_S, ALL_J, ALL_S = range(4)


def read_gpu(nvml, handle) -> tuple[float | None, float | None, int | None]:
    """(energy counter in J, power in W, utilization in %) of one GPU through `nvml` (pynvml); None for a
    value NVML does not answer on this GPU. Raises where NVML itself is down (the caller's to handle)."""
    def call(name, scale=None):
        fn = getattr(nvml, name, None)
        if fn is None:
            return None
        try:
            value = fn(handle)
        except nvml.NVMLError as exc:  # not on this GPU, or not in this driver: a missing value; else NVML is down
            if getattr(exc, "value", None) in (getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", 3),
                                               getattr(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", 13)):
                return None
            raise
        return value if scale is None else value / scale
    utilization = call("nvmlDeviceGetUtilizationRates")
    return (call("nvmlDeviceGetTotalEnergyConsumption", 1000.0), call("nvmlDeviceGetPowerUsage", 1000.0),
            None if utilization is None else int(utilization.gpu))


def _empty() -> dict:
    return {"version": 1, "hours": {}, "totals": {}, "since": None}


def _number(value) -> float | None:
    """A finite number at or above 0 (JSON allows 1e999 and Infinity; Python's int any size), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) and number >= 0 else None


def _index(key) -> str | None:
    """A GPU or hour key as the ledger writes it: ASCII digits ("²" is a digit to str.isdigit, not to int)."""
    key = str(key)
    return key if key.isascii() and key.isdigit() and len(key) < 16 else None


def _cells(value) -> list[float] | None:
    if isinstance(value, list) and len(value) == 4:
        numbers = [_number(v) for v in value]
        if None not in numbers:
            return numbers
    return None


def normalized(doc) -> dict:
    """A ledger document as read from its file, with every malformed part dropped (a file cut off or edited
    by hand starts a fresh ledger where it does not parse, never a traceback in the keeper)."""
    out = _empty()
    if not isinstance(doc, dict):
        return out
    out["since"] = _number(doc.get("since"))
    for hour, gpus in doc["hours"].items() if isinstance(doc.get("hours"), dict) else ():
        if _index(hour) and isinstance(gpus, dict):
            kept = {_index(g): c for g, c in ((g, _cells(v)) for g, v in gpus.items()) if _index(g) and c}
            if kept:
                out["hours"][_index(hour)] = kept
    for gpu, value in doc["totals"].items() if isinstance(doc.get("totals"), dict) else ():
        cells = _cells(value)
        if _index(gpu) and cells:
            out["totals"][_index(gpu)] = cells
    return out


class Ledger:
    """Adds samples up; `save` writes the file at most every SAVE_S (and when forced)."""

    def __init__(self, path: str, clock=time.time):
        self.path, self.clock = path, clock
        try:
            self.doc = normalized(atomic.read_json(path))
        except Exception:  # e.g. JSON nested past the parser's recursion limit: a fresh ledger, never a crash
            self.doc = _empty()
        self.last: dict[int, tuple[float, float | None, float | None, int | None]] = {}
        self.saved_at = 0.0

    def add(self, gpu: int, at: float, energy_j: float | None, power_w: float | None, utilization: int | None) -> None:
        """One sample of one GPU taken at `at` (time.monotonic()); the interval since its last sample is
        added to the hour it ends in."""
        previous = self.last.get(gpu)
        self.last[gpu] = (at, energy_j, power_w, utilization)
        if previous is None:
            return
        then, energy_then, power_then, utilization_then = previous
        seconds = at - then
        if not 0 < seconds <= MAX_GAP_S:
            return
        joules = None
        if energy_j is not None and energy_then is not None and 0 <= energy_j - energy_then <= MAX_PLAUSIBLE_W * seconds:
            joules = energy_j - energy_then
        elif power_w is not None and power_then is not None:
            joules = (power_w + power_then) / 2 * seconds
        if joules is None:
            return
        idle = utilization == 0 and utilization_then == 0
        now = self.clock()
        if self.doc["since"] is None:
            self.doc["since"] = now - seconds
        hour = self.doc["hours"].setdefault(str(int(now // HOUR_S)), {})
        for cells in (hour.setdefault(str(gpu), [0.0] * 4), self.doc["totals"].setdefault(str(gpu), [0.0] * 4)):
            cells[ALL_J] += joules
            cells[ALL_S] += seconds
            if idle:
                cells[IDLE_J] += joules
                cells[IDLE_S] += seconds

    def forget(self, gpu: int) -> None:
        """NVML stopped answering for this GPU: the next sample starts a new interval."""
        self.last.pop(gpu, None)

    def save(self, force: bool = False) -> None:
        now = self.clock()
        if not force and now - self.saved_at < SAVE_S:
            return
        oldest, current = int(now // HOUR_S) - KEPT_HOURS + 1, int(now // HOUR_S)
        # hours ahead of the clock (it was set back: a boot with its clock ahead, then NTP) are dropped too
        self.doc["hours"] = {h: v for h, v in self.doc["hours"].items() if oldest <= int(h) <= current}
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        atomic.write_text(self.path, json.dumps(self.doc, sort_keys=True))
        self.saved_at = now


def last_day(doc, now: float) -> dict | None:
    """The ledger's last 24 hours, or None with nothing measured: the hours from the current one back, the
    oldest counted for the share of it within 24 h of `now` (the rig's clock; a bucket is taken as spread
    evenly over its hour): {"gpus": {gpu: {"idle_kwh", "idle_s", "measured_s", "idle_w"}}, "idle_kwh",
    "measured_s", "idle_kwh_per_day"}. `idle_kwh_per_day` scales each GPU's idle energy to a whole day from
    the time it was measured (so it equals idle_kwh once a whole day was); `idle_w` a GPU's mean draw while
    idle; `measured_s` the longest any GPU was measured."""
    doc = normalized(doc)
    current = int(now // HOUR_S)
    oldest = current - 24
    sums: dict[str, list[float]] = {}
    for hour, gpus in doc["hours"].items():
        if not oldest <= int(hour) <= current:
            continue
        share = 1.0 - (now - current * HOUR_S) / HOUR_S if int(hour) == oldest else 1.0
        for gpu, cells in gpus.items():
            total = sums.setdefault(gpu, [0.0] * 4)
            for i, value in enumerate(cells):
                total[i] += value * share
    measured = {g: c for g, c in sums.items() if c[ALL_S]}
    if not measured:
        return None
    gpus = {int(g): {"idle_kwh": round(c[IDLE_J] / J_PER_KWH, 4), "idle_s": round(c[IDLE_S], 1),
                     "measured_s": round(c[ALL_S], 1),
                     "idle_w": round(c[IDLE_J] / c[IDLE_S], 1) if c[IDLE_S] else None}
            for g, c in sorted(measured.items(), key=lambda item: int(item[0]))}
    idle_j = sum(c[IDLE_J] for c in measured.values())
    per_day_j = sum(c[IDLE_J] * DAY_S / min(c[ALL_S], DAY_S) for c in measured.values())
    return {"gpus": gpus, "idle_kwh": round(idle_j / J_PER_KWH, 4),
            "measured_s": round(max(c[ALL_S] for c in measured.values()), 1),
            "idle_kwh_per_day": round(per_day_j / J_PER_KWH, 4)}
