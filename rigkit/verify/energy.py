"""Energy per phase of one request: prefill (send -> first token) and decode (first -> last token).

Pure functions on the sampler's telemetry. Sample times are wall clock (time.time()
on the rig); the phases are wall-clock instants the benchmark recorded on the control
machine, so the two clocks must agree (NTP): a phase outside the sampled window gives
no figure rather than a wrong one. Power is integrated (trapezoids) from the instant
power samples, with the value at each phase edge interpolated between its neighbours.
"""

from __future__ import annotations

from dataclasses import dataclass

from rigkit.verify.checks import power_series
from rigkit.verify.integrate import energy_j


@dataclass(frozen=True)
class PhaseEnergy:
    phase: str
    duration_s: float | None
    energy_j: float | None  # summed over the model's GPUs
    mean_power_w: float | None  # energy / duration: measured draw, not the cap
    samples: int  # the fewest power samples any GPU had inside the phase
    note: str = ""


def phase(telemetry: dict, name: str, t0: float | None, t1: float | None) -> PhaseEnergy:
    if t0 is None or t1 is None or t1 <= t0:
        return PhaseEnergy(name, None, None, None, 0, "the benchmark recorded no wall-clock times for it")
    if t0 < telemetry["t_start"] or t1 > telemetry["t_end"]:
        return PhaseEnergy(name, t1 - t0, None, None, 0,
                           "outside the sampled window: are the rig's and this machine's clocks in sync?")
    total, fewest = 0.0, None
    for gpu in telemetry["gpus"]:
        energy, samples = energy_j(gpu["samples"]["t"], power_series(gpu["samples"]), t0, t1)
        if energy is None:
            return PhaseEnergy(name, t1 - t0, None, None, 0, f"GPU {gpu['index']} has no power samples")
        total += energy
        fewest = samples if fewest is None else min(fewest, samples)
    return PhaseEnergy(name, t1 - t0, total, total / (t1 - t0), fewest or 0)
