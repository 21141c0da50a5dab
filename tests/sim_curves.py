"""TEST INFRASTRUCTURE: the tuning curves of the simulated GPUs, anchored to published numbers.
Standard library only: the vLLM stand-in (in its container) and the simulated NVML (in the rig)
import this same file, and tests/tune_sim.py builds its pure simulated rig on it.

Anchors (decode tok/s at zero offsets, by power cap):
- seed 004, RTX PRO 4000 Blackwell SFF: 27B + DFlash2 70 W 35.04, 90 W 47.05, 106 W 52.05, 120 W 54.18;
  35B A3B 84.97, 93.63, 96.21, 96.43. Memory offset at 120 W: +33.3% memory clock gave +19.8% decode
  on 35B and +5.0% on 27B (+20% gave +6.5% on 27B: a concave curve); prefill barely changed.
  NVML memory offsets 1800/3600/6000 were about +10/+20/+33.3%, so 100% is taken as 18,000 MHz.
- field notes [001, 003], RTX 3090: +7% decode from 200 to 250 W, then about +1% per 50 W. The
  absolute rate (33 tok/s at 200 W) and the points below 200 W are illustrative, not published.
Between anchors the curve is linear; prefill, SM clocks and draws are plausible shapes, not data.
"""

from __future__ import annotations

from dataclasses import dataclass


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
PROFILES = {"qwen27_dflash2": QWEN27_DFLASH2, "qwen35_a3b": QWEN35_A3B, "rtx3090": RTX3090}


def interpolate(points: tuple[tuple[int, float], ...], x: float) -> float:
    if x <= points[0][0]:  # below the first anchor: the first segment's slope continues
        (x0, y0), (x1, y1) = points[0], points[1]
        return max(y0 + (y1 - y0) * (x - x0) / (x1 - x0), 0.1 * y0)
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1]  # above the last anchor: flat


@dataclass(frozen=True)
class Truth:
    decode_tok_s: float
    prefill_tok_s: float
    draw_w: float  # under load
    sm_mhz: float  # peak under load
    power_capped: bool  # the SW power cap throttle reason is set


def truth(p: Profile, enforced_w: float, lock_mhz: int | None = None, mem_offset_mhz: int = 0,
          core_offset_mhz: int = 0, held_at_w: float | None = None, lock_ignored: bool = False) -> Truth:
    """What the card does under a steady decode load with these settings, without noise or drift.
    `held_at_w`: another firmware limit holds the card there whatever the enforced limit says."""
    power_w = min(enforced_w, held_at_w or 1e9)
    capped = power_w < p.natural_draw_w
    draw_w = min(power_w, p.natural_draw_w) * (0.98 if capped else 1.0)
    free_mhz = p.boost_mhz * min(1.0, (power_w / p.natural_draw_w) ** 0.5)
    sm_mhz = free_mhz
    if lock_mhz is not None and not lock_ignored and lock_mhz < free_mhz:
        sm_mhz = lock_mhz - 10  # the nearest clock step below the lock
        draw_w *= (sm_mhz / free_mhz) ** 2  # below the cap now: locking flattens the draw
        capped = False
    elif lock_ignored and lock_mhz is not None:
        sm_mhz = max(free_mhz, lock_mhz + 440)  # "once a card read 2640 MHz despite a lock"
    x = mem_offset_mhz / MEM_BASE_MHZ
    mem = 1 + p.mem_gain[0] * x - p.mem_gain[1] * x * x
    core = core_offset_mhz / 100
    clock = sm_mhz / free_mhz
    decode = interpolate(p.decode_tok_s, power_w) * mem * (1 + p.core_gain_per_100_mhz * core) * clock ** 0.1
    prefill = (p.prefill_tok_s_at_first * (power_w / p.decode_tok_s[0][0]) ** p.prefill_power_exponent
               * (1 + 0.01 * x) * (1 + 0.03 * core) * clock ** 0.9)
    return Truth(decode, prefill, draw_w, sm_mhz, capped)
