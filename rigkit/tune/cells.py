"""The values a sweep moves and the figures it reads back: plain frozen dataclasses.

A `Cell` is one combination of settings, applied alike to every GPU the sweep concerns
(a tensor-parallel model runs on all of its cards at once).
"""

from __future__ import annotations

from dataclasses import dataclass

OBJECTIVES = ("decode", "response-time", "efficiency")


@dataclass(frozen=True, order=True)
class Cell:
    power_limit_w: int
    clock_lock_mhz: int | None = None  # lock ceiling (floor 0); None = unlocked
    mem_offset_mhz: int = 0  # NVML's value for the memory domain, not a slider's percent
    core_offset_mhz: int = 0

    def label(self) -> str:
        lock = f"lock {self.clock_lock_mhz} MHz" if self.clock_lock_mhz is not None else "unlocked"
        return f"{self.power_limit_w} W, {lock}, mem {self.mem_offset_mhz:+d}, core {self.core_offset_mhz:+d} MHz"

    def aggressiveness(self) -> tuple:
        """Sort key, least aggressive first: ties go to the lower power, the lower lock, the smaller offsets."""
        lock = self.clock_lock_mhz if self.clock_lock_mhz is not None else 1_000_000
        return (self.power_limit_w, lock, self.mem_offset_mhz, self.core_offset_mhz)


@dataclass(frozen=True)
class Workload:
    """The request mix `response-time` is estimated for (tokens per request)."""

    input_tokens: int
    output_tokens: int

    def response_time_s(self, prefill_tok_s: float, decode_tok_s: float) -> float:
        # The seed's estimate: it excludes queueing, network and cache effects; a candidate, not a measurement.
        return self.input_tokens / prefill_tok_s + self.output_tokens / decode_tok_s


@dataclass(frozen=True)
class GpuTelemetry:
    """What one GPU did during a measurement (from the NVML sampler, or a simulation)."""

    index: int
    mean_power_under_load_w: float | None
    max_sm_mhz: float | None
    power_capped_share: float | None = None  # share of samples with the SW power cap reason (0x4) set


@dataclass(frozen=True)
class Figures:
    """One measurement of one cell: token rates from the API's usage, power from telemetry."""

    decode_tok_s: float
    prefill_tok_s: float
    gpus: tuple[GpuTelemetry, ...] = ()

    @property
    def mean_power_w(self) -> float | None:
        watts = [g.mean_power_under_load_w for g in self.gpus]
        return sum(watts) if watts and None not in watts else None


@dataclass(frozen=True)
class Enforced:
    """What the driver reports for one GPU after a cell was applied."""

    index: int
    power_limit_w: float | None  # nvmlDeviceGetEnforcedPowerLimit
    mem_offset_mhz: int | None = None  # nvmlDeviceGetClockOffsets, where the driver has it
    core_offset_mhz: int | None = None
