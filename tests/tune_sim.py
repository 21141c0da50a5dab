"""TEST INFRASTRUCTURE: a simulated rig for `rigkit tune`, with curves anchored to published numbers.

Anchors (decode tok/s at zero offsets, by power cap):
- seed 004, RTX PRO 4000 Blackwell SFF: 27B + DFlash2 70 W 35.04, 90 W 47.05, 106 W 52.05, 120 W 54.18;
  35B A3B 84.97, 93.63, 96.21, 96.43. Memory offset at 120 W: +33.3% memory clock gave +19.8% decode
  on 35B and +5.0% on 27B (+20% gave +6.5% on 27B: a concave curve); prefill barely changed.
  NVML memory offsets 1800/3600/6000 were about +10/+20/+33.3%, so 100% is taken as 18,000 MHz.
- field notes [001, 003], RTX 3090: +7% decode from 200 to 250 W, then about +1% per 50 W. The
  absolute rate (33 tok/s at 200 W) and the points below 200 W are illustrative, not published.
Between anchors the curve is linear; prefill, SM clocks and draws are plausible shapes, not data.
Noise is seeded; an optional drift changes every rate by a share per measurement.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from rigkit.config.schema import RigSpec
from rigkit.gpu.nvsmi import GpuReport, GpuStatus
from rigkit.tune.cells import Cell, Enforced, Figures, GpuTelemetry
from rigkit.tune.safety import OffsetRange


@dataclass(frozen=True)
class Profile:
    name: str
    gpu_name: str
    power_min_w: float
    power_max_w: float
    power_default_w: float
    decode_tok_s: tuple[tuple[int, float], ...]  # (cap W, decode tok/s) at zero offsets
    prefill_tok_s_at_first: float
    prefill_power_exponent: float  # prefill is compute-bound: it keeps gaining with power
    mem_gain: tuple[float, float]  # decode gain = a*x - b*x^2, x = memory offset / MEM_BASE_MHZ
    core_gain_per_100_mhz: float  # decode; prefill gains 3% per 100 MHz
    natural_draw_w: float  # the draw under this load with no cap in the way
    boost_mhz: float  # SM clock under load with no cap in the way
    clocks_max_graphics_mhz: int = 3105


MEM_BASE_MHZ = 18_000
_A27, _B27 = 0.5873, 1.3117  # solves a*0.2 - b*0.04 = 0.065 and a*0.333 - b*0.111 = 0.050

QWEN27_DFLASH2 = Profile("Qwen3.8 27B + DFlash2", "NVIDIA RTX PRO 4000 Blackwell SFF", 50, 140, 70,
                         ((70, 35.04), (90, 47.05), (106, 52.05), (120, 54.18)), 981.08, 0.6,
                         (_A27, _B27), 0.008, 139, 2600)
QWEN35_A3B = Profile("Qwen3.6 35B A3B", "NVIDIA RTX PRO 4000 Blackwell SFF", 50, 140, 70,
                     ((70, 84.97), (90, 93.63), (106, 96.21), (120, 96.43)), 1441.07, 0.7,
                     (0.198 / 0.333, 0.0), 0.002, 139, 2600)
RTX3090 = Profile("a 27B on an RTX 3090 (illustrative rate)", "NVIDIA GeForce RTX 3090", 100, 400, 350,
                  ((100, 33.0 * 0.62), (150, 33.0 * 0.85), (200, 33.0), (250, 33.0 * 1.07),
                   (300, 33.0 * 1.07 * 1.01), (350, 33.0 * 1.07 * 1.02), (400, 33.0 * 1.07 * 1.03)),
                  900.0, 0.6, (0.25, 0.0), 0.004, 390, 1950, 2100)


def interpolate(points: tuple[tuple[int, float], ...], x: float) -> float:
    if x <= points[0][0]:  # below the first anchor: the first segment's slope continues
        (x0, y0), (x1, y1) = points[0], points[1]
        return max(y0 + (y1 - y0) * (x - x0) / (x1 - x0), 0.1 * y0)
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1]  # above the last anchor: flat


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
        p = self.profile
        power_w = min(self._enforced_w(cell), self.held_at_w or 1e9)
        capped = power_w < p.natural_draw_w
        draw_w = min(power_w, p.natural_draw_w) * (0.98 if capped else 1.0)
        free_mhz = p.boost_mhz * min(1.0, (power_w / p.natural_draw_w) ** 0.5)
        sm_mhz = free_mhz
        if cell.clock_lock_mhz is not None and not self.lock_ignored and cell.clock_lock_mhz < free_mhz:
            sm_mhz = cell.clock_lock_mhz - 10  # the nearest clock step below the lock
            draw_w *= (sm_mhz / free_mhz) ** 2  # below the cap now: locking flattens the draw
            capped = False
        elif self.lock_ignored and cell.clock_lock_mhz is not None:
            sm_mhz = max(free_mhz, cell.clock_lock_mhz + 440)  # "once a card read 2640 MHz despite a lock"
        x = cell.mem_offset_mhz / MEM_BASE_MHZ
        mem = 1 + p.mem_gain[0] * x - p.mem_gain[1] * x * x
        core = cell.core_offset_mhz / 100
        clock = sm_mhz / free_mhz
        decode = interpolate(p.decode_tok_s, power_w) * mem * (1 + p.core_gain_per_100_mhz * core) * clock ** 0.1
        prefill = (p.prefill_tok_s_at_first * (power_w / p.decode_tok_s[0][0]) ** p.prefill_power_exponent
                   * (1 + 0.01 * x) * (1 + 0.03 * core) * clock ** 0.9)
        return decode, prefill, draw_w, sm_mhz, 1.0 if capped else 0.0

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
