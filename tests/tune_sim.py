"""TEST INFRASTRUCTURE: a simulated rig for `rigkit tune`, with curves anchored to published numbers.

The curves and their anchors (seed 004's tables, the 3090 of the field notes) are in
tests/sim_curves.py, shared with the vLLM stand-in and the simulated NVML, so the rig-level
tests see the same card.
Noise is seeded; an optional drift changes every rate by a share per measurement.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from rigkit.config.schema import RigSpec
from rigkit.gpu.nvsmi import GpuReport, GpuStatus
from rigkit.tune.cells import Cell, Enforced, Figures, GpuTelemetry
from rigkit.tune.safety import OffsetRange
from tests.sim_curves import MEM_BASE_MHZ, QWEN27_DFLASH2, QWEN35_A3B, RTX3090, Profile, interpolate, truth  # noqa: F401


@dataclass
class SimTuneRig:
    """Follows `rigkit.tune.sweep.Rig`. `measure` reads the settings applied to the simulated cards,
    not the cell it is handed, so a setting that did not take effect is measured as what it is."""

    profile: Profile
    start: Cell
    gpu_indices: tuple[int, ...] = (0,)
    seed: int = 0
    noise_share: float = 0.006  # sd of one reading, relative
    drift_per_measurement: float = 0.0  # e.g. -0.004: every rate 0.4% lower per measurement taken
    held_at_w: float | None = None  # another firmware limit: draws at most this, reports the request as enforced
    enforced_clamp_w: float | None = None  # the driver enforces at most this, and says so
    lock_ignored: bool = False  # the SM clock runs past the lock
    interrupt_at: int | None = None  # raise KeyboardInterrupt in this measurement (1-based): Ctrl-C
    calls: list = field(default_factory=list)
    settings: Cell | None = None

    def __post_init__(self):
        self.rng = random.Random(self.seed)
        self.settings = self.start
        self.measurements = 0

    # -- the Rig protocol ------------------------------------------------
    def apply(self, cell: Cell) -> None:
        self.calls.append(("apply", cell))
        self.settings = cell

    def read_enforced(self) -> tuple[Enforced, ...]:
        cell = self.settings
        return tuple(Enforced(i, self._enforced_w(cell), cell.mem_offset_mhz, cell.core_offset_mhz)
                     for i in self.gpu_indices)

    def measure(self, cell: Cell) -> Figures:
        self.calls.append(("measure", cell))
        self.measurements += 1
        if self.interrupt_at == self.measurements:
            raise KeyboardInterrupt
        decode, prefill, draw_w, sm_mhz, capped = self.truth(self.settings)
        drift = 1 + self.drift_per_measurement * (self.measurements - 1)
        return Figures(decode * drift * self.rng.gauss(1, self.noise_share),
                       prefill * drift * self.rng.gauss(1, self.noise_share * 1.5),
                       tuple(GpuTelemetry(i, draw_w * self.rng.gauss(1, 0.005), sm_mhz, capped)
                             for i in self.gpu_indices))

    def restore(self) -> None:
        self.calls.append(("restore",))
        self.settings = self.start

    # -- the model ---------------------------------------------------------
    def _enforced_w(self, cell: Cell) -> float:
        return min(cell.power_limit_w, self.enforced_clamp_w or cell.power_limit_w)

    def truth(self, cell: Cell) -> tuple[float, float, float, float, float]:
        """(decode tok/s, prefill tok/s, draw W, peak SM MHz, power-capped share) without noise or drift."""
        t = truth(self.profile, self._enforced_w(cell), cell.clock_lock_mhz, cell.mem_offset_mhz,
                  cell.core_offset_mhz, self.held_at_w, self.lock_ignored)
        return t.decode_tok_s, t.prefill_tok_s, t.draw_w, t.sm_mhz, 1.0 if t.power_capped else 0.0

    # -- what the driver reports before the sweep ----------------------------
    def report(self) -> GpuReport:
        p = self.profile
        return GpuReport(tuple(
            GpuStatus(i, p.gpu_name, f"GPU-sim-{i}", self.start.power_limit_w, self.start.power_limit_w,
                      p.power_default_w, p.power_min_w, p.power_max_w, True, p.clocks_max_graphics_mhz, 24_576)
            for i in self.gpu_indices))

    def offset_ranges(self, memory_max_mhz: int = 6000, graphics_max_mhz: int = 1000) -> tuple[OffsetRange, ...]:
        return tuple(r for i in self.gpu_indices for r in (OffsetRange(i, "memory", -2000, memory_max_mhz),
                                                           OffsetRange(i, "graphics", -500, graphics_max_mhz)))


def rig_spec(model: str, caps_w: list[int | None], psu_w: int, system_w: int, **extra) -> RigSpec:
    gpus = [{"index": i, "model": model, **({"power_limit_w": c} if c is not None else {})} for i, c in enumerate(caps_w)]
    return RigSpec.model_validate({"os": "linux", "psu_w": psu_w, "system_w": system_w, "gpus": gpus, **extra})
