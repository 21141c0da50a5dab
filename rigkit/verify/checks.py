"""Verdicts with reasons: GPU settings observed under load, from a telemetry run. Pure functions.

A clock lock cannot be read back, so the only proof is the clock under load: the
highest SM clock seen must be at or below the lock's ceiling. A requested power
limit is not always the enforced one, so the enforced limit NVML reports is
compared with the policy, and the draw under load with the cap.
"""

from __future__ import annotations

from dataclasses import dataclass

from rigkit.verify.integrate import energy_j

LOAD_CLOCK_SHARE = 0.5  # samples at >= half the run's peak SM clock count as "under load"
POWER_TOLERANCE = 0.02  # sensor noise allowed above the cap


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    message: str


@dataclass(frozen=True)
class GpuLoad:
    index: int
    samples: int
    samples_per_s: float
    max_sm_mhz: float | None
    mean_power_under_load_w: float | None
    enforced_limit_w: float | None
    energy_counter_j: float | None  # from the driver's energy counter, start to end
    integrated_energy_j: float | None  # from the instant-power samples
    duration_s: float
    sampler_errors: tuple[str, ...] = ()  # what the sampler could not read (its samples then skipped)
    silent_s: float = 0.0  # the longest stretch without a sample, the run's edges included


def check_time_to_ready(start: dict, budget_s: float) -> Check:
    """A start (rigkit.rigside.startup's table) against the catalog's ready_budget_s, naming its slowest phase."""
    phases = [p for p in start.get("phases") or [] if isinstance(p, dict) and isinstance(p.get("s"), (int, float))]
    total = start.get("total_s")
    if not isinstance(total, (int, float)) or not phases:
        return Check("time_to_ready", False, "the start's table has no phases: its time cannot be judged")
    from rigkit.rigside.startup import slowest_phase

    slowest = slowest_phase(phases) or phases[0]
    ok = total <= budget_s
    return Check("time_to_ready", ok, f"{total:.1f} s from the container's start to {start.get('to')}, "
                 f"{'within' if ok else 'over'} the budget of {budget_s:g} s; slowest phase: {slowest['phase']} "
                 f"{slowest['s']:.1f} s")


def _numbers(values):
    return [v for v in values if v is not None]


def gpu_load(gpu: dict, t_start: float, t_end: float) -> GpuLoad:
    s = gpu["samples"]
    duration = max(t_end - t_start, 1e-9)
    clocks = _numbers(s["sm_mhz"])
    peak = max(clocks) if clocks else None
    loaded = [
        p for c, p in zip(s["sm_mhz"], power_series(s))
        if c is not None and p is not None and peak and c >= LOAD_CLOCK_SHARE * peak
    ]
    limits = _numbers(s["enforced_limit_w"])
    counter = None
    if gpu.get("energy_start_mj") is not None and gpu.get("energy_end_mj") is not None:
        counter = (gpu["energy_end_mj"] - gpu["energy_start_mj"]) / 1000.0
    return GpuLoad(
        index=gpu["index"],
        samples=len(s["t"]),
        samples_per_s=len(s["t"]) / duration,
        max_sm_mhz=peak,
        mean_power_under_load_w=sum(loaded) / len(loaded) if loaded else None,
        enforced_limit_w=limits[-1] if limits else None,
        energy_counter_j=counter,
        integrated_energy_j=integrate_power(s["t"], power_series(s), t_start, t_end),
        duration_s=duration,
        sampler_errors=tuple(gpu.get("errors") or ()),
        silent_s=_longest_gap(s["t"], t_start, t_end),
    )


def _longest_gap(times: list, t_start: float, t_end: float) -> float:
    edges = [t_start, *times, t_end]
    return max(b - a for a, b in zip(edges, edges[1:]))


def power_series(samples: dict) -> list:
    """Instant power where the GPU reports it; the driver's 1 s average otherwise (lags at edges)."""
    if any(v is not None for v in samples["power_instant_w"]):
        return samples["power_instant_w"]
    return samples["power_average_w"]


def integrate_power(times, watts, t_start, t_end) -> float | None:
    """Energy in J from power samples over the run, held flat to the run's edges."""
    return energy_j(times, watts, t_start, t_end)[0]


def check_enforced_limit(load: GpuLoad, wanted_w: float | None) -> Check:
    name = f"gpu{load.index}_enforced_power_limit"
    if wanted_w is None or load.enforced_limit_w is None:
        return Check(name, True, "no power policy for this GPU, or NVML does not report the enforced limit")
    if abs(load.enforced_limit_w - wanted_w) < 0.5:
        return Check(name, True, f"enforced limit {load.enforced_limit_w:.0f} W equals the policy")
    return Check(name, False,
                 f"enforced limit {load.enforced_limit_w:.0f} W, policy {wanted_w:.0f} W: the requested limit is not "
                 "in force (another firmware limit, or the policy was not applied since the last reboot)")


def check_clock_ceiling(load: GpuLoad, ceiling_mhz: int | None) -> Check:
    name = f"gpu{load.index}_clock_lock"
    if ceiling_mhz is None:
        return Check(name, True, "no clock lock configured")
    if load.max_sm_mhz is None:
        return Check(name, False, "no SM clock samples: the lock cannot be verified")
    if load.max_sm_mhz <= ceiling_mhz:
        return Check(name, True, f"max SM clock under load {load.max_sm_mhz:.0f} MHz <= ceiling {ceiling_mhz} MHz")
    return Check(name, False,
                 f"lock not in effect: max SM clock under load {load.max_sm_mhz:.0f} MHz is above the lock ceiling "
                 f"{ceiling_mhz} MHz, whatever was logged at boot")


def check_power_under_load(load: GpuLoad, cap_w: float | None) -> Check:
    name = f"gpu{load.index}_power_under_load"
    if cap_w is None:
        return Check(name, True, "no power cap configured")
    if load.mean_power_under_load_w is None:
        return Check(name, False, "no power samples under load")
    if load.mean_power_under_load_w <= cap_w * (1 + POWER_TOLERANCE):
        return Check(name, True, f"mean power under load {load.mean_power_under_load_w:.0f} W <= cap {cap_w:.0f} W")
    return Check(name, False,
                 f"mean power under load {load.mean_power_under_load_w:.0f} W is above the cap {cap_w:.0f} W")


def check_sample_rate(load: GpuLoad, minimum_hz: float = 20.0) -> Check:
    name = f"gpu{load.index}_telemetry_rate"
    ok = load.samples_per_s >= minimum_hz
    said = f"{load.samples_per_s:.0f} samples/s ({'>=' if ok else 'below'} {minimum_hz:.0f})"
    if not ok:  # why, where the samples show it: a sampler starved or stalled, or NVML answering with errors
        said += f"; longest stretch without a sample {load.silent_s:.1f} s of {load.duration_s:.1f} s"
        if load.sampler_errors:
            said += f"; the sampler could not read: {'; '.join(load.sampler_errors)}"
    return Check(name, ok, said)
